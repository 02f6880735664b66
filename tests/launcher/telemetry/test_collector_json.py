"""collector.json, read into a CollectorStatus and written from one: the same bytes a reader
relies on, and the port a restarted supervisor takes from it."""

from __future__ import annotations

import json
from pathlib import Path

from xl.launcher.telemetry import (
    CollectorStatus,
    previous_port,
    read_collector_json,
    write_collector_json,
)

WRITTEN = {
    "host": "127.0.0.1",
    "port": 41234,
    "supervisor_pid": 4242,
    "updated": 1700000000.25,
    "address": "127.0.0.1:41234",
    "frames": 10,
    "records": 95,
    "node_frames": 0,
    "rank_peers": 2,
    "duplicate_frames": 1,
    "rejects": {"bad_token": 3},
    "spooled_records": 4,
    "unparsed_lines": 0,
    "printed_before_training": 7,
    "metrics_bytes_lost": 0,
}


def test_a_status_is_written_with_the_keys_in_the_files_order_and_read_back(
    tmp_path: Path,
) -> None:
    status = CollectorStatus.from_json(WRITTEN)
    write_collector_json(tmp_path, status)
    text = (tmp_path / "collector.json").read_text()
    assert text == json.dumps(WRITTEN, indent=2) + "\n"
    assert read_collector_json(tmp_path) == status
    assert previous_port(tmp_path) == 41234


def test_a_file_with_keys_missing_or_odd_still_gives_its_port(tmp_path: Path) -> None:
    """A file another xl wrote with fewer keys, or one a person edited: what can be read is."""
    (tmp_path / "collector.json").write_text(json.dumps({"port": 5000, "frames": "many"}))
    status = read_collector_json(tmp_path)
    assert status is not None and status.port == 5000 and status.frames == 0
    assert previous_port(tmp_path) == 5000


def test_no_port_is_taken_from_a_damaged_file_or_one_out_of_range(tmp_path: Path) -> None:
    assert previous_port(tmp_path) == 0  # none written yet
    (tmp_path / "collector.json").write_text('{"port": 41')  # mid-replace, or damaged
    assert read_collector_json(tmp_path) is None and previous_port(tmp_path) == 0
    for port in (0, 70000, True, "41234", None):
        (tmp_path / "collector.json").write_text(json.dumps({"port": port}))
        assert previous_port(tmp_path) == 0, port
