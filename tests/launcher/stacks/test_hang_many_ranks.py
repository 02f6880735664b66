"""A hang among 4,096 ranks: every stalled event is told with the verdict, each by its own entry.

The hang capture rewords each rank's ``stalled`` event with the capture's verdict (the culprit
says where it is, each victim what it waits in and for whom); at thousands of ranks it finds each
event's entry in an index of the capture instead of a scan of it per event (hang.py), and the
verdict looks for two ranks blocked in each other's process groups through the groups, not by
every pair of ranks (verdict.py).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from eventlines import stall

from xl.launcher.stacks.hang import _by_rank, reword
from xl.launcher.stacks.model import RankStacks, StacksDoc
from xl.launcher.stacks.verdict import mismatch, position, verdict

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
    read = [RankStacks.from_json(e) for e in entries]
    doc = StacksDoc("run", 1.0, tuple(read), verdict(read))
    assert doc.verdict.ranks == (CULPRIT,)
    events = [
        stall(r, f"rank {r} made no progress for 31 s", 1.0, idle_s=31.0) for r in range(RANKS)
    ]
    index = _by_rank(doc)
    told = [reword(e, doc, index) for e in events]
    # The same words as found by looking through the entries for each event.
    assert told == [reword(e, doc) for e in events]
    assert told[CULPRIT].message == (
        f"rank {CULPRIT} made no progress for 31 s; it is in load at data.py:30"
    )
    assert told[0].message == (
        f"rank 0 waits in all_reduce #12 for rank {CULPRIT} (no progress for 31 s)"
    )
    assert all(
        e.extra.get("waiting_on") == [CULPRIT] for r, e in enumerate(told) if r not in (7, CULPRIT)
    )
    assert told[7] == events[7]  # a rank that did not answer: its event as it was


def _read(entries: list[dict[str, Any]]) -> list[RankStacks]:
    return [RankStacks.from_json(e) for e in entries]


def _blocked(rank: int, wait: tuple[str, int], done: dict[str, int]) -> dict[str, Any]:
    """A rank inside torch.distributed, waiting in ``wait`` (group, number), having done
    ``done`` (group -> its last number)."""
    colls = [
        {"pg": pg, "seq": seq, "op": "all_reduce", "state": "completed"} for pg, seq in done.items()
    ]
    colls.append({"pg": wait[0], "seq": wait[1], "op": "all_reduce", "state": "scheduled"})
    return {**_entry(rank), "collectives": colls}


def test_two_ranks_of_4096_blocked_in_each_other_s_groups_are_named_and_no_other() -> None:
    """4,094 ranks wait in the default group's all-reduce; ranks 1500 and 3500 each wait in a
    subgroup the other has not done: the deadlock between them is named."""
    entries = [_blocked(r, ("default_pg", 12), {"default_pg": 11}) for r in range(RANKS)]
    entries[1500] = _blocked(1500, ("dp", 5), {"default_pg": 11, "tp": 4})
    entries[3500] = _blocked(3500, ("tp", 5), {"default_pg": 11, "dp": 4})
    found = mismatch(_read(entries))
    assert found is not None and found.ranks == (1500, 3500)
    assert "rank 1500 is in all_reduce #5 of process group dp" in found.message
    # Rank 3500 did dp #5 already: no deadlock, and nobody else is one.
    entries[3500] = _blocked(3500, ("tp", 5), {"default_pg": 11, "dp": 5})
    assert mismatch(_read(entries)) is None


def _crossed_every_pair(entries: list[dict[str, Any]]) -> list[int] | None:
    """The rule, pair by pair in rank order: the first two ranks each blocked in a group the
    other uses, neither having done the other's collective."""
    groups = {e["rank"]: {c["pg"] for c in e["collectives"]} for e in entries}
    pos = {e["rank"]: position(RankStacks.from_json(e)) for e in entries}
    blocked = sorted((r, p.waiting) for r, p in pos.items() if p.waiting is not None)
    for i, (x, (pg_x, seq_x, _)) in enumerate(blocked):
        for y, (pg_y, seq_y, _) in blocked[i + 1 :]:
            if pg_x == pg_y or pg_y not in groups[x] or pg_x not in groups[y]:
                continue
            if pos[x].done.get(pg_y, -1) >= seq_y or pos[y].done.get(pg_x, -1) >= seq_x:
                continue
            return [x, y]
    return None


@pytest.mark.parametrize("seed", range(60))
def test_the_pair_named_is_the_first_pair_the_rule_finds(seed: int) -> None:
    rng = random.Random(seed)
    names = ["a", "b", "c", "d"][: rng.choice([2, 3, 4])]
    entries = []
    for r in range(rng.choice([2, 3, 6, 12, 40])):
        uses = rng.sample(names, rng.randint(1, len(names)))
        wait = rng.choice(uses)
        done = {g: rng.randint(3, 6) for g in uses if g != wait or rng.random() < 0.5}
        entries.append(_blocked(r, (wait, 6), done))
    found = mismatch(_read(entries))
    assert (list(found.ranks) if found is not None else None) == _crossed_every_pair(entries)
