"""Launch -> Monitor with a real run: the form starts torchrun on CPU, the Monitor opens on the new
run and shows its ranks logging; stopping it from the Monitor leaves no process behind."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pilotwait import until
from procs import XL, kill_run, rdzv_port, run_json, wait_no_processes, xl_env
from textual.widgets import Input, Static

from xl.launcher import control
from xl.launcher import plan as plan_module
from xl.launcher.plan import Plan
from xl.tui.app import build_app
from xl.tui.screens.monitor import MonitorScreen
from xl.tui.widgets.rank_table import RankTable
from xl.tui.widgets.text_lines import TextLines

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

GRACE = 1.0  # XL_STOP_GRACE: SIGTERM to SIGKILL

SCRIPT = """\
import time

import xl

print("ready", flush=True)
for step in range(1, 1200):  # ~2 minutes unless stopped
    xl.log(step=step, loss=1.0 / step, samples=8)
    time.sleep(0.1)
"""


def text_of(app, selector: str) -> str:
    widget = app.screen.query_one(selector)
    return widget.text.plain if isinstance(widget, TextLines) else str(widget.render())


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """XL_HOME and the config in tmp_path, a short stop grace, tiny.py in the working folder."""
    home = tmp_path / "xlhome"
    monkeypatch.setenv("XL_HOME", str(home))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XL_STOP_GRACE", str(GRACE))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("XL_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.py").write_text(SCRIPT)
    return home


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[Plan]:
    """Every plan made in this process (the Launch screen's, through the backend, and any
    start_run would make), in order."""
    made: list[Plan] = []
    build = plan_module.build_plan

    def counted(*args: Any, **kwargs: Any) -> Plan:
        made.append(build(*args, **kwargs))
        return made[-1]

    def by_start_run(*args: Any, **kwargs: Any) -> Plan:
        made.append(build(*args, **kwargs))
        STARTED_PLANS.append(made[-1])
        return made[-1]

    STARTED_PLANS.clear()
    monkeypatch.setattr(plan_module, "build_plan", counted)
    monkeypatch.setattr(control, "build_plan", by_start_run)
    return made


# The plans start_run made itself (the form's plan not handed over): none, when one plan is kept.
STARTED_PLANS: list[Plan] = []


async def test_launch_opens_the_monitor_on_the_new_run_and_stop_leaves_nothing(
    simnvml, home, plans
):
    # no GPU: CPU ranks, whatever this machine has
    sim = simnvml(gpus=0, init_error="driver_not_loaded")
    run_dir: Path | None = None
    try:
        with sim.in_process():
            app = build_app(poll_interval=0.25)
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot.press("3")
                await until(pilot, lambda: app.screen.id == "launch", "launch screen")
                app.screen.query_one("#target", Input).value = "tiny.py"
                app.screen.query_one("#nproc", Input).value = "2"
                app.screen.query_one("#name", Input).value = "tiny-cpu"
                await until(
                    pilot, lambda: "ready" in text_of(app, "#launch-validation"), "a valid form"
                )
                assert "2 process(es) per node on CPU" in text_of(app, "#launch-validation")
                before = len(plans)
                await pilot.press("ctrl+r")

                await until(
                    pilot,
                    lambda: isinstance(app.screen, MonitorScreen),
                    "the Monitor opens",
                    timeout=60,
                )
                monitor = app.screen
                run_dir = monitor.run_dir
                assert run_dir.parent == home / "runs"
                assert run_json(run_dir)["name"] == "tiny-cpu"
                assert run_json(run_dir)["spec"]["nproc"] == 2
                # One plan for the launch: the one its form showed on the key press is the one
                # started (run.json's command is that plan's, up to the port torchrun's store got);
                # start_run made none of its own. (The form itself may validate again meanwhile:
                # on a busy machine its refresh ran twice more before the Monitor opened.)
                assert STARTED_PLANS == [], STARTED_PLANS
                assert len(plans) >= before + 1, plans[before:]
                assert run_json(run_dir)["nproc_per_node"] == plans[-1].nproc == 2
                assert run_json(run_dir)["argv"][:6] == plans[-1].argv[:6]
                table = monitor.query_one(RankTable)
                await until(pilot, lambda: table.row_count == 2, "both ranks listed", timeout=60)
                await until(
                    pilot,
                    lambda: all(str(table.cell(r, "step")) not in ("-", "") for r in (0, 1)),
                    "both ranks logging steps",
                    timeout=60,
                )
                header = text_of(app, "#run-header")
                assert "tiny-cpu" in header and "running" in header and "world size 2" in header
                assert {str(table.cell(r, "state")) for r in (0, 1)} == {"running"}

                # Stop it from the Monitor, answering the question.
                await pilot.press("s")
                await until(pilot, lambda: app.screen.id == "confirm", "the confirmation")
                await pilot.press("y")
                await until(
                    pilot,
                    lambda: run_json(run_dir).get("status") == "stopped",
                    "the run stopped",
                    timeout=30,
                )
                await until(
                    pilot,
                    lambda: "stopped" in text_of(app, "#run-header"),
                    "the header says stopped",
                )
                await pilot.press("q")
                await until(pilot, lambda: not app.is_running, "the app ended", timeout=10)
        wait_no_processes(run_dir, timeout=GRACE + 10)
    finally:
        if run_dir is not None:
            kill_run(run_dir)


async def test_node_0_from_the_form_shows_the_join_command_until_node_1_joins(
    simnvml, home, tmp_path
):
    """Nodes 2, node rank 0 in the form: the Monitor shows the exact command for node 1 (with the
    run's token, which stays out of run.json and out of the app's environment); node 1 started
    with it joins, the notice goes, and stopping node 0 from the Monitor ends both nodes."""
    home1 = tmp_path / "node1"
    port = rdzv_port()
    sim = simnvml(gpus=0, init_error="driver_not_loaded")  # CPU ranks
    run_dir: Path | None = None
    node1: subprocess.Popen[str] | None = None
    try:
        with sim.in_process():
            app = build_app(poll_interval=0.25)
            async with app.run_test(size=(160, 40)) as pilot:
                await pilot.press("3")
                await until(pilot, lambda: app.screen.id == "launch", "launch screen")
                for field, value in (
                    ("target", "tiny.py"), ("nproc", "1"), ("nnodes", "2"), ("node_rank", "0"),
                    ("rdzv", f"127.0.0.1:{port}"),
                ):
                    app.screen.query_one(f"#{field}", Input).value = value
                await until(
                    pilot, lambda: "ready" in text_of(app, "#launch-validation"), "a valid form"
                )
                await pilot.press("ctrl+r")
                await until(
                    pilot,
                    lambda: isinstance(app.screen, MonitorScreen),
                    "the Monitor opens",
                    timeout=60,
                )
                run_dir = app.screen.run_dir
                banner = app.screen.query_one("#notice-banner", Static)
                notice = str(banner.render())
                assert banner.display and "--node-rank 1" in notice, notice
                token = re.search(r"XL_TOKEN=(\S+)", notice).group(1)
                assert "XL_TOKEN" not in os.environ
                assert token not in (run_dir / "run.json").read_text()

                # Node 1, as a person would start it from the notice.
                args = shlex.split(
                    notice[notice.index("xl launch") + len("xl launch") :].splitlines()[0]
                )
                node1 = subprocess.Popen(
                    [*XL, "launch", "--no-tui", *args],
                    env=xl_env(home1, XL_TOKEN=token),
                    cwd=tmp_path,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                await until(
                    pilot,
                    lambda: not banner.display,
                    "the notice goes once node 1 joined",
                    timeout=90,
                )
                table = app.screen.query_one(RankTable)
                await until(
                    pilot, lambda: table.row_count == 2, "both nodes' ranks on node 0", timeout=60
                )

                await pilot.press("s")
                await until(pilot, lambda: app.screen.id == "confirm", "the confirmation")
                await pilot.press("y")
                await until(
                    pilot,
                    lambda: run_json(run_dir).get("status") == "stopped",
                    "node 0 stopped",
                    timeout=30,
                )
                await pilot.press("q")
                await until(pilot, lambda: not app.is_running, "the app ended", timeout=10)
        out, _ = node1.communicate(timeout=60)
        assert node1.returncode != 0, out  # node 1's run ended with node 0's
        wait_no_processes(run_dir, timeout=GRACE + 10)
        for d in (home1 / "runs").iterdir():
            wait_no_processes(d, timeout=GRACE + 10)
    finally:
        if node1 is not None and node1.poll() is None:
            node1.kill()
            node1.communicate(timeout=10)
        for d in [run_dir, *((home1 / "runs").iterdir() if (home1 / "runs").is_dir() else [])]:
            if d is not None:
                kill_run(d)
