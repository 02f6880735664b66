"""The supervisor's parts hand their results to the loop, which acts on them: a stop begun (by
whichever part) is saved in run.json on the loop's turn, and writes the disk refused (escaped.json,
other nodes' rank logs) come back to the loop, which has the journal say each file once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xl.launcher.rundir import layout
from xl.launcher.supervisor.escapes import Escapes
from xl.launcher.supervisor.journal import Journal, WriteFailed
from xl.launcher.supervisor.logsink import LogSink
from xl.launcher.supervisor.loop import Supervisor
from xl.launcher.supervisor.stopping import StopReason


def _unit_run_dir(tmp_path: Path) -> Path:
    """A one-node run dir of 2 ranks as start_run leaves it, for a supervisor never started."""
    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    record = {
        "run_id": f"results-{os.getpid()}-{time.monotonic_ns()}",
        "status": "running",
        "nnodes": 1,
        "node_rank": 0,
        "nproc_per_node": 2,
        "world_size": 2,
        "host": "here",
        "grace_s": 0.3,
        "ranks": [],
        "failure": None,
    }
    (run_dir / "run.json").write_text(json.dumps(record))
    return run_dir


def _sleeper(env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _end(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


def _run_json(run_dir: Path) -> dict[str, object]:
    return json.loads((run_dir / "run.json").read_text())


def test_a_stop_begun_by_another_part_is_saved_on_the_loop_s_turn(tmp_path: Path) -> None:
    """The hub begins a stop when another node asks for one: the loop's next turn saves run.json
    with it; a turn with nothing new leaves run.json as it was."""
    run_dir = _unit_run_dir(tmp_path)
    sup = Supervisor(run_dir)
    rank = _sleeper()
    try:
        sup.act(sup.ranks.hello(0, rank.pid))
        sup._turn()
        saved = os.stat(run_dir / "run.json").st_ino
        sup._turn()
        assert os.stat(run_dir / "run.json").st_ino == saved  # nothing new: not rewritten
        assert _run_json(run_dir).get("stop_requested_at") is None

        sup.record.update(stop_requested_at=1234.5)  # as the hub does, then:
        assert sup.stopping.begin(StopReason.REQUESTED) is True
        assert sup.stopping.begin(StopReason.FAILURE) is False  # the first stop stays
        sup._turn()
        assert _run_json(run_dir)["stop_requested_at"] == 1234.5
        # The stop ended the rank. Its code is not asserted: the loop's reaper (waitpid(-1), as
        # for torchrun's orphans) may take this test's child before Popen does (it reads 0 then).
        rank.wait(10)
        sup.act(sup.ranks.check_alive())
        sup._turn()
        saved = os.stat(run_dir / "run.json").st_ino
        sup._turn()  # the same stop: nothing to save for it again
        assert os.stat(run_dir / "run.json").st_ino == saved
        assert sup.stopping.current is not None
        assert sup.stopping.current.reason is StopReason.REQUESTED
    finally:
        _end(rank)
    sup.finish()


def test_writes_of_other_nodes_logs_the_disk_refused_come_back_once_a_file(
    tmp_path: Path,
) -> None:
    sink = LogSink(tmp_path)  # no logs/ directory: every write there fails
    for _ in range(3):
        sink.append(3, b"a line of rank 3\n", b"")
    sink.append(5, b"a line of rank 5\n", b"")
    refused = sink.refused()
    assert [f.what for f in refused] == ["logs/rank-3.log", "logs/rank-5.log"]
    assert all(isinstance(f.error, FileNotFoundError) for f in refused)
    assert sink.refused() == []  # handed over once
    (tmp_path / "logs").mkdir()
    sink.append(3, b"now it goes in\n", b"")
    assert sink.refused() == []
    assert (tmp_path / "logs" / "rank-3.log").read_text() == "now it goes in\n"
    sink.close_all()


def test_escaped_json_the_disk_refused_comes_back_to_the_loop(tmp_path: Path) -> None:
    """A child that shed the run's environment, seen on two scans, is recorded in escaped.json;
    where that write fails the scan returns it (and tries again on the next scan)."""
    child = _sleeper(env={"PATH": os.environ.get("PATH", "")})
    try:
        gone = tmp_path / "no-such-run-dir"
        escapes = Escapes(gone, "run-without-children")
        assert escapes.scan() == []  # seen once: not yet recorded
        escapes.scan_at = 0.0
        refused = escapes.scan()
        assert [f.what for f in refused] == [layout.ESCAPED]
        assert isinstance(refused[0].error, OSError)
        gone.mkdir()
        escapes.scan_at = 0.0
        assert escapes.scan() == []
        recorded = json.loads((gone / layout.ESCAPED).read_text())
        assert child.pid in [item["pid"] for item in recorded]
    finally:
        _end(child)


def test_the_journal_says_each_refused_file_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    run_dir = _unit_run_dir(tmp_path)
    sup = Supervisor(run_dir)
    journal: Journal = sup.journal
    full = OSError(28, "No space left on device")
    journal.refused([WriteFailed("logs/rank-3.log", full), WriteFailed(layout.ESCAPED, full)])
    journal.refused([WriteFailed("logs/rank-3.log", full)])
    journal.refused([])
    said = [line for line in capfd.readouterr().err.splitlines() if "cannot write" in line]
    assert said == [
        "xl supervisor: cannot write logs/rank-3.log: [Errno 28] No space left on device",
        f"xl supervisor: cannot write {layout.ESCAPED}: [Errno 28] No space left on device",
    ]
