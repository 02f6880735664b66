"""The app as `xl launch` opens it, on recorded runs, for Pilot tests of keys and leaving: the
recorded runs copied into a private XL_HOME, a backend that records stop() instead of stopping,
and waiting until the Monitor shows its run."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import runfixtures
from pilotwait import until
from where import FIXTURES

from xl.doctor.report import Report
from xl.tui.app import build_app
from xl.tui.backend import LocalBackend
from xl.tui.screens.monitor import MonitorScreen

RUNS_FIXTURES = FIXTURES / "runs"
NOW = runfixtures.T0 + 130
LIVE = "20260530-straggler"  # run.json says running


class StopBackend(LocalBackend):
    """This machine, except that stop() records the call and the run then reads as stopped
    (``ends=False``: it never ends, as a run whose ranks ignore SIGTERM past the wait)."""

    def __init__(self, ends: bool = True) -> None:
        super().__init__()
        self.ends = ends
        self.stopped: list[Path] = []

    def stop(self, run_dir: Path) -> None:
        self.stopped.append(run_dir)

    def run_status(self, run_dir: Path) -> str | None:
        if run_dir in self.stopped and self.ends:
            return "stopped"
        return super().run_status(run_dir)

    def doctor_report(self) -> Report:
        return Report(checks=[])  # the Doctor's content is not the point here


def copy_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The recorded runs in a private XL_HOME (and config home), the test in ``tmp_path``."""
    runs = tmp_path / "xlhome" / "runs"
    shutil.copytree(RUNS_FIXTURES, runs)
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    return runs


def launched_app(backend: LocalBackend, run_dir: Path, **options: Any) -> Any:
    """The app `xl launch` opens on its run: its Monitor, which may stop the run (``options``:
    build_app's others, e.g. ``close_after_end_s``)."""
    return build_app(
        backend,
        monitor_run_dir=run_dir,
        attach_only=False,
        clock=lambda: NOW,
        poll_interval=0.2,
        **options,
    )


async def monitor_shown(pilot: Any) -> MonitorScreen:
    app = pilot.app
    await until(
        pilot,
        lambda: isinstance(app.screen, MonitorScreen) and app.screen.status is not None,
        "the Monitor",
    )
    return app.screen
