"""Leaving the app `xl launch` opened, and what stays on the terminal: Ctrl-C stops the run only in
its Monitor, `q` anywhere says how to come back, the Monitor closes by itself once its run ended
(as torchrun returns), and the outcome of an ended run, with a failure's root cause and the
`xl logs` command, is printed as the app closes. Pilot drives the real app on recorded runs; a
backend that records stop() stands in for the supervisor."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import runfixtures
from monitorpilot import LIVE, NOW, StopBackend, copy_runs, launched_app, monitor_shown
from pilotwait import until

from xl.tui.app import build_app, exit_code
from xl.tui.screens.monitor import MonitorScreen

SIZE = (120, 40)
FAILED = "20260530-failed"
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 79.15 GiB "
    "total capacity)"
)


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return copy_runs(tmp_path, monkeypatch)


def exit_message(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err


def set_status(run_dir: Path, status: str, failed_from: Path | None = None) -> None:
    """run.json ends as ``status``; ``failed_from``: with that run's failure (its root cause)."""
    run = json.loads((run_dir / "run.json").read_text())
    run["status"], run["ended_at"] = status, runfixtures.T0 + 120
    if failed_from is not None:
        run["failure"] = json.loads((failed_from / "run.json").read_text())["failure"]
    (run_dir / "run.json").write_text(json.dumps(run))


# -- Ctrl-C and q away from the Monitor -----------------------------------------------------------


async def test_ctrl_c_on_another_screen_of_xl_launch_leaves_the_run_going(runs, capsys):
    """`esc` from the Monitor `xl launch` opened, then Ctrl-C on another screen: the app quits as
    `q` does, the run is not stopped, and the terminal says how to come back."""
    backend = StopBackend(ends=False)
    app = launched_app(backend, runs / LIVE)
    async with app.run_test(size=SIZE) as pilot:
        await monitor_shown(pilot)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen.id == "gpus", "back on the GPUs screen")
        await pilot.press("4")
        await until(pilot, lambda: app.screen.id == "runs", "Runs")
        await pilot.press("ctrl+c")
        await until(pilot, lambda: not app.is_running, "the app quit")
    assert backend.stopped == [] and exit_code(app) == 0
    assert f"keeps running. Reopen it with: xl attach {LIVE}" in exit_message(capsys)


async def test_q_on_another_screen_of_xl_launch_says_detached(runs, capsys):
    app = launched_app(StopBackend(ends=False), runs / LIVE)
    async with app.run_test(size=SIZE) as pilot:
        await monitor_shown(pilot)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen.id == "gpus", "back on the GPUs screen")
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the app quit")
    assert exit_code(app) == 0
    assert f"xl attach {LIVE}" in exit_message(capsys)


async def test_ctrl_c_over_a_dialog_of_its_monitor_still_stops_the_run(runs):
    """Help open over the Monitor `xl launch` opened: that is still its Monitor."""
    backend = StopBackend(ends=False)
    app = launched_app(backend, runs / LIVE)
    async with app.run_test(size=SIZE) as pilot:
        await monitor_shown(pilot)
        await pilot.press("question_mark")
        await until(pilot, lambda: not isinstance(app.screen, MonitorScreen), "the help")
        await pilot.press("ctrl+c")
        await until(pilot, lambda: backend.stopped, "the stop asked for")
        # The fixture's run never ends: close the app, as a second Ctrl-C would, or its stop
        # thread waits the whole STOP_WAIT_S for that run at the event loop's end (60 s).
        app.exit(return_code=130)
    assert backend.stopped == [runs / LIVE]


async def test_an_app_closed_without_exit_lets_go_of_the_run_it_was_stopping(runs):
    """Closed by its driver or a harness (no exit()): the thread waiting for the stopped run
    quits too, instead of holding the process for STOP_WAIT_S."""
    backend = StopBackend(ends=False)
    app = launched_app(backend, runs / LIVE)
    async with app.run_test(size=SIZE) as pilot:
        await monitor_shown(pilot)
        await pilot.press("ctrl+c")
        await until(pilot, lambda: backend.stopped, "the stop asked for")
    assert app._leave.is_set()
    assert not [
        t
        for t in threading.enumerate()
        if t.name.startswith("_stop_own_run") or "interrupt" in t.name
    ]


# -- the outcome stays on the terminal ------------------------------------------------------------


async def test_leaving_a_failed_run_prints_its_root_cause_and_where_its_output_is(runs, capsys):
    """`xl attach` of a failed run, closed with q: what the plain view prints at the end stays
    on the terminal (the traceback, the outcome line, the `xl logs` command), exit 1."""
    app = build_app(monitor_run_dir=runs / FAILED, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await monitor_shown(pilot)
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the app closed")
    out = exit_message(capsys)
    assert exit_code(app) == 1
    assert "xl: traceback of rank 1:" in out and OOM in out
    assert f"xl: run {FAILED} failed after 32.0s: rank 1 failed first (exit code 1)" in out
    assert f"xl logs {FAILED} --rank 1" in out
    # as the plain view orders them
    assert out.index("traceback of rank 1") < out.index(f"run {FAILED} failed")


async def test_a_run_that_succeeded_leaves_one_line(runs, capsys):
    app = build_app(monitor_run_dir=runs / "20260530-healthy", clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await monitor_shown(pilot)
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the app closed")
    out = exit_message(capsys).strip()
    assert exit_code(app) == 0
    assert out == "xl: run 20260530-healthy succeeded after 102.0s", out


# -- the Monitor `xl launch` opened closes once its run ended -------------------------------------


async def test_the_monitor_xl_launch_opened_closes_when_its_run_ends(runs, capsys):
    run_dir = runs / LIVE
    app = launched_app(StopBackend(ends=False), run_dir, close_after_end_s=0.5)
    async with app.run_test(size=SIZE) as pilot:
        monitor = await monitor_shown(pilot)
        await pilot.pause(1.0)
        assert app.is_running  # a running run keeps it open
        set_status(run_dir, "failed", failed_from=runs / FAILED)
        await until(pilot, lambda: monitor.status == "failed", "the Monitor saw the run fail")
        await until(pilot, lambda: not app.is_running, "the app closed by itself")
    out = exit_message(capsys)
    assert exit_code(app) == 1
    assert (
        OOM in out and f"xl: run {LIVE} failed after" in out and f"xl logs {LIVE} --rank 1" in out
    )


async def test_a_key_keeps_the_monitor_open_and_other_monitors_never_close(runs):
    run_dir = runs / LIVE
    app = launched_app(StopBackend(ends=False), run_dir, close_after_end_s=1.0)
    async with app.run_test(size=SIZE) as pilot:
        monitor = await monitor_shown(pilot)
        set_status(run_dir, "succeeded")
        await until(pilot, lambda: monitor.status == "succeeded", "the Monitor saw the run end")
        await pilot.press("c")  # any key
        await pilot.pause(2.0)
        assert app.is_running and app.screen is monitor

    # `xl attach` (not the command that started the run) and the bare app never close by themselves.
    set_status(run_dir, "running")
    app = build_app(monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        monitor = await monitor_shown(pilot)
        set_status(run_dir, "succeeded")
        await until(pilot, lambda: monitor.status == "succeeded", "the Monitor saw the run end")
        await pilot.pause(1.5)
        assert app.is_running


async def test_the_run_ending_while_the_person_is_elsewhere_keeps_the_app(runs, capsys):
    """After `esc` from its Monitor the person is doing something else: the app stays."""
    run_dir = runs / LIVE
    app = launched_app(StopBackend(ends=False), run_dir, close_after_end_s=0.3)
    async with app.run_test(size=SIZE) as pilot:
        await monitor_shown(pilot)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen.id == "gpus", "GPUs")
        set_status(run_dir, "succeeded")
        await pilot.pause(1.5)
        assert app.is_running
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the app quit")
    assert exit_code(app) == 0
    assert f"xl: run {LIVE} succeeded" in exit_message(capsys)
