"""The supervisor's calls into telemetry: the collector's port held before torchrun starts, and the
typed calls that never take the run down (launcher/supervisor/safe_telemetry.py)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from xl.launcher.multinode.nodelink import StopCommand
from xl.launcher.rundir.events import Event
from xl.launcher.supervisor.safe_telemetry import SafeTelemetry


def test_the_ranks_get_the_collector_s_port_before_telemetry_starts_and_it_listens_there(
    tmp_path: Path,
) -> None:
    telemetry = SafeTelemetry("t" * 32)
    env = telemetry.reserve(tmp_path)
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
        started = telemetry.start(tmp_path, events.append)
        assert started["XL_COLLECTOR"] == env["XL_COLLECTOR"]
        assert json.loads((tmp_path / "collector.json").read_text())["port"] == int(number)
        with socket.create_connection(("127.0.0.1", int(number)), timeout=5):
            pass  # the collector itself listens there now
    finally:
        telemetry.stop()
    assert not telemetry.running


def test_an_earlier_supervisor_s_port_is_taken_again(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    (tmp_path / "collector.json").write_text(json.dumps({"port": free}))
    telemetry = SafeTelemetry("t" * 32)
    assert telemetry.reserve(tmp_path)["XL_COLLECTOR"] == f"127.0.0.1:{free}"
    telemetry.stop()


def test_without_telemetry_every_call_is_a_no_op(tmp_path: Path) -> None:
    telemetry = SafeTelemetry("t" * 32)
    telemetry.set_ranks([{"rank": 0}])
    telemetry.feed_log_line(0, "loss=1")
    telemetry.stop_nodes(StopCommand(requested=False, failure=None))
    assert telemetry.rank_frames() == {}
    telemetry.stop()
    assert not telemetry.running and telemetry.service is None


def test_a_telemetry_call_that_fails_is_said_and_the_run_goes_on(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    telemetry = SafeTelemetry("t" * 32)
    telemetry.start(tmp_path, lambda event: None)
    assert telemetry.service is not None
    try:
        telemetry.set_ranks(None)  # type: ignore[arg-type]  # a bug in what the loop hands on
    finally:
        telemetry.stop()
    assert "telemetry.set_ranks failed" in capfd.readouterr().err


def test_metrics_a_full_disk_cut_are_counted_for_run_json(tmp_path: Path) -> None:
    telemetry = SafeTelemetry("t" * 32)
    assert telemetry.metrics_bytes_lost() == 0  # never started
    telemetry.start(tmp_path, lambda event: None)
    try:
        assert telemetry.service is not None and telemetry.service.writer is not None
        assert telemetry.metrics_bytes_lost() == 0
        telemetry.service.writer.bytes_lost = 4096  # as MetricsWriter counts them
        assert telemetry.metrics_bytes_lost() == 4096
    finally:
        telemetry.stop()
    assert telemetry.metrics_bytes_lost() == 4096  # still there for the record once it stopped
