"""One kill, one story, whatever order the supervisor finds the ranks gone in: a rank's end is
said once it is known (its exit code, the failure's decision), the killed rank is the cause and
is never said "stopped", the survivor that lost it is never the cause; and a survivor tearing
down after losing its peer is ended as torchrun would end it, while a rank's own failure keeps
its teardown. Plain processes stand in for ranks; torchrun's words are written to its log.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from fakeranks import end_rank as _end
from fakeranks import events as _events
from fakeranks import fake_rank as _fake_rank
from fakeranks import unit_run_dir as _unit_run_dir
from procs import run_json

from xl.launcher.rundir.runrecord import RunStatus
from xl.launcher.supervisor.loop import Supervisor

PEER_LOST = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[127.0.0.1]:19124: Connection reset by peer"
)


def _record(run_dir: Path, rank: int, pid: int, code: int, error: str) -> None:
    (run_dir / "ranks" / f"rank-{rank}.json").write_text(json.dumps({
        "pid": pid, "local_rank": rank, "exit_code": code, "error": error,
        "traceback": f"Traceback (most recent call last):\n{error}\n", "ended_at": time.time(),
    }))


def _exits(run_dir: Path) -> list[str]:
    return [str(e["message"]) for e in _events(run_dir) if e["kind"] == "rank_exited"]


@pytest.mark.parametrize("killed_found_first", [True, False])
def test_the_killed_rank_is_the_cause_and_each_end_is_said_once_known(
    tmp_path: Path, killed_found_first: bool
) -> None:
    run_dir = _unit_run_dir(tmp_path, grace=30.0)
    sup = Supervisor(run_dir)
    survivor, killed = _fake_rank(ignore_term=True), _fake_rank()
    try:
        sup.act(sup.ranks.hello(0, survivor.pid))
        sup.act(sup.ranks.hello(1, killed.pid))
        killed.kill()
        assert killed.wait(5) == -signal.SIGKILL  # reaped here: no zombie left to read
        _record(run_dir, 0, survivor.pid, 1, PEER_LOST)
        found = [sup.ranks.check_alive, sup.ranks.scan_records]
        for look in found if killed_found_first else found[::-1]:
            sup.act(look())
        assert sup.stopping.current is not None  # the run stops at once
        # Neither end is said while the cause is not decided: the killed rank's signal is not
        # known yet (torchrun has not reported it).
        assert sup.cause.decide(sup.ranks, None, sup.sink.drain) is None
        sup.act([])
        assert _exits(run_dir) == []
        (run_dir / "logs" / "torchrun.log").write_text(
            f"E1207 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) "
            f"local_rank: 1 (pid: {killed.pid}) of binary: python\n"
        )
        failure = sup.cause.decide(sup.ranks, None, sup.sink.drain)
        assert failure is not None and (failure.rank, failure.exit_code) == (1, -9)
        said = _exits(run_dir)
        assert sorted(said) == ["rank 0 exited with code 1", "rank 1 was killed by SIGKILL"]
        kinds = [e["kind"] for e in _events(run_dir)]
        assert kinds.index("failure") == len(kinds) - 1  # the ends first, then the cause
        sup.stopping.advance()  # the survivor's teardown: ended (it only lost its peer)
        assert survivor.wait(10) == -signal.SIGKILL
        sup.act(sup.ranks.check_alive())
        sup.torchrun.code = 1
        assert sup.finish() is RunStatus.FAILED
    finally:
        _end(survivor)
        _end(killed)
    run = run_json(run_dir)
    assert (run["failure"]["rank"], run["failure"]["exit_code"]) == (1, -9)
    assert [(r["rank"], r["state"], r["exit_code"]) for r in run["ranks"]] == [
        (0, "stopped", 1), (1, "failed", -9),
    ]
    failures = [e for e in _events(run_dir) if e["kind"] == "failure"]
    assert len(failures) == 1 and (failures[0]["rank"], failures[0]["exit_code"]) == (1, -9)
    assert failures[0]["cause"] == run["failure"]["cause"]
    assert len(_exits(run_dir)) == 2  # each end said once


def test_a_rank_s_own_failure_keeps_its_teardown_until_the_grace(tmp_path: Path) -> None:
    """Rank 0 failed of its own (a ValueError) and tears down ignoring SIGTERM, as xl's entry
    lets it: it is not cut short; only the grace's SIGKILL ends it."""
    run_dir = _unit_run_dir(tmp_path, grace=30.0)
    sup = Supervisor(run_dir)
    own, peer = _fake_rank(ignore_term=True), _fake_rank(ignore_term=True)
    try:
        sup.act(sup.ranks.hello(0, own.pid))
        sup.act(sup.ranks.hello(1, peer.pid))
        _record(run_dir, 0, own.pid, 1, "ValueError: labels out of range")
        _record(run_dir, 1, peer.pid, 1, PEER_LOST)
        sup.act(sup.ranks.scan_records())
        assert sup.stopping.current is not None
        time.sleep(0.5)  # far from the grace
        sup.stopping.advance()
        # the peer that only lost rank 0 is ended; rank 0's own teardown goes on
        assert peer.wait(10) == -signal.SIGKILL
        assert own.poll() is None
    finally:
        _end(own)
        _end(peer)


def test_ranks_that_only_lost_each_other_keep_their_teardown(tmp_path: Path) -> None:
    """Both ranks lost a peer (the rank that died is on another node): no rank here died of its
    own, so none is cut short."""
    run_dir = _unit_run_dir(tmp_path, grace=30.0)
    sup = Supervisor(run_dir)
    procs = [_fake_rank(ignore_term=True), _fake_rank(ignore_term=True)]
    try:
        for rank, proc in enumerate(procs):
            sup.act(sup.ranks.hello(rank, proc.pid))
            _record(run_dir, rank, proc.pid, 1, PEER_LOST)
        sup.act(sup.ranks.scan_records())
        assert sup.stopping.current is not None
        time.sleep(0.5)  # far from the grace
        sup.stopping.advance()
        assert [p.poll() for p in procs] == [None, None]
    finally:
        for proc in procs:
            _end(proc)


def _ended(run_dir: Path, rank: int, pid: int, code: int, at: float) -> None:
    """A rank's record of an exit of its own (no exception): ``sys.exit(code)`` at ``at``."""
    (run_dir / "ranks" / f"rank-{rank}.json").write_text(json.dumps({
        "pid": pid, "local_rank": rank, "exit_code": code, "error": None, "traceback": None,
        "ended_at": at,
    }))


@pytest.mark.parametrize(
    ("code", "recorded", "said", "state"),
    [
        # recorded before xl's stop began, found after xl signalled it
        (3, "before", "rank 1 exited with code 3", "failed"),
        # recorded in its teardown, where xl's SIGTERM does nothing: an exit of its own
        (3, "after", "rank 1 exited with code 3", "failed"),
        # the exit a script's own SIGTERM handler gives: the stop's
        (128 + signal.SIGTERM, "after", "rank 1 stopped (143)", "stopped"),
    ],
)
def test_a_rank_xl_signalled_is_stopped_only_when_the_signal_ended_it(
    tmp_path: Path, code: int, recorded: str, said: str, state: str
) -> None:
    run_dir = _unit_run_dir(tmp_path, grace=30.0)
    sup = Supervisor(run_dir)
    procs = [_fake_rank(ignore_term=True), _fake_rank(ignore_term=True)]
    try:
        for rank, proc in enumerate(procs):
            sup.act(sup.ranks.hello(rank, proc.pid))
        before = time.time()
        _ended(run_dir, 0, procs[0].pid, 3, before)
        sup.act(sup.ranks.scan_records())  # rank 0 failed: the stop signals rank 1
        assert sup.stopping.current is not None and sup.ranks.by_rank[1].signalled is not None
        _ended(run_dir, 1, procs[1].pid, code, before if recorded == "before" else time.time())
        sup.act(sup.ranks.scan_records())
        failure = sup.cause.decide(sup.ranks, None, sup.sink.drain)
        assert failure is not None and failure.rank == 0
        assert _exits(run_dir) == ["rank 0 exited with code 3", said]
        for proc in procs:
            _end(proc)
        sup.act(sup.ranks.check_alive())
        sup.torchrun.code = 1
        assert sup.finish() is RunStatus.FAILED
    finally:
        for proc in procs:
            _end(proc)
    run = run_json(run_dir)
    assert [(r["rank"], r["state"], r["exit_code"]) for r in run["ranks"]] == [
        (0, "failed", 3), (1, state, code),
    ]
    assert run["failure"]["message"] == "rank 0 failed first: rank 0 exited with code 3"
    assert len(_exits(run_dir)) == 2


def test_a_healthy_rank_the_stop_killed_is_stopped(tmp_path: Path) -> None:
    run_dir = _unit_run_dir(tmp_path, grace=30.0)
    sup = Supervisor(run_dir)
    own, healthy = _fake_rank(ignore_term=True), _fake_rank()
    try:
        sup.act(sup.ranks.hello(0, own.pid))
        sup.act(sup.ranks.hello(1, healthy.pid))
        _record(run_dir, 0, own.pid, 1, "ValueError: labels out of range")
        sup.act(sup.ranks.scan_records())
        assert healthy.wait(10) == -signal.SIGTERM
        sup.act(sup.ranks.check_alive())
        failure = sup.cause.decide(sup.ranks, None, sup.sink.drain)
        assert failure is not None and failure.rank == 0
        assert _exits(run_dir) == ["rank 0 exited with code 1", "rank 1 stopped (-15)"]
        _end(own)
        sup.act(sup.ranks.check_alive())
        sup.torchrun.code = 1
        assert sup.finish() is RunStatus.FAILED
    finally:
        _end(own)
        _end(healthy)
    run = run_json(run_dir)
    assert [(r["rank"], r["state"], r["exit_code"]) for r in run["ranks"]] == [
        (0, "failed", 1), (1, "stopped", -15),
    ]
