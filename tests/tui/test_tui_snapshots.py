"""Snapshots of every screen with fixture data and simulated GPUs (pytest-textual-snapshot).

Deterministic by construction: a fixed clock, one poll (a long poll interval), recorded runs.
Update after an intended change with `pytest tests/tui/test_tui_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import runfixtures
from simnvml import SimGPU, SimProcess
from textual.css.query import NoMatches
from textual.widgets import Input
from textual.widgets._footer import FooterKey
from where import FIXTURES, REPO

from xl.doctor.report import Check, Report
from xl.launcher.stacks.model import StacksDoc
from xl.tui.app import build_app
from xl.tui.backend import LocalBackend
from xl.tui.run_outcome import FINISHED
from xl.tui.widgets.rank_log import RankLog
from xl.tui.widgets.rank_table import RankTable

RUNS_FIXTURES = FIXTURES / "runs"
NOW = runfixtures.T0 + 130
SLOW = 3600.0  # poll once: what is on screen cannot depend on timing


async def until(pilot, predicate, tries: int = 200) -> None:
    for _ in range(tries):
        try:
            if predicate():
                break
        except NoMatches:  # not composed yet
            pass
        await pilot.pause(0.05)
    await pilot.pause()


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    runs = tmp_path / "xlhome" / "runs"
    shutil.copytree(RUNS_FIXTURES, runs)
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    yield runs
    monkeypatch.undo()
    time.tzset()


def _monitor(run: str, runs: Path):
    return build_app(monitor_run_dir=runs / run, clock=lambda: NOW, poll_interval=SLOW)


async def _monitor_ready(pilot, ranks: int) -> None:
    app = pilot.app
    await until(pilot, lambda: app.screen.query_one(RankTable).row_count == ranks)
    await until(pilot, lambda: app.screen.query_one(RankLog).line_count > 0)

    def footer_follows_status() -> bool:  # "Stop run" greyed out once the run is over
        keys = [k for k in app.screen.query(FooterKey) if k.action == "stop"]
        return bool(keys) and keys[0].has_class("-disabled") == (app.screen.status in FINISHED)

    await until(pilot, footer_follows_status)


@pytest.mark.parametrize(
    ("run", "ranks", "size"),
    [
        ("20260530-healthy", 2, (120, 40)),
        ("20260530-straggler", 2, (120, 40)),
        ("20260530-failed", 2, (80, 24)),
        ("20260530-wide", 64, (200, 50)),
        ("20260530-twonode", 8, (120, 32)),
        ("20260530-healthy", 2, (80, 24)),
    ],
)
def test_monitor(snap_compare, _env, run, ranks, size):
    async def ready(pilot):
        await _monitor_ready(pilot, ranks)
        table = pilot.app.screen.query_one(RankTable)
        if ranks + 1 < pilot.app.size.height * 0.45:
            # Its header and one row a rank, nothing under them: a scrollbar under a table wider
            # than 80 columns drew a stray "▏" there.
            assert table.size.height == ranks + 1

    assert snap_compare(_monitor(run, _env), terminal_size=size, run_before=ready)


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_monitor_step_split(snap_compare, _env, size):
    """Each rank's step time and its data/compute/comm bar, its footprint as its memory, the
    straggler's phase in its banner: small and large."""
    runfixtures.add_step_split(_env / "20260530-straggler")

    async def ready(pilot):
        await _monitor_ready(pilot, 2)
        table = pilot.app.screen.query_one(RankTable)
        await until(pilot, lambda: str(table.cell(1, "time")) != "-")

    assert snap_compare(_monitor("20260530-straggler", _env), terminal_size=size, run_before=ready)


def test_gpus(snap_compare, simnvml):
    sim = simnvml(
        gpus=[
            SimGPU(
                util_gpu=87,
                memory_used_mib=61_000,
                temperature_c=71,
                power_w=350.0,
                processes=[SimProcess(4242, 61_000)],
            ),
            SimGPU(util_gpu=3),
            SimGPU(model="H100", mig=1),
            SimGPU(model="L4", util_gpu=40, memory_used_mib=8_000),
        ]
    )

    async def ready(pilot):
        app = pilot.app
        await until(pilot, lambda: app.screen.query_one("#gpu-table").row_count == 4)
        await pilot.press("down", "space", "down", "space", "shift+up")

    with sim.in_process():
        assert snap_compare(
            build_app(poll_interval=SLOW), terminal_size=(120, 36), run_before=ready
        )


def test_gpus_none(snap_compare, simnvml):
    sim = simnvml(gpus=0, init_error="driver_not_loaded")

    async def ready(pilot):
        await until(pilot, lambda: pilot.app.screen.query_one("#no-gpu").display)

    with sim.in_process():
        assert snap_compare(build_app(poll_interval=SLOW), terminal_size=(80, 24), run_before=ready)


def test_launch(snap_compare, simnvml):
    sim = simnvml(gpus=2)

    async def ready(pilot):
        app = pilot.app
        await until(pilot, lambda: app.screen.query_one("#gpu-table").row_count == 2)
        await pilot.press("space", "down", "space", "3")
        await until(pilot, lambda: app.screen.id == "launch")
        for inp in app.screen.query(Input):
            inp.cursor_blink = False
        app.screen.query_one("#target", Input).value = "train.py"
        app.screen.query_one("#args", Input).value = "--epochs 1"
        await until(pilot, lambda: app.screen.valid)

    with sim.in_process():
        assert snap_compare(
            build_app(poll_interval=SLOW), terminal_size=(120, 36), run_before=ready
        )


def test_launch_80x24(snap_compare, simnvml):
    """The whole form fits a small terminal, fields without borders: no scrollbar (whose thumb
    showed as a stray "▄▄" beside Mixed precision)."""
    sim = simnvml(gpus=2)

    async def ready(pilot):
        app = pilot.app
        await until(pilot, lambda: app.screen.query_one("#gpu-table").row_count == 2)
        await pilot.press("space", "3")
        await until(pilot, lambda: app.screen.id == "launch")
        for inp in app.screen.query(Input):
            inp.cursor_blink = False
        app.screen.query_one("#target", Input).value = "train.py"
        app.screen.query_one("#args", Input).value = "--epochs 1"
        await until(pilot, lambda: app.screen.valid)
        form = app.screen.query_one("#launch-form")
        assert form.max_scroll_y == 0 and not form.show_vertical_scrollbar

    with sim.in_process():
        assert snap_compare(build_app(poll_interval=SLOW), terminal_size=(80, 24), run_before=ready)


def _stacks_doc(frames: int) -> dict:
    calls = [
        {"file": f"/home/me/project/model/block_{i}.py", "line": 10 + i, "function": f"forward_{i}"}
        for i in range(frames)
    ]
    return {
        "run_id": "20260530-straggler",
        "t": NOW,
        "ranks": [
            {
                "rank": r,
                "node": 0,
                "pid": 4100 + r,
                "threads": [{"name": "MainThread", "frames": calls}],
                "collectives": [{"pg": "default_pg", "seq": 57, "op": op, "state": "scheduled"}],
            }
            for r, op in ((0, "all_reduce"), (1, "broadcast"))
        ],
        "verdict": {
            "ranks": [0, 1],
            "mismatch": True,
            "message": "mismatch at #57 of process group default_pg (different "
            "collectives; they can never match): rank 0 is in all_reduce #57 at train.py:41; "
            "rank 1 is in broadcast #57 at train.py:44",
        },
    }


def test_stacks_80x24(snap_compare, _env):
    """The `k` popup at 80x24: its long text scrolls with no scrollbar drawn over it (a stray
    "▇▇"); the frame's edge says which lines show."""

    class FixedStacks(LocalBackend):
        def stacks(self, run_dir):
            return StacksDoc.from_json(_stacks_doc(30))

    app = build_app(
        FixedStacks(),
        monitor_run_dir=_env / "20260530-straggler",
        clock=lambda: NOW,
        poll_interval=SLOW,
    )

    async def ready(pilot):
        await _monitor_ready(pilot, 2)
        await pilot.press("k")
        await until(
            pilot, lambda: "forward_0" in str(pilot.app.screen.query_one("#stacks-text").render())
        )
        box = pilot.app.screen.query_one("#stacks-scroll")
        await until(pilot, lambda: box.border_subtitle.startswith("lines 1-"))
        assert not box.show_vertical_scrollbar or box.scrollbar_size_vertical == 0

    assert snap_compare(app, terminal_size=(80, 24), run_before=ready)


def test_runs(snap_compare, simnvml):
    sim = simnvml(gpus=1)

    async def ready(pilot):
        app = pilot.app
        await pilot.press("4")
        await until(
            pilot,
            lambda: app.screen.id == "runs" and app.screen.query_one("#runs-table").row_count == 5,
        )
        # Column widths follow the rows a moment later: snapshot the laid-out table.
        await until(
            pilot,
            lambda: (
                app.screen.query_one("#runs-table").ordered_columns[1].content_width
                >= len("20260530-straggler")
            ),
        )

    with sim.in_process():
        assert snap_compare(
            build_app(clock=lambda: NOW, poll_interval=SLOW),
            terminal_size=(120, 24),
            run_before=ready,
        )


def test_one_stylesheet():
    """The app's look lives in tui/xl.tcss (its CSS_PATH): no widget or screen carries styles of
    its own (DEFAULT_CSS / CSS), so one file says how everything looks. The snapshots above check
    the result (the GPU history's colours come from there)."""
    tui = REPO / "tui"
    assert sorted(p.name for p in tui.glob("*.tcss")) == ["xl.tcss"]
    offenders = [
        str(p.relative_to(tui))
        for p in tui.rglob("*.py")
        if any(
            line.lstrip().startswith(("DEFAULT_CSS", "CSS =", "CSS:"))
            for line in p.read_text().splitlines()
        )
    ]
    assert offenders == []


def doctor_report():
    """A fixed doctor Report: one check of each status, with fixes, as on a half-set-up box."""
    def check(id_, status, title, detail, fix="", area=""):
        return Check(id=id_, status=status, title=title, detail=detail, fix=fix, area=area)

    return Report(
        checks=[
            check("driver", "ok", "NVIDIA driver", "driver 550.54.15, supports CUDA up to 12.4"),
            check("gpus", "ok", "GPUs", "4 x NVIDIA A100-SXM4-80GB"),
            check(
                "cuda_home", "ok", "CUDA_HOME", "/usr/local/cuda-12.4 (same as the nvcc on PATH)"
            ),
            check("nvcc", "ok", "nvcc", "nvcc 12.4 at /usr/local/cuda-12.4/bin/nvcc"),
            check(
                "torch_cuda_match",
                "fail",
                "torch CUDA vs nvcc",
                "torch 2.5.1 was built for CUDA 11.8 but nvcc is 12.4: extensions will not build",
                fix="pip install torch --index-url https://download.pytorch.org/whl/cu124",
            ),
            check(
                "host_compiler",
                "warn",
                "Host compiler",
                "gcc 14.1 is newer than nvcc 12.4 supports (up to gcc 13)",
                fix="export CXX=g++-13 NVCC_PREPEND_FLAGS='-ccbin g++-13'",
            ),
            check(
                "nccl",
                "error",
                "NCCL",
                "the probe timed out after 2.0 s",
                fix="run `xl doctor` again",
            ),
            check("shm", "ok", "/dev/shm", "64.0 GiB free"),
            check("ninja", "skip", "ninja", "not needed: no JIT extension builds configured"),
        ],
    )


def test_doctor(snap_compare, simnvml):
    sim = simnvml(gpus=1)
    class FixedDoctor(LocalBackend):
        def doctor_report(self):
            return doctor_report()  # fixed data, not this machine's

    app = build_app(FixedDoctor(), poll_interval=SLOW)

    async def ready(pilot):
        await pilot.press("2")
        await until(
            pilot,
            lambda: (
                app.screen.id == "doctor" and app.screen.query_one("#doctor-table").row_count == 9
            ),
        )
        await pilot.press("down", "down")  # the chosen check (the warning) shows its detail and fix

    with sim.in_process():
        assert snap_compare(app, terminal_size=(120, 30), run_before=ready)


def test_help(snap_compare, _env):
    async def ready(pilot):
        await _monitor_ready(pilot, 2)
        await pilot.press("question_mark")
        await pilot.pause(0.2)

    assert snap_compare(
        _monitor("20260530-healthy", _env), terminal_size=(100, 36), run_before=ready
    )
