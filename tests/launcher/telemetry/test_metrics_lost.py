"""Metrics lines a full disk made the collector cut from memory are said, not silently lost
(xl.launcher.telemetry.service, xl.launcher.rundir.metrics): an event as telemetry stops, and the
count in collector.json while the run goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xl.launcher.rundir import metrics
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.metrics import MetricsWriter
from xl.launcher.telemetry.service import Telemetry


def _events(run_dir: Path) -> list[dict[str, object]]:
    path = RunLayout(run_dir).events
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_writer_counts_what_it_cut_while_the_disk_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "PENDING_CAP", 64 * 1024)
    writer = MetricsWriter(tmp_path)
    writer.error = OSError(28, "No space left on device")  # as after a failed write: lines wait
    writer.write_lines([b"x" * 1023] * 74)
    # the oldest whole lines
    assert writer.bytes_lost >= 10 * 1024 and writer.bytes_lost % 1024 == 0
    writer.close()
    kept = RunLayout(tmp_path).metrics.stat().st_size  # the newest, once the disk took them
    assert kept <= 64 * 1024 and kept + writer.bytes_lost == 74 * 1024


def test_telemetry_says_what_was_lost_as_it_stops(tmp_path: Path) -> None:
    telemetry = Telemetry(tmp_path, token="t" * 32, inventory=False)
    telemetry.writer = MetricsWriter(tmp_path)
    telemetry.writer.bytes_lost = 4096
    telemetry.stop()
    lost = [e for e in _events(tmp_path) if e["kind"] == "metrics_lost"]
    assert len(lost) == 1 and lost[0]["bytes"] == 4096 and lost[0]["rank"] is None
    assert "4096 bytes of metrics lines were lost" in str(lost[0]["message"])


def test_nothing_is_said_when_nothing_was_lost(tmp_path: Path) -> None:
    telemetry = Telemetry(tmp_path, token="t" * 32, inventory=False)
    telemetry.writer = MetricsWriter(tmp_path)
    telemetry.stop()
    assert _events(tmp_path) == []
