"""The supervisor's door to telemetry: the collector's port held before torchrun starts, and the
typed calls that never take the run down (launcher/supervisor/safe_telemetry.py)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from xl.launcher.rundir.events import Event
from xl.launcher.supervisor.safe_telemetry import TelemetryPort


def test_the_ranks_get_the_collector_s_port_before_telemetry_starts_and_it_listens_there(
    tmp_path: Path,
) -> None:
    port = TelemetryPort("t" * 32)
    env = port.reserve(tmp_path)
    host, _, number = env["XL_COLLECTOR"].rpartition(":")
    assert host == "127.0.0.1" and env["XL_TOKEN"] == "t" * 32
    # Held: another program cannot take it in between.
    other = socket.socket()
    try:
        with pytest.raises(OSError):
            other.bind(("127.0.0.1", int(number)))
    finally:
        other.close()
    events: list[Event] = []
    try:
        started = port.start(tmp_path, events.append)
        assert started["XL_COLLECTOR"] == env["XL_COLLECTOR"]
        assert json.loads((tmp_path / "collector.json").read_text())["port"] == int(number)
        with socket.create_connection(("127.0.0.1", int(number)), timeout=5):
            pass  # the collector itself listens there now
    finally:
        port.stop()
    assert not port.running


def test_an_earlier_supervisor_s_port_is_taken_again(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    (tmp_path / "collector.json").write_text(json.dumps({"port": free}))
    port = TelemetryPort("t" * 32)
    assert port.reserve(tmp_path)["XL_COLLECTOR"] == f"127.0.0.1:{free}"
    port.stop()


def test_without_telemetry_every_call_is_a_no_op(tmp_path: Path) -> None:
    port = TelemetryPort("t" * 32)
    port.set_ranks([{"rank": 0}])
    port.feed_log_line(0, "loss=1")
    port.stop_nodes({"reason": "failure"})
    assert port.rank_frames() == {}
    port.stop()
    assert not port.running and port.telemetry is None


def test_a_telemetry_call_that_fails_is_said_and_the_run_goes_on(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    port = TelemetryPort("t" * 32)
    port.start(tmp_path, lambda event: None)
    assert port.telemetry is not None
    try:
        port.set_ranks(None)  # type: ignore[arg-type]  # a bug in what the loop hands on
    finally:
        port.stop()
    assert "telemetry.set_ranks failed" in capfd.readouterr().err


def test_metrics_a_full_disk_cut_are_counted_for_run_json(tmp_path: Path) -> None:
    port = TelemetryPort("t" * 32)
    assert port.metrics_bytes_lost() == 0  # never started
    port.start(tmp_path, lambda event: None)
    try:
        assert port.telemetry is not None and port.telemetry.writer is not None
        assert port.metrics_bytes_lost() == 0
        port.telemetry.writer.bytes_lost = 4096  # as MetricsWriter counts them (test_metrics_lost)
        assert port.metrics_bytes_lost() == 4096
    finally:
        port.stop()
    assert port.metrics_bytes_lost() == 4096  # still there for the record once it stopped
