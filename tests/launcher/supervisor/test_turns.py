"""The supervisor's turn fed typed changes, with no process at all: the ranks' table says who
started, ended or was restarted (``RankChange``), the loop's turn acts on it (``Lifecycle``,
the cause, the stop) and what it decided is read back from the run's events and run.json.
The pids are past the kernel's pid_max, so no signal the stop sends can reach a process.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from fakeranks import events as _events
from fakeranks import unit_run_dir as _unit_run_dir
from procs import run_json

from xl.launcher import runprocs
from xl.launcher.rundir.outcome import RankPhase
from xl.launcher.rundir.runrecord import RunStatus
from xl.launcher.supervisor.loop import Supervisor
from xl.launcher.supervisor.ranks import Change, RankChange
from xl.launcher.supervisor.stopping import StopReason


def _no_pid(k: int) -> int:
    """A pid no process can have: past pid_max."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1000 + k


def _supervisor(tmp_path: Path, max_restarts: int = 0) -> Supervisor:
    run_dir = _unit_run_dir(tmp_path, grace=30.0)
    rec = json.loads((run_dir / "run.json").read_text())
    spec = {**rec.get("spec", {}), "max_restarts": max_restarts}
    (run_dir / "run.json").write_text(json.dumps({**rec, "spec": spec}))
    return Supervisor(run_dir)


def _started(sup: Supervisor, rank: int, pid: int) -> list[RankChange]:
    changes = sup.ranks.hello(rank, pid)
    assert [c.change for c in changes][-1] is Change.STARTED
    return changes


def _ended(sup: Supervisor, rank: int, code: int, error: str | None = None) -> RankChange:
    """A rank's end as its record tells it (its error and traceback read with it)."""
    st = sup.ranks.get(rank)
    assert st is not None
    st.error = error
    st.traceback = f"Traceback (most recent call last):\n{error}\n" if error else None
    return RankChange(Change.ENDED, st, code, time.time())


def _said(sup: Supervisor) -> list[tuple[str, str]]:
    return [(str(e["kind"]), str(e["message"])) for e in _events(sup.run_dir)]


def _rows(sup: Supervisor) -> list[tuple[int, str, int | None]]:
    return [(r["rank"], r["state"], r["exit_code"]) for r in run_json(sup.run_dir)["ranks"]]


def test_a_rank_s_own_failure_stops_the_run_and_is_its_cause(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path)
    sup.turn([_started(sup, 0, _no_pid(0)) + _started(sup, 1, _no_pid(1))])
    assert [k for k, _ in _said(sup)] == ["rank_started", "rank_started"]
    assert sup.stopping.current is None

    sup.turn([[_ended(sup, 1, 3, "ValueError: labels out of range")]])
    stop = sup.stopping.current
    assert stop is not None and stop.reason is StopReason.FAILURE  # the stop begins at once
    assert sup.cause.failure is None  # decided once rank 0's end is in, or torchrun's
    assert [k for k, _ in _said(sup)].count("rank_exited") == 0  # its end waits for that

    # SIGTERM ended rank 0 (torchrun's: xl's found no process), during the stop
    sup.turn([[_ended(sup, 0, -15)]])
    failure = sup.cause.failure
    assert failure is not None and (failure.rank, failure.exit_code) == (1, 3)
    said = _said(sup)
    assert [m for k, m in said if k == "rank_exited"] == [
        "rank 1 exited with code 3",
        "rank 0 was killed by SIGTERM",
    ]
    assert [k for k, _ in said][-1] == "failure"  # the ends first, then the cause

    sup.torchrun.code = 1
    assert sup.finish() is RunStatus.FAILED
    assert _rows(sup) == [(0, "stopped", -15), (1, "failed", 3)]
    run = run_json(sup.run_dir)
    assert (run["failure"]["rank"], run["failure"]["exit_code"]) == (1, 3)
    assert [e["kind"] for e in _events(sup.run_dir)].count("failure") == 1
    assert runprocs.descendants(os.getpid()) == []  # no process was started


def test_a_rank_that_finished_as_its_peer_failed_is_exited_not_stopped(tmp_path: Path) -> None:
    """Rank 1 fails while rank 0 is finishing: rank 0's exit 0 (found after the stop began) is
    its own. It is "exited", never "stopped" nor the cause; rank 1 is."""
    sup = _supervisor(tmp_path)
    sup.turn([_started(sup, 0, _no_pid(0)) + _started(sup, 1, _no_pid(1))])
    sup.turn([[_ended(sup, 1, 3, "ValueError: labels out of range")]])
    assert sup.stopping.current is not None
    sup.turn([[_ended(sup, 0, 0)]])
    failure = sup.cause.failure
    assert failure is not None and failure.rank == 1
    exits = [m for k, m in _said(sup) if k == "rank_exited"]
    assert sorted(exits) == ["rank 0 exited with code 0", "rank 1 exited with code 3"]
    sup.torchrun.code = 1
    assert sup.finish() is RunStatus.FAILED
    assert _rows(sup) == [(0, "exited", 0), (1, "failed", 3)]


def test_a_failure_torchrun_restarts_after_is_no_cause_and_the_run_succeeds(
    tmp_path: Path,
) -> None:
    """--max-restarts 1: rank 1 fails, torchrun starts both ranks again, they finish. The run
    succeeded: no stop, no failure, one restart said."""
    sup = _supervisor(tmp_path, max_restarts=1)
    sup.turn([_started(sup, 0, _no_pid(0)) + _started(sup, 1, _no_pid(1))])
    sup.turn([[_ended(sup, 1, 3, "ValueError: labels out of range")], [_ended(sup, 0, -15)]])
    assert sup.stopping.current is None and sup.cause.failure is None
    assert sup.life.restart_due
    again = _started(sup, 0, _no_pid(2)) + _started(sup, 1, _no_pid(3))
    assert [c.change for c in again] == [Change.RESTARTED, Change.STARTED] * 2
    sup.turn([again])
    assert not sup.life.restart_due
    sup.turn([[_ended(sup, 0, 0), _ended(sup, 1, 0)]])
    sup.torchrun.code = 0
    assert sup.finish() is RunStatus.SUCCEEDED
    said = _said(sup)
    restarts = [m for k, m in said if k == "restarted"]
    assert restarts == [
        "torchrun restarted the ranks after rank 1 exited with code 3 (attempt 2 of 2)"
    ]
    assert not any(k in ("failure", "stop_requested") for k, _ in said)
    assert [(r["rank"], r["state"], r["attempt"]) for r in run_json(sup.run_dir)["ranks"]] == [
        (0, RankPhase.EXITED.value, 1), (1, RankPhase.EXITED.value, 1),
    ]
    assert run_json(sup.run_dir)["failure"] is None
