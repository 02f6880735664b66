"""A hang among 4,096 ranks: every stalled event is told with the verdict, each by its own entry.

The hang capture rewords each rank's ``stalled`` event with the capture's verdict (the culprit
says where it is, each victim what it waits in and for whom); at thousands of ranks it finds each
event's entry in an index of the capture instead of a scan of it per event (hang.py).
"""

from __future__ import annotations

from typing import Any

from xl.launcher.telemetry.hang import _by_rank, reword
from xl.launcher.telemetry.verdict import verdict

RANKS = 4096
CULPRIT = 1019
TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def _entry(rank: int) -> dict[str, Any]:
    if rank == CULPRIT:
        frames = [{"file": "/home/me/data.py", "line": 30, "function": "load"}]
        colls = [{"pg": "default_pg", "seq": 11, "op": "all_reduce", "state": "completed"}]
    else:
        frames = [
            {"file": "/home/me/train.py", "line": 41, "function": "main"},
            {"file": TORCH, "line": 3252, "function": "all_reduce"},
        ]
        colls = [
            {"pg": "default_pg", "seq": 11, "op": "all_reduce", "state": "completed"},
            {"pg": "default_pg", "seq": 12, "op": "all_reduce", "state": "scheduled"},
        ]
    return {
        "rank": rank,
        "node": rank // 8,
        "pid": 100 + rank,
        "threads": [{"name": "MainThread", "frames": frames}],
        "collectives": colls,
    }


def test_each_of_4096_stalled_events_is_reworded_from_its_own_rank_s_entry() -> None:
    entries = [_entry(r) for r in range(RANKS)]
    entries[7] = {"rank": 7, "node": 0, "error": "did not answer within 5 s"}
    doc = {"ranks": entries, "verdict": verdict(entries)}
    assert doc["verdict"]["ranks"] == [CULPRIT]
    events = [
        {
            "t": 1.0,
            "kind": "stalled",
            "rank": r,
            "message": f"rank {r} made no progress for 31 s",
            "idle_s": 31.0,
        }
        for r in range(RANKS)
    ]
    index = _by_rank(doc)
    told = [reword(e, doc, index) for e in events]
    # The same words as found by looking through the entries for each event.
    assert told == [reword(e, doc) for e in events]
    assert told[CULPRIT]["message"] == (
        f"rank {CULPRIT} made no progress for 31 s; it is in load at data.py:30"
    )
    assert told[0]["message"] == (
        f"rank 0 waits in all_reduce #12 for rank {CULPRIT} (no progress for 31 s)"
    )
    assert all(
        e.get("waiting_on") == [CULPRIT] for r, e in enumerate(told) if r not in (7, CULPRIT)
    )
    assert told[7] == events[7]  # a rank that did not answer: its event as it was
