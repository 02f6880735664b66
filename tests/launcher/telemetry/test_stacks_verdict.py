"""Who the others wait for, from stacks documents (pure), and faulthandler's text read back."""

from __future__ import annotations

import faulthandler
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from xl.launcher.telemetry.hang import HangCapture
from xl.launcher.telemetry.probe import parse_faulthandler
from xl.launcher.telemetry.stacks import document
from xl.launcher.telemetry.verdict import group_lines, ranges, verdict


def _rank(rank: int, where: tuple[str, int, str], colls: list[tuple[int, str, str]] | None = None, **extra: Any) -> dict[str, Any]:
    file, line, function = where
    frames = [{"file": "/home/me/train.py", "line": 90, "function": "<module>"}, {"file": file, "line": line, "function": function}]
    if function in ("all_reduce", "broadcast"):
        frames[-1] = {"file": "/home/me/train.py", "line": line, "function": "main"}
        frames.append({"file": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", "line": 3252, "function": function})
    collectives = [{"pg": "default_pg", "seq": s, "op": op, "state": st} for s, op, st in colls or []]
    return {"rank": rank, "node": 0, "pid": 100 + rank, "threads": [{"name": "MainThread", "frames": frames}], "collectives": collectives, **extra}


def _waiting(rank: int, seq: int = 12, op: str = "all_reduce") -> dict[str, Any]:
    return _rank(rank, ("/home/me/train.py", 41, op), [(seq - 1, "all_reduce", "completed"), (seq, op, "scheduled")])


def test_eight_ranks_read_as_one_line_and_the_one_missing_is_named() -> None:
    late = _rank(1, ("/home/me/data.py", 30, "load"), [(11, "all_reduce", "completed")])
    entries = [_waiting(r) for r in (0, 2, 3, 4, 5, 6, 7)] + [late]
    assert group_lines(entries) == ["ranks 0,2-7 wait in all_reduce #12 at train.py:41", "rank 1 is in load at data.py:30"]
    v = verdict(entries)
    assert v["ranks"] == [1]
    assert v["message"] == "rank 1 never entered all_reduce #12: it is in load at data.py:30. ranks 0,2-7 wait in all_reduce #12 for it"


def test_a_culprit_using_the_cpu_is_said_to_be_working_and_one_waiting_is_not() -> None:
    """A long evaluation on one rank stalls the others as a hang does: its CPU says which may be."""
    waiting = [_waiting(r, seq=21, op="barrier") for r in (1, 2)]
    evaluating = _rank(0, ("/home/me/train.py", 88, "evaluate"), [(20, "barrier", "completed")], cpu_pct=98.6)
    v = verdict([*waiting, evaluating])
    assert v["ranks"] == [0]
    assert v["message"] == (
        "rank 0 never entered barrier #21: it is in evaluate at train.py:88, working at 99% CPU "
        "(a long computation, or a loop that never ends). ranks 1,2 wait in barrier #21 for it"
    )
    # Blocked (a lock, a socket, a sleep): a few percent, and the verdict says no more than where.
    blocked = _rank(0, ("/home/me/data.py", 30, "load"), [(20, "barrier", "completed")], cpu_pct=2.0)
    assert verdict([*waiting, blocked])["message"] == "rank 0 never entered barrier #21: it is in load at data.py:30. ranks 1,2 wait in barrier #21 for it"
    # A figure that is no number (a damaged record) claims nothing.
    for odd in (float("nan"), True, "99"):
        assert "working" not in verdict([*waiting, {**evaluating, "cpu_pct": odd}])["message"]


def test_ranks_that_disagree_about_the_next_collective() -> None:
    v = verdict([_waiting(0), _waiting(2), _waiting(1, op="broadcast")])
    assert v["ranks"] == [1] and "rank 1 is in broadcast #12, not all_reduce #12" in v["message"]


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
    assert threads[0]["name"] == "MainThread"
    assert threads[0]["frames"][-1]["function"] == "test_faulthandler_text_reads_back_innermost_last_main_first"
    assert any(t["frames"] and t["frames"][-1]["function"] == "wait" for t in threads[1:])


def test_stall_events_pass_unchanged_when_no_rank_can_be_asked(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []
    hang = HangCapture(tmp_path, sent.append, lambda: [{"rank": 0, "pid": 1}], timeout=0.5)
    stalled = {"kind": "stalled", "rank": 0, "message": "rank 0 made no progress for 31 s"}
    hang.on_stall([stalled])
    hang.join(5)
    assert sent == [stalled] and not (tmp_path / "stacks").exists()


def test_a_capture_that_fails_says_why_in_the_supervisor_log_once(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    sent: list[dict[str, Any]] = []
    asked: list[float] = []

    def ranks() -> list[dict[str, Any]]:
        asked.append(time.time())
        raise RuntimeError("run.json unreadable")

    hang = HangCapture(tmp_path, sent.append, ranks, timeout=0.5, retry_s=0.01, retries=3)
    stalled = {"kind": "stalled", "rank": 0, "message": "rank 0 made no progress for 31 s"}
    hang.on_stall([stalled])
    deadline = time.monotonic() + 10
    while len(asked) < 4 and time.monotonic() < deadline:  # the capture and its 3 retries
        time.sleep(0.01)
    hang.join(5)
    assert len(asked) == 4
    assert sent == [stalled]  # the stall still goes out, as it was
    err = capfd.readouterr().err
    assert err.count("xl: the hang capture failed: RuntimeError('run.json unreadable')") == 1, err


def test_ranks_on_another_node_are_listed_with_where_to_ask_them(tmp_path: Path) -> None:
    doc = document(tmp_path, "run", [{"rank": 2, "node": "b", "node_rank": 1, "pid": 5, "remote": True}], timeout=0.2)
    assert doc["ranks"][0]["error"].startswith("not asked: on node 1 (b)") and "'xl stacks RUN'" in doc["ranks"][0]["error"]
    v = verdict([_waiting(0), _waiting(1), doc["ranks"][0]])
    assert v["ranks"] == [2] and v["message"].startswith("ranks 0,1 wait in all_reduce #12 for rank 2, whose stacks are not known here (not asked: on node 1 (b)")


def test_no_rank_in_a_collective_says_where_each_group_is() -> None:
    loaders = [_rank(r, ("/home/me/data.py", 30, "load")) for r in (0, 1, 2)]
    assert verdict(loaders) == {"ranks": [], "message": "no rank waits in a collective: ranks 0-2 are in load at data.py:30"}
