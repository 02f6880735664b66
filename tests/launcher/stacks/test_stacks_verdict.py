"""Who the others wait for, from stacks documents (pure), and faulthandler's text read back."""

from __future__ import annotations

import faulthandler
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from xl.launcher.rundir.events import Diagnosis, Event, EventKind
from xl.launcher.stacks import verdict as typed
from xl.launcher.stacks.ask import parse_faulthandler
from xl.launcher.stacks.gather import document
from xl.launcher.stacks.hang import HangCapture
from xl.launcher.stacks.model import RankStacks, Target
from xl.launcher.telemetry import stall
from xl.launcher.telemetry.stall import Progress
from xl.units import ranges

# The entries are written as the stacks document holds them (JSON), read as the product reads
# them, and each verdict is compared as the document writes it.


def _read(entries: list[dict[str, Any]]) -> list[RankStacks]:
    return [RankStacks.from_json(e) for e in entries]


def verdict(entries: list[dict[str, Any]]) -> dict[str, object]:
    return typed.verdict(_read(entries)).to_json()


def mismatch(entries: list[dict[str, Any]]) -> dict[str, object] | None:
    found = typed.mismatch(_read(entries))
    return None if found is None else found.to_json()


def judged(entries: list[dict[str, Any]], progress: Progress) -> dict[str, object]:
    return stall.judged(_read(entries), progress).to_json()


def group_lines(entries: list[dict[str, Any]]) -> list[str]:
    return typed.group_lines(_read(entries))


def _rank(
    rank: int,
    where: tuple[str, int, str],
    colls: list[tuple[int, str, str]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    file, line, function = where
    frames = [
        {"file": "/home/me/train.py", "line": 90, "function": "<module>"},
        {"file": file, "line": line, "function": function},
    ]
    if function in ("all_reduce", "broadcast"):
        frames[-1] = {"file": "/home/me/train.py", "line": line, "function": "main"}
        frames.append(
            {
                "file": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
                "line": 3252,
                "function": function,
            }
        )
    collectives = [
        {"pg": "default_pg", "seq": s, "op": op, "state": st} for s, op, st in colls or []
    ]
    return {
        "rank": rank,
        "node": 0,
        "pid": 100 + rank,
        "threads": [{"name": "MainThread", "frames": frames}],
        "collectives": collectives,
        **extra,
    }


def _waiting(rank: int, seq: int = 12, op: str = "all_reduce") -> dict[str, Any]:
    return _rank(
        rank,
        ("/home/me/train.py", 41, op),
        [(seq - 1, "all_reduce", "completed"), (seq, op, "scheduled")],
    )


def test_eight_ranks_read_as_one_line_and_the_one_missing_is_named() -> None:
    late = _rank(1, ("/home/me/data.py", 30, "load"), [(11, "all_reduce", "completed")])
    entries = [_waiting(r) for r in (0, 2, 3, 4, 5, 6, 7)] + [late]
    assert group_lines(entries) == [
        "ranks 0,2-7 wait in all_reduce #12 at train.py:41",
        "rank 1 is in load at data.py:30",
    ]
    v = verdict(entries)
    assert v["ranks"] == [1]
    assert (
        v["message"]
        == "rank 1 never entered all_reduce #12: it is in load at data.py:30. ranks 0,2-7 wait in "
        "all_reduce #12 for it"
    )


def test_a_culprit_using_the_cpu_is_said_to_be_working_and_one_waiting_is_not() -> None:
    """A long evaluation on one rank stalls the others as a hang does: its CPU says which may be."""
    waiting = [_waiting(r, seq=21, op="barrier") for r in (1, 2)]
    evaluating = _rank(
        0, ("/home/me/train.py", 88, "evaluate"), [(20, "barrier", "completed")], cpu_pct=98.6
    )
    v = verdict([*waiting, evaluating])
    assert v["ranks"] == [0]
    assert v["message"] == (
        "rank 0 never entered barrier #21: it is in evaluate at train.py:88, working at 99% CPU "
        "(a long computation, or a loop that never ends). ranks 1,2 wait in barrier #21 for it"
    )
    # Blocked (a lock, a socket, a sleep): a few percent, and the verdict says no more than where.
    blocked = _rank(
        0, ("/home/me/data.py", 30, "load"), [(20, "barrier", "completed")], cpu_pct=2.0
    )
    assert (
        verdict([*waiting, blocked])["message"]
        == "rank 0 never entered barrier #21: it is in load at data.py:30. ranks 1,2 wait in "
        "barrier #21 for it"
    )
    # A figure that is no number (a damaged record) claims nothing.
    for odd in (float("nan"), True, "99"):
        assert "working" not in verdict([*waiting, {**evaluating, "cpu_pct": odd}])["message"]


def test_on_a_loaded_machine_a_culprit_using_many_times_its_waiting_peers_cpu_is_working() -> None:
    """Load 19 on 2 cores: a rank spinning in Python got 14% of a core, its waiting peers 0.3%."""
    waiting = [{**_waiting(r, seq=21, op="barrier"), "cpu_pct": 0.3} for r in (1, 2)]
    spinning = _rank(
        0, ("/home/me/train.py", 88, "evaluate"), [(20, "barrier", "completed")], cpu_pct=14.0
    )
    assert "evaluate at train.py:88, working at 14% CPU" in verdict([*waiting, spinning])["message"]
    # Left alone: blocked at 1.5% beside idle peers (under BUSY_MIN_CPU), 14% beside peers that use
    # as much (the whole machine is slow, nobody stands out), and no peer figure to compare with.
    for cpu, peers_cpu in ((1.5, 0.1), (14.0, 12.0), (14.0, None)):
        culprit = {**spinning, "cpu_pct": cpu}
        peers = [
            {k: v for k, v in w.items() if k != "cpu_pct"}
            if peers_cpu is None
            else {**w, "cpu_pct": peers_cpu}
            for w in waiting
        ]
        assert "working" not in verdict([*peers, culprit])["message"], (cpu, peers_cpu)


def test_ranks_that_disagree_about_the_next_collective() -> None:
    v = verdict([_waiting(0), _waiting(2), _waiting(1, op="broadcast")])
    assert v == {
        "ranks": [1],
        "mismatch": True,
        "message": "mismatch at #12 of process group default_pg (different collectives; they can "
        "never match): "
        "ranks 0,2 are in all_reduce #12 at train.py:41; rank 1 is in broadcast #12 at train.py:41",
    }


def _sized(entry: dict[str, Any], shape: list[int], seq: int = 12) -> dict[str, Any]:
    for c in entry["collectives"]:
        if c["seq"] == seq:
            c["in"] = c["out"] = [shape]
    return entry


def test_a_same_number_mismatch_is_named_at_once_whatever_the_progress_says() -> None:
    """Two ranks: neither is the majority, both are named, each with its place."""
    bcast = _rank(
        1,
        ("/home/me/train.py", 44, "broadcast"),
        [(11, "all_reduce", "completed"), (12, "broadcast", "scheduled")],
    )
    v = judged(
        [_waiting(0), bcast], Progress(False, "no hang: every rank progressed in the last 30 s")
    )
    assert v["ranks"] == [0, 1] and v["mismatch"] is True
    assert v["message"] == (
        "mismatch at #12 of process group default_pg (different collectives; they can never "
        "match): "
        "rank 0 is in all_reduce #12 at train.py:41; rank 1 is in broadcast #12 at train.py:44"
    )
    # Other tensor shapes in the same all_reduce (NCCL waits forever on them): named with the
    # shapes.
    v = judged(
        [
            _sized(_waiting(0), [4, 1024]),
            _sized(_waiting(1), [4, 1024]),
            _sized(_waiting(2), [1024]),
        ],
        Progress(False, "no hang"),
    )
    assert v["ranks"] == [2] and v["message"] == (
        "mismatch at #12 of process group default_pg (other tensor shapes; they can never match): "
        "ranks 0,1 are in all_reduce #12 of 4x1024 at train.py:41; rank 2 is in all_reduce #12 "
        "of 1024 at train.py:41"
    )


def test_ranks_at_different_numbers_or_shapes_that_may_differ_are_no_mismatch() -> None:
    healthy = Progress(False, "no hang: every rank progressed in the last 30 s")
    # Rank 1 is behind: its newest is a broadcast done, rank 0 waits in the next all_reduce.
    behind = _rank(
        1,
        ("/home/me/eval.py", 9, "evaluate"),
        [(10, "all_reduce", "completed"), (11, "broadcast", "completed")],
    )
    ahead = _rank(
        0,
        ("/home/me/train.py", 41, "all_reduce"),
        [(11, "broadcast", "completed"), (12, "all_reduce", "scheduled")],
    )
    assert mismatch([ahead, behind]) is None and judged([ahead, behind], healthy) == {
        "ranks": [],
        "message": healthy.message,
    }
    # NCCL's queue: rank 0 enqueued #12 and #13 ahead of rank 1, which is at #12 (same op there).
    queued = _rank(
        0,
        ("/home/me/train.py", 50, "step"),
        [(12, "all_reduce", "started"), (13, "broadcast", "scheduled")],
    )
    assert mismatch([queued, _waiting(1)]) is None
    # all_to_all's splits and gather's outputs differ between ranks as used; unknown shapes claim
    # nothing.
    assert (
        mismatch(
            [_sized(_waiting(0, op="all_to_all"), [8]), _sized(_waiting(1, op="all_to_all"), [16])]
        )
        is None
    )
    a, b = _waiting(0, op="gather"), _waiting(1, op="gather")
    a["collectives"][-1].update({"in": [[8]], "out": [[8], [8]]})
    b["collectives"][-1].update({"in": [[8]], "out": []})
    assert mismatch([a, b]) is None
    assert mismatch([_sized(_waiting(0), [8]), _waiting(1)]) is None
    # A number both ranks are done with is history, even if recorded apart (torch's coalescing).
    done = [
        _rank(r, ("/home/me/train.py", 41, "step"), [(12, op, "completed")])
        for r, op in ((0, "all_reduce"), (1, "_allreduce_coalesced"))
    ]
    assert mismatch(done) is None


def test_ranks_blocked_in_two_process_groups_each_waiting_for_the_other() -> None:
    def blocked(rank: int, wait: tuple[str, int], other: tuple[str, int]) -> dict[str, Any]:
        e = _rank(rank, ("/home/me/train.py", 60 + rank, "all_reduce"))
        e["collectives"] = [
            {"pg": other[0], "seq": other[1], "op": "all_reduce", "state": "completed"},
            {"pg": wait[0], "seq": wait[1] - 1, "op": "all_reduce", "state": "completed"},
            {"pg": wait[0], "seq": wait[1], "op": "all_reduce", "state": "scheduled"},
        ]
        return e

    v = mismatch([blocked(0, ("dp", 5), ("tp", 4)), blocked(1, ("tp", 5), ("dp", 4))])
    assert v == {
        "ranks": [0, 1],
        "mismatch": True,
        "message": "mismatch of process groups (each waits for the other): rank 0 is in "
        "all_reduce #5 of process group dp "
        "at train.py:60; rank 1 is in all_reduce #5 of process group tp at train.py:61",
    }
    # Rank 1 did dp #5 already (rank 0 only has to see it done): no deadlock.
    assert mismatch([blocked(0, ("dp", 5), ("tp", 4)), blocked(1, ("tp", 5), ("dp", 5))]) is None
    # As the Flight Recorder names them: two subgroups both called "undefined", told by number.
    def numbered(e: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
        for c in e["collectives"]:
            c["pg_id"], c["pg"] = ids[c["pg"]], "undefined"
        return e

    ids = {"dp": "1", "tp": "2"}
    v = mismatch(
        [
            numbered(blocked(0, ("dp", 5), ("tp", 4)), ids),
            numbered(blocked(1, ("tp", 5), ("dp", 4)), ids),
        ]
    )
    assert (
        v is not None
        and v["ranks"] == [0, 1]
        and "of process group undefined at train.py:60" in v["message"]
    )
    # Two subgroups at the same number in different ops are no mismatch: they are not one
    # collective.
    a = _rank(0, ("/home/me/train.py", 41, "all_reduce"), [(7, "all_reduce", "scheduled")])
    b = _rank(1, ("/home/me/train.py", 44, "broadcast"), [(7, "broadcast", "scheduled")])
    a["collectives"][0].update(pg="undefined", pg_id="1")
    b["collectives"][0].update(pg="undefined", pg_id="2")
    assert mismatch([a, b]) is None
    # A group rank 0 never used here may not hold it: nothing is claimed.
    lone = blocked(0, ("dp", 5), ("dp", 3))
    assert mismatch([lone, blocked(1, ("tp", 5), ("dp", 4))]) is None


def test_a_rank_without_collectives_is_judged_by_its_stack() -> None:
    # C code holds its GIL: faulthandler's stack only. Outside torch.distributed: the culprit.
    gil = _rank(1, ("/home/me/train.py", 27, "match"), note="Python could not run")
    assert verdict([_waiting(0), gil])["ranks"] == [1]
    # The same rank seen inside all_reduce is waiting like the others: nobody to blame.
    inside = _rank(1, ("/home/me/train.py", 41, "all_reduce"))
    assert verdict([_waiting(0), inside])["ranks"] == []


def test_silent_ranks_and_ranks_without_a_handler() -> None:
    silent = {"rank": 3, "node": 0, "pid": 9, "error": "did not answer within 3 s"}
    v = verdict([_waiting(0), _waiting(1), silent])
    assert v["ranks"] == [3] and "which did not answer" in v["message"]
    unhandled = {"rank": 3, "node": 0, "pid": 9, "error": "this rank has no stack handler"}
    assert verdict([_waiting(0), unhandled])["ranks"] == [3]  # the only rank not in all_reduce #12
    assert "rank 3 gave no stacks" in group_lines([unhandled])[0]
    assert ranges([7, 0, 2, 3, 4, 9]) == "0,2-4,7,9"


def test_faulthandler_text_reads_back_innermost_last_main_first(tmp_path: Path) -> None:
    started, done = threading.Event(), threading.Event()

    def parked() -> None:
        started.set()
        done.wait()

    other = threading.Thread(target=parked)
    other.start()
    started.wait()
    path = tmp_path / "dump.txt"
    try:
        with path.open("w") as f:
            faulthandler.dump_traceback(f, all_threads=True)
    finally:
        done.set()
        other.join()
    threads = parse_faulthandler(path.read_text(), threading.main_thread().ident)
    assert threads[0].name == "MainThread"
    assert (
        threads[0].frames[-1].function
        == "test_faulthandler_text_reads_back_innermost_last_main_first"
    )
    assert any(t.frames and t.frames[-1].function == "wait" for t in threads[1:])


def test_stall_events_pass_unchanged_when_no_rank_can_be_asked(tmp_path: Path) -> None:
    sent: list[Event] = []
    hang = HangCapture(tmp_path, sent.append, lambda: [{"rank": 0, "pid": 1}], timeout=0.5)
    stalled = Diagnosis(EventKind.STALLED, 0, "rank 0 made no progress for 31 s")
    hang.on_stall([stalled])
    hang.join(5)
    assert len(sent) == 1 and isinstance(sent[0], Diagnosis) and sent[0].t >= stalled.t
    assert sent == [replace(stalled, t=sent[0].t)]  # as it was, dated when said
    assert not (tmp_path / "stacks").exists()


def test_a_capture_that_fails_says_why_in_the_supervisor_log_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    sent: list[Event] = []
    asked: list[float] = []

    def ranks() -> list[dict[str, Any]]:
        asked.append(time.time())
        raise RuntimeError("run.json unreadable")

    hang = HangCapture(tmp_path, sent.append, ranks, timeout=0.5, retry_s=0.01, retries=3)
    stalled = Diagnosis(EventKind.STALLED, 0, "rank 0 made no progress for 31 s")
    hang.on_stall([stalled])
    deadline = time.monotonic() + 10
    while len(asked) < 4 and time.monotonic() < deadline:  # the capture and its 3 retries
        time.sleep(0.01)
    hang.join(5)
    assert len(asked) == 4
    # the stall still goes out, as it was (dated when said)
    assert len(sent) == 1 and sent == [replace(stalled, t=sent[0].t)]
    err = capfd.readouterr().err
    assert err.count("xl: the hang capture failed: RuntimeError('run.json unreadable')") == 1, err


def test_ranks_on_another_node_are_listed_with_where_to_ask_them(tmp_path: Path) -> None:
    doc = document(tmp_path, "run", [Target(2, "b", 5, 1, remote=True)], timeout=0.2)
    entry = doc.ranks[0].to_json()
    error = str(entry["error"])
    assert error.startswith("not asked: on node 1 (b)") and "'xl stacks RUN'" in error
    v = verdict([_waiting(0), _waiting(1), entry])
    assert v["ranks"] == [2] and v["message"].startswith(
        "ranks 0,1 wait in all_reduce #12 for rank 2, whose stacks are not known here (not "
        "asked: on node 1 (b)"
    )


def test_no_rank_in_a_collective_says_where_each_group_is() -> None:
    loaders = [_rank(r, ("/home/me/data.py", 30, "load")) for r in (0, 1, 2)]
    assert verdict(loaders) == {
        "ranks": [],
        "message": "no rank waits in a collective: ranks 0-2 are in load at data.py:30",
    }


def test_ranks_that_share_their_records_and_ranks_that_do_not_are_judged_alike() -> None:
    """The ranks at one place share their collectives' columns and are read once; ranks whose
    records all differ (each one's own side group) are judged as they would be alone."""
    late = _rank(1, ("/home/me/data.py", 30, "load"), [(11, "all_reduce", "completed")])
    shared = [_waiting(r) for r in (0, 2, 3)] + [late]

    def own(entry: dict[str, Any]) -> dict[str, Any]:
        side = {"pg": "side", "seq": 100 + entry["rank"], "op": "barrier", "state": "completed"}
        return {**entry, "collectives": [side, *entry["collectives"]]}

    said = (
        "rank 1 never entered all_reduce #12: it is in load at data.py:30. ranks 0,2,3 wait in "
        "all_reduce #12 for it"
    )
    assert verdict(shared)["message"] == said
    assert verdict([own(e) for e in shared])["message"] == said
    # A mismatch reads the same either way, and a rank's later record of one number is its own.
    clash = [_waiting(0), _waiting(2), _rank(1, ("/home/me/train.py", 41, "broadcast"),
             [(11, "all_reduce", "completed"), (12, "all_reduce", "completed"),
              (12, "broadcast", "scheduled")])]  # fmt: skip
    told = (
        "mismatch at #12 of process group default_pg (different collectives; they can never "
        "match): ranks 0,2 are in all_reduce #12 at train.py:41; rank 1 is in broadcast #12 at "
        "train.py:41"
    )
    assert verdict(clash) == {"ranks": [1], "mismatch": True, "message": told}
    assert verdict([own(e) for e in clash]) == {"ranks": [1], "mismatch": True, "message": told}
