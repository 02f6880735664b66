"""GPUs and Launch screens: pick and order devices -> CUDA_VISIBLE_DEVICES -> the launch plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pilotwait import until
from simnvml import SimGPU, SimProcess
from textual.widgets import Input, Static

from xl.doctor.report import Report
from xl.gpu.nvml import inventory
from xl.launcher.plan import build_plan
from xl.tui import settings
from xl.tui.app import build_app
from xl.tui.backend import LocalBackend
from xl.tui.launchform import LaunchForm, command, to_spec

SIZE = (120, 40)


def text_of(app, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())


@pytest.fixture
def four_gpus(simnvml):
    # GPU 0 busy with a foreign process, GPU 2 a different model with MIG on.
    sim = simnvml(
        gpus=[
            SimGPU(util_gpu=55, memory_used_mib=30_000, processes=[SimProcess(4242, 30_000)]),
            SimGPU(),
            SimGPU(model="H100", mig=1),
            SimGPU(),
        ]
    )
    with sim.in_process():
        yield sim


@pytest.fixture(autouse=True)
def _config_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))


async def test_pick_and_reorder_gpus_sets_visible_devices_and_plan(
    four_gpus, tmp_path, monkeypatch
):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    app = build_app(poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.screen.query_one("#gpu-table").row_count == 4, "4 GPU rows")
        # Pick GPU 0 then GPU 2 (keyboard), then move GPU 2 first.
        await pilot.press("space", "down", "down", "space", "shift+up")
        assert app.selection.order == [2, 0]
        preview = text_of(app, "#cvd")
        assert "CUDA_VISIBLE_DEVICES=2,0" in preview
        assert "LOCAL_RANK 0 → GPU 2" in preview
        warnings = text_of(app, "#pick-warnings")
        assert "mixed models" in warnings
        assert "GPU 2 has MIG enabled" in warnings
        assert "GPU 0 is busy" in warnings
        assert "GPU 1" not in warnings

        # The mouse: a click on a row moves the cursor there, a second click toggles it.
        await pilot.click("#gpu-table", offset=(10, 1))  # GPU 0's row (row 0 is the header)
        assert app.screen.query_one("#gpu-table").cursor_row == 0
        await pilot.pause()
        await pilot.click("#gpu-table", offset=(10, 1))
        await pilot.pause()
        assert app.selection.order == [2]
        await pilot.click("#btn-toggle")  # buttons act on the row under the cursor
        assert app.selection.order == [2, 0]
        await pilot.pause(0.3)  # a button ignores clicks while it shows being pressed
        await pilot.click("#btn-up")
        assert app.selection.order == [0, 2]
        await pilot.press("shift+down")
        assert app.selection.order == [2, 0]

        # The selection feeds Launch, whose plan carries exactly that order.
        await pilot.press("L")
        await until(pilot, lambda: app.screen.id == "launch", "launch screen")
        assert app.screen.query_one("#gpus", Input).value == "2,0"
        app.screen.query_one("#target", Input).value = "train.py"
        await until(
            pilot,
            lambda: "ready" in text_of(app, "#launch-validation"),
            "valid form: " + text_of(app, "#launch-validation"),
        )
        assert "CUDA_VISIBLE_DEVICES=2,0" in text_of(app, "#launch-validation")
        assert "2 process(es)" in text_of(app, "#launch-validation")
        form = app.screen.form()
        plan = app.backend.plan(to_spec(form))  # planned against the GPUs the screen showed
        assert plan.env["CUDA_VISIBLE_DEVICES"] == "2,0"
        assert plan.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert [g.index for g in plan.devices] == [2, 0]
        assert text_of(app, "#launch-command") == "xl launch --gpus 2,0 -- train.py"


async def test_launch_form_validates_inline_and_remembers_settings(
    four_gpus, tmp_path, monkeypatch
):
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    settings.remember(
        "train.py", LaunchForm(target="train.py", args="--lr 3e-4", nproc="2", gpus="1,3").to_dict()
    )
    app = build_app(poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: app.screen.id == "launch", "launch screen")
        screen = app.screen
        # The last script's settings come back, but for its GPUs: the pick (none) stays.
        assert screen.query_one("#target", Input).value == "train.py"
        assert screen.query_one("#args", Input).value == "--lr 3e-4"
        assert screen.query_one("#gpus", Input).value == ""
        screen.query_one("#gpus", Input).value = "1,3"

        async def verdict(field: str, value: str) -> str:
            screen.query_one(f"#{field}", Input).value = value
            await pilot.pause()
            return text_of(app, "#launch-validation")

        assert "whole number" in await verdict("nproc", "two")
        assert "more than the 2 GPU(s) chosen" in await verdict("nproc", "3")
        assert "ready" in await verdict("nproc", "2")
        assert "KEY=VALUE" in await verdict("env", "NCCL_DEBUG")
        assert "ready" in await verdict("env", "NCCL_DEBUG=INFO")
        assert (
            "no such" in (await verdict("target", "missing.py")).lower()
            or "not found" in text_of(app, "#launch-validation").lower()
        )
        assert "ready" in await verdict("target", "train.py")
        assert "--rdzv" in await verdict("nnodes", "2")
        assert "ready" in await verdict("rdzv", "10.0.0.1:29500")
        assert screen.valid
        shown = text_of(app, "#launch-command")
        assert shown == (
            "xl launch --gpus 1,3 --nproc 2 --nnodes 2 --rdzv 10.0.0.1:29500 "
            "--env NCCL_DEBUG=INFO -- train.py --lr 3e-4"
        )


def test_command_and_spec_agree_for_modules() -> None:
    form = LaunchForm(
        target="-m pkg.train", args="--x 'a b'", gpus="0", mixed_precision="bf16", env="A=1 B='x y'"
    )
    spec = to_spec(form)
    assert (spec.script, spec.module, spec.args) == (None, "pkg.train", ["--x", "a b"])
    assert spec.env == {"A": "1", "B": "x y"}
    assert command(form) == [
        "xl",
        "launch",
        "--gpus",
        "0",
        "--mixed-precision",
        "bf16",
        "--env",
        "A=1",
        "--env",
        "B=x y",
        "-m",
        "pkg.train",
        "--x",
        "a b",
    ]


async def test_gpus_table_names_the_rank_of_a_process(simnvml):
    """A GPU's process that is a rank (RANK/LOCAL_RANK/XL_RUN_ID in its /proc/PID/environ) shows
    its rank and run; another process shows its PID."""
    sleeper = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"]
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "XL_RUN_ID")}
    ranked = {
        **base,
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "XL_RUN_ID": "20260530-ranks",
    }
    rank = subprocess.Popen(sleeper, env=ranked, stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen(sleeper, env=base, stdout=subprocess.PIPE, text=True)
    try:
        for proc in (rank, other):  # exec'd: /proc/PID/environ is now theirs, not a copy of ours
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        sim = simnvml(
            gpus=[
                SimGPU(),
                SimGPU(
                    util_gpu=80,
                    memory_used_mib=30_000,
                    processes=[SimProcess(rank.pid, 20_000), SimProcess(other.pid, 500)],
                ),
            ]
        )
        with sim.in_process():
            app = build_app(poll_interval=0.2)
            async with app.run_test(size=SIZE) as pilot:
                table = app.screen.query_one("#gpu-table")
                await until(pilot, lambda: table.row_count == 2, "2 GPU rows")
                procs = str(table.get_cell("1", "procs"))
                # The run and the rank, as the README says; another process by its pid.
                assert procs == f"r3 20260530-ranks pid {other.pid}", procs
                assert str(table.get_cell("0", "procs")) == "-"
                assert str(table.ordered_columns[-1].label) == "Processes"
    finally:
        for proc in (rank, other):
            proc.kill()
            proc.wait(timeout=10)


async def test_number_keys_move_between_every_screen_and_back_to_gpus(four_gpus):
    """1-4 reach every screen from every screen; `1` used to crash the app from the others
    (Textual cannot switch back to its built-in default mode)."""
    class NoChecks(LocalBackend):
        def doctor_report(self) -> Report:
            return Report(checks=[])  # the Doctor screen's content is not the point here

    app = build_app(NoChecks(), poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.screen.query_one("#gpu-table").row_count == 4, "4 GPU rows")
        gpus = app.screen
        for key, screen_id in [
            ("2", "doctor"), ("1", "gpus"), ("3", "launch"), ("1", "gpus"), ("4", "runs"),
            ("1", "gpus"), ("4", "runs"), ("3", "launch"), ("2", "doctor"), ("1", "gpus"),
        ]:
            if app.screen.id == "launch":
                await pilot.press("escape")  # Launch opens in its Script field: esc leaves it
            await pilot.press(key)
            await until(
                pilot,
                lambda screen_id=screen_id: app.screen.id == screen_id,
                f"{key} -> {screen_id}",
            )
        assert app.is_running
        assert app.screen is gpus  # the same GPUs screen, with its selection and history
        await until(
            pilot,
            lambda: app.screen.query_one("#gpu-table").row_count == 4,
            "the table still there",
        )


async def test_no_gpu_panel_says_what_still_works(simnvml):
    sim = simnvml(gpus=0, init_error="driver_not_loaded")
    with sim.in_process():
        app = build_app(poll_interval=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "No NVIDIA GPU" in text_of(app, "#no-gpu"), "no-GPU panel")
            panel = text_of(app, "#no-gpu")
            assert "CPU" in panel and "Doctor" in panel
            assert not app.screen.query_one("#gpu-main").display


def test_settings_file_is_written_atomically_and_survives_garbage(tmp_path) -> None:
    path = Path(tmp_path / "config" / "launch.json")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert settings.recall("x.py") is None  # a corrupt file is ignored, not fatal
    settings.remember("x.py", {"target": "x.py", "nproc": "4"})
    assert settings.recall("x.py") == {"target": "x.py", "nproc": "4"}
    assert settings.last_target() == "x.py"
    assert [p.name for p in path.parent.iterdir()] == ["launch.json"]


@pytest.mark.e2e
def test_shown_command_is_what_xl_launch_plans(simnvml, tmp_path) -> None:
    """The command the form shows, run through the real `xl launch --dry-run`, plans the same."""
    sim = simnvml(gpus=4)
    (tmp_path / "train.py").write_text("print('hi')\n")
    form = LaunchForm(
        target="train.py", args="--lr 3e-4 --name 'a b'", gpus="3,1", nproc="2",
        mixed_precision="bf16", env="NCCL_DEBUG=INFO", name="t1",
    )
    argv = command(form)
    assert argv[:2] == ["xl", "launch"]
    proc = subprocess.run(
        [sys.executable, "-m", "xl", *argv[1:2], "--dry-run", "--json", *argv[2:]],
        cwd=tmp_path, env={**os.environ, **sim.env}, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    spec = to_spec(form)
    spec.cwd = str(tmp_path)
    with sim.in_process():
        plan = build_plan(spec, inventory(), env={**os.environ, **sim.env})
    assert shown["argv"][1:] == plan.argv[1:]
    assert shown["env"] == plan.env
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "3,1"


async def test_no_color_starts_with_the_plain_terminal_theme(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = build_app(poll_interval=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(
            pilot,
            lambda: (
                app.screen.query_one("#no-gpu").display or app.screen.query_one("#gpu-main").display
            ),
            "first poll",
        )
        assert app.theme == "ansi-dark"
