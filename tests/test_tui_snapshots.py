"""Snapshots of every screen with fixture data and simulated GPUs (pytest-textual-snapshot).

Deterministic by construction: a fixed clock, one poll (a long poll interval), recorded runs.
Update after an intended change with `pytest tests/test_tui_snapshots.py --snapshot-update`.
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

from xl.tui.app import build_app
from xl.tui.widgets.rank_log import RankLog
from xl.tui.widgets.rank_table import RankTable

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
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
    shutil.copytree(FIXTURES, runs)
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


@pytest.mark.parametrize(
    ("run", "ranks", "size"),
    [
        ("20260530-healthy", 2, (120, 40)),
        ("20260530-straggler", 2, (120, 40)),
        ("20260530-failed", 2, (80, 24)),
        ("20260530-wide", 64, (200, 50)),
    ],
)
def test_monitor(snap_compare, _env, run, ranks, size):
    async def ready(pilot):
        await _monitor_ready(pilot, ranks)

    assert snap_compare(_monitor(run, _env), terminal_size=size, run_before=ready)


def test_gpus(snap_compare, simnvml):
    sim = simnvml(
        gpus=[
            SimGPU(util_gpu=87, memory_used_mib=61_000, temperature_c=71, power_w=350.0, processes=[SimProcess(4242, 61_000)]),
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
        assert snap_compare(build_app(poll_interval=SLOW), terminal_size=(120, 36), run_before=ready)


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
        assert snap_compare(build_app(poll_interval=SLOW), terminal_size=(120, 36), run_before=ready)


def test_runs(snap_compare, simnvml):
    sim = simnvml(gpus=1)

    async def ready(pilot):
        app = pilot.app
        await pilot.press("4")
        await until(pilot, lambda: app.screen.id == "runs" and app.screen.query_one("#runs-table").row_count == 4)

    with sim.in_process():
        assert snap_compare(build_app(clock=lambda: NOW, poll_interval=SLOW), terminal_size=(120, 24), run_before=ready)


def test_help(snap_compare, _env):
    async def ready(pilot):
        await _monitor_ready(pilot, 2)
        await pilot.press("question_mark")
        await pilot.pause(0.2)

    assert snap_compare(_monitor("20260530-healthy", _env), terminal_size=(100, 36), run_before=ready)
