"""settle: the record of a run whose supervisor is gone, made true from what its ranks left.

The run dirs here are written as the contract has them (docs/contracts.md, "The run directory"):
run.json as the supervisor left it ("running"), ``ranks/rank-<r>.json`` as each rank's entry point
writes it at its end, ``spool/`` as a rank's xl.log client leaves what it could not send.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from xl import wire
from xl.launcher.rundir import settle

HOST = "trn-a07"
TRACEBACK = (
    'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\nValueError: bad '
    'batch\n'
)


def _run_dir(tmp_path: Path, nproc: int = 2, **fields: Any) -> Path:
    """A run dir whose supervisor wrote run.json ("running", its ranks' rows) and then died."""
    run_dir = tmp_path / "run"
    for sub in ("ranks", "logs"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    started = time.time() - 600
    record = {
        "run_id": "20260530-settle",
        "status": "running",
        "nnodes": 1,
        "node_rank": 0,
        "nproc_per_node": nproc,
        "world_size": nproc,
        "host": HOST,
        "started_at": started,
        "ended_at": None,
        "failure": None,
        "ranks": [
            {
                "rank": r,
                "local_rank": r,
                "node": HOST,
                "node_rank": 0,
                "pid": 1000 + r,
                "state": "running",
                "started_at": started,
            }
            for r in range(nproc)
        ],
        **fields,
    }
    (run_dir / "run.json").write_text(json.dumps(record))
    return run_dir


def _rank_left(run_dir: Path, rank: int, exit_code: int, ended_at: float, **more: Any) -> None:
    report = {
        "rank": rank,
        "local_rank": rank,
        "pid": 1000 + rank,
        "exit_code": exit_code,
        "ended_at": ended_at,
        **more,
    }
    (run_dir / "ranks" / f"rank-{rank}.json").write_text(json.dumps(report))


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _json(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "run.json").read_text())
    return data


def _age(path: Path, seconds_ago: float) -> None:
    when = time.time() - seconds_ago
    os.utime(path, (when, when))


def test_every_rank_exited_0_the_run_succeeded_when_it_last_did_something(tmp_path: Path) -> None:
    """Training ended on its own after the supervisor was killed: the run succeeded, and it ended
    when its ranks did (not when someone looked, an hour later)."""
    run_dir = _run_dir(tmp_path)
    ended = time.time() - 3600
    _rank_left(run_dir, 0, 0, ended - 5)
    _rank_left(run_dir, 1, 0, ended)
    for path in run_dir.rglob("*"):
        if path.is_file():
            _age(path, 3600)
    rec = settle.settle(run_dir, stopped=False)
    assert rec is not None and rec.status == "succeeded"
    run = _json(run_dir)
    assert run["status"] == "succeeded" and run["failure"] is None
    assert run["ended_at"] is not None and abs(run["ended_at"] - ended) < 1, (
        run["ended_at"],
        ended,
    )
    assert [(r["rank"], r["state"], r["exit_code"]) for r in run["ranks"]] == [
        (0, "exited", 0),
        (1, "exited", 0),
    ]
    [end] = [e for e in _events(run_dir) if e["kind"] == "run_ended"]
    assert end["status"] == "succeeded"
    assert (
        end["message"] == "run succeeded (its supervisor was gone; told from what the ranks left)"
    )


def test_the_first_rank_to_fail_is_the_cause_with_its_traceback(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    now = time.time()
    _rank_left(run_dir, 1, 1, now - 20, traceback=TRACEBACK, error="ValueError: bad batch")
    _rank_left(run_dir, 0, -15, now - 10)
    settle.settle(run_dir, stopped=False)
    run = _json(run_dir)
    assert run["status"] == "failed"
    failure = run["failure"]
    assert (failure["rank"], failure["exit_code"], failure["traceback"]) == (1, 1, TRACEBACK), (
        failure
    )
    assert (
        failure["message"] == "rank 1 failed first: ValueError: bad batch (its supervisor was gone)"
    )
    assert failure["node"] == HOST and failure["node_rank"] == 0
    assert {r["rank"]: r["state"] for r in run["ranks"]} == {0: "failed", 1: "failed"}


def test_a_rank_that_left_no_exit_code_fails_the_run(tmp_path: Path) -> None:
    """Rank 1 was killed with everything else (no record of its end): the run did not succeed,
    even though the only rank that reported exited 0."""
    run_dir = _run_dir(tmp_path)
    _rank_left(run_dir, 0, 0, time.time() - 5)
    settle.settle(run_dir, stopped=False, why="every process of it was gone")
    run = _json(run_dir)
    assert run["status"] == "failed"
    assert run["failure"]["rank"] == 1 and run["failure"]["exit_code"] is None
    assert (
        run["failure"]["message"]
        == "rank 1 failed first: it ended without an exit code (every process of it was gone)"
    )
    assert (
        _events(run_dir)[-1]["message"]
        == "run failed (every process of it was gone; told from what the ranks left)"
    )


def test_a_stop_that_was_asked_for_makes_the_run_stopped_not_failed(tmp_path: Path) -> None:
    """`xl stop` asked (stop_requested_at in run.json) and then the supervisor died: the ranks
    killed by the stop do not make it a failure."""
    run_dir = _run_dir(tmp_path, stop_requested_at=time.time() - 30)
    _rank_left(run_dir, 0, -15, time.time() - 20)
    _rank_left(run_dir, 1, -9, time.time() - 19)
    settle.settle(run_dir, stopped=False)
    run = _json(run_dir)
    assert run["status"] == "stopped" and run["failure"] is None
    assert {r["rank"]: r["state"] for r in run["ranks"]} == {0: "stopped", 1: "stopped"}
    # The caller that just ended the run's processes says so: its end is now.
    other = _run_dir(tmp_path / "b")
    before = time.time()
    settle.settle(other, stopped=True, why="xl stop ended it", ended_now=True)
    assert _json(other)["status"] == "stopped" and _json(other)["ended_at"] >= before


def test_ranks_the_supervisor_never_listed_are_taken_from_their_own_records(tmp_path: Path) -> None:
    """The supervisor died before it wrote any row: the ranks' own reports make the rows (on this
    run's host), and a run whose every rank exited 0 succeeded."""
    run_dir = _run_dir(tmp_path)
    data = _json(run_dir)
    data["ranks"] = []
    (run_dir / "run.json").write_text(json.dumps(data))
    _rank_left(run_dir, 0, 0, time.time() - 2, started_at=time.time() - 60)
    _rank_left(run_dir, 1, 0, time.time() - 1, started_at=time.time() - 60)
    settle.settle(run_dir, stopped=False)
    run = _json(run_dir)
    assert run["status"] == "succeeded"
    rows = [(r["rank"], r["node"], r["node_rank"], r["pid"], r["state"]) for r in run["ranks"]]
    assert rows == [(0, HOST, 0, 1000, "exited"), (1, HOST, 0, 1001, "exited")]


def test_what_gone_ranks_spooled_reaches_metrics_and_a_torn_last_line_is_dropped(
    tmp_path: Path,
) -> None:
    run_dir = _run_dir(tmp_path, nproc=1)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(10)  # a rank process that no longer exists
    spool = Path(wire.spool_file(str(run_dir), 0, gone.pid))
    spool.parent.mkdir()
    lines = [
        json.dumps({"t": time.time(), "rank": 0, "kind": "train", "step": s, "loss": 1.0 / (s + 1)})
        for s in range(3)
    ]
    spool.write_text("\n".join(lines) + '\n{"t": 1, "rank": 0, "ki')
    _rank_left(run_dir, 0, 0, time.time())
    settle.settle(run_dir, stopped=False)
    stored = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in stored] == [0, 1, 2]
    assert not any(spool.parent.iterdir())


def test_a_run_is_settled_once_whoever_comes_second(tmp_path: Path) -> None:
    """`xl runs` and a rank's entry point may both notice: one run_ended event, one record; a
    final run is never rewritten."""
    run_dir = _run_dir(tmp_path, nproc=1)
    _rank_left(run_dir, 0, 0, time.time())
    first = settle.settle(run_dir, stopped=False)
    assert first is not None and first.final
    again = settle.settle(run_dir, stopped=True)
    assert again is not None and again.status == "succeeded"
    assert [e["kind"] for e in _events(run_dir)].count("run_ended") == 1
    assert _json(run_dir)["status"] == "succeeded"


def test_a_run_already_ended_by_its_supervisor_is_left_as_it_is(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, nproc=1)
    data = _json(run_dir)
    data.update(
        status="failed",
        ended_at=time.time() - 50,
        failure={"rank": 0, "message": "rank 0 failed first: OOM"},
    )
    (run_dir / "run.json").write_text(json.dumps(data))
    before = (run_dir / "run.json").read_bytes()
    _rank_left(run_dir, 0, 0, time.time())  # whatever the rank says now
    rec = settle.settle(run_dir, stopped=True)
    assert rec is not None and rec.status == "failed"
    assert (run_dir / "run.json").read_bytes() == before and not _events(run_dir)


def test_a_run_dir_without_a_record_is_not_settled(tmp_path: Path) -> None:
    run_dir = tmp_path / "half-made"
    run_dir.mkdir()
    assert settle.settle(run_dir, stopped=False) is None
    assert list(run_dir.iterdir()) == []
