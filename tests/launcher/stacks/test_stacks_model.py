"""The stacks document read into values and written back: the same bytes, and damaged values
read as absent rather than trusted."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

from xl.launcher.rank.stacks import answer
from xl.launcher.stacks.ask import parse_answer
from xl.launcher.stacks.model import RankStacks, StacksDoc, Target, targets
from xl.launcher.stacks.verdict import verdict

TORCH = "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def _document() -> dict[str, Any]:
    """A document with every key a capture writes: a rank that answered on its socket (a
    collective with its group's number, shapes and start), one that answered through faulthandler
    (a note), one that kept quiet, another node's rank (``node_rank``) and a stalled run's
    ``cpu_pct``; the verdict of a mismatch."""
    frames = [
        {"file": "/home/me/train.py", "line": 41, "function": "main"},
        {"file": TORCH, "line": 3252, "function": "all_reduce"},
    ]
    return {
        "run_id": "20261207-094200-ab12",
        "t": 1765100520.125,
        "ranks": [
            {
                "rank": 0,
                "node": "node-a",
                "pid": 4100,
                "threads": [
                    {"name": "MainThread", "frames": frames},
                    {"name": "xl-sender", "frames": []},
                ],
                "collectives": [
                    {"pg": "default_pg", "seq": 11, "op": "all_reduce", "state": "completed",
                     "pg_id": "0", "in": [[4, 1024]], "out": [[4, 1024]], "t": 1765100500.5},
                    {"pg": "default_pg", "seq": 12, "op": "all_reduce", "state": "scheduled",
                     "pg_id": "0", "in": [[4, 1024]], "out": [[4, 1024]], "t": 1765100501.25},
                ],
                "cpu_pct": 0.4,
            },
            {
                "rank": 1,
                "node": "node-a",
                "pid": 4101,
                "threads": [{"name": "MainThread", "frames": frames[:1]}],
                "collectives": [],
                "note": "Python could not run in this rank (C code holds the GIL): stacks from "
                "faulthandler, no collectives",
                "cpu_pct": 99.5,
            },
            {"rank": 2, "node": "node-a", "pid": 4102, "error": "did not answer within 3 s"},
            {
                "rank": 3,
                "node": "node-b",
                "pid": 7,
                "threads": [{"name": "MainThread", "frames": frames}],
                "collectives": [
                    {"pg": "default_pg", "seq": 12, "op": "broadcast", "state": "scheduled",
                     "pg_id": "0"},
                ],
                "node_rank": 1,
                "cpu_pct": 0.2,
            },
        ],
        "verdict": {
            "ranks": [0, 3],
            "mismatch": True,
            "message": "mismatch at #12 of process group default_pg (different collectives; they "
            "can never match): rank 0 is in all_reduce #12 at train.py:41; rank 3 is in broadcast "
            "#12 at train.py:41",
        },
    }  # fmt: skip


def test_a_document_read_and_written_back_is_the_same_bytes() -> None:
    doc = _document()
    for indent in (None, 1):  # the saved file, and `xl stacks --json`
        again = StacksDoc.from_json(json.loads(json.dumps(doc))).to_json()
        assert json.dumps(again, indent=indent) == json.dumps(doc, indent=indent)
    # The verdict the values give is the one written.
    read = StacksDoc.from_json(doc)
    assert verdict(read.ranks).to_json() == doc["verdict"]


def test_a_rank_s_own_answer_reads_back_as_it_was_sent() -> None:
    sent = json.loads(json.dumps(answer()))
    got = parse_answer(sent)
    assert got is not None
    assert [t.to_json() for t in got.threads] == sent["threads"]
    assert [c.to_json() for c in got.collectives] == sent["collectives"]
    assert got.note == sent.get("collectives_note")
    assert parse_answer(["not", "an", "answer"]) is None


def test_damaged_values_read_as_absent_and_claim_nothing() -> None:
    """A number that is text, a bool or not finite is no number: the verdict does not use it."""
    waiting = {
        "rank": 0,
        "threads": [{"name": "MainThread", "frames": [{"file": TORCH, "line": 1,
                                                       "function": "all_reduce"}]}],
        "collectives": [{"pg": "0", "seq": 12, "op": "all_reduce", "state": "scheduled"}],
    }  # fmt: skip
    odd = {
        **waiting,
        "rank": 1,
        "collectives": [{"pg": "0", "seq": "12", "op": "broadcast", "state": "scheduled"}],
        "cpu_pct": "99",
        "node_rank": True,
    }
    read = RankStacks.from_json(odd)
    assert read.collectives[0].seq is None and read.cpu_pct is None and read.node_rank is None
    # With its number unreadable, rank 1's broadcast is no mismatch with rank 0's all_reduce.
    assert not verdict([RankStacks.from_json(waiting), read]).mismatch
    # The same broadcast with its number: a mismatch, named.
    fine = RankStacks.from_json({**odd, "collectives": [{**odd["collectives"][0], "seq": 12}]})
    assert verdict([RankStacks.from_json(waiting), fine]).mismatch


def test_the_roster_reads_as_targets_whatever_its_shape() -> None:
    class Info:  # telemetry's roster rank: ``node`` is its host
        rank, node, pid, node_rank, remote = 5, "node-c", 9, 2, True

    row = {"rank": 5, "node": "node-c", "pid": 9, "node_rank": 2, "remote": True}
    want = Target(5, "node-c", 9, 2, remote=True)
    assert targets([row, Info(), want]) == [want, want, want]
    # A row of this node's rank (no ``remote``) is asked here.
    assert targets([{"rank": 0, "pid": 1}]) == [Target(0, None, 1)]


def test_threads_read_from_json_are_the_values_made_from_their_parts() -> None:
    """A rank's threads are read with their frames made when first asked for: they equal, print
    and write back as the values made at once, and stay frozen; a damaged frame reads as before."""
    from xl.launcher.stacks.model import Frame, Thread  # noqa: PLC0415

    doc = _document()
    entry = RankStacks.from_json(doc["ranks"][0])
    made = Thread(
        "MainThread",
        (Frame("/home/me/train.py", 41, "main"), Frame(TORCH, 3252, "all_reduce")),
    )
    assert entry.threads is not None
    assert entry.threads[0] == made and hash(entry.threads[0]) == hash(made)
    assert repr(entry.threads[0]) == repr(made)
    assert entry.threads[1] == Thread("xl-sender", ())
    assert entry.main_frames == made.frames
    assert copy.deepcopy(entry) == entry and pickle.loads(pickle.dumps(entry)) == entry
    try:
        entry.threads[0].name = "other"  # type: ignore[misc]
    except AttributeError:
        pass
    else:
        raise AssertionError("a thread's name was changed")
    odd = RankStacks.from_json(
        {"rank": 4, "threads": [
            {"name": "MainThread", "frames": [{"file": 3, "line": "7", "function": None}, 5]},
            {"name": 9, "frames": "none"},
        ]}
    )  # fmt: skip
    assert odd.threads == (
        Thread("MainThread", (Frame("3", None, "None"),)),
        Thread("9", ()),
    )


def test_a_rank_s_collectives_read_as_the_entries_it_sent() -> None:
    """Kept as columns, a rank's collectives still read entry by entry: by index, from the end,
    by slice and in order, equal to (and hashed as) the values made from their parts, frozen,
    and copied or pickled as themselves."""
    from xl.launcher.stacks.collectives import Collective, Collectives  # noqa: PLC0415

    entry = RankStacks.from_json(_document()["ranks"][0])
    shapes = ((4, 1024),)
    made = (
        Collective("default_pg", 11, "all_reduce", "completed", "0", shapes, shapes, 1765100500.5),
        Collective("default_pg", 12, "all_reduce", "scheduled", "0", shapes, shapes, 1765100501.25),
    )
    got = entry.collectives
    assert len(got) == 2 and tuple(got) == made and got == made and hash(got) == hash(made)
    assert got[0] == made[0] and got[-1] == made[1] and not got[-1].done and got[0].done
    assert got[1:] == made[1:] and Collectives(made) == got
    assert got.t == (1765100500.5, 1765100501.25)
    assert copy.deepcopy(got) == got and pickle.loads(pickle.dumps(got)) == got
    try:
        got.t = ()  # type: ignore[misc]
    except AttributeError:
        pass
    else:
        raise AssertionError("a rank's collectives were changed")
    # A rank with none, and one whose entries are not all dicts: only the dicts are entries.
    assert len(RankStacks.from_json({"rank": 5, "threads": []}).collectives) == 0
    odd = RankStacks.from_json({"rank": 6, "collectives": [7, {"pg": 1, "seq": 3}]})
    assert tuple(odd.collectives) == (Collective("1", 3, "None", "None"),)


def _fr_entry(rank: int, ranks: int) -> dict[str, Any]:
    """A rank of a job in all-reduce #12 with its Flight Recorder's 8 newest entries (each rank's
    start times its own), rank 1 behind in its own code."""
    sizes = [[1024, 1024]]
    first = 4 if rank == 1 else 5
    return {
        "rank": rank, "node": f"node-{rank // 8}", "pid": 4000 + rank,
        "threads": [{"name": "MainThread", "frames": [
            {"file": "/work/train.py", "line": 44 if rank == 1 else 61, "function": "step"},
            *([] if rank == 1 else [{"file": TORCH, "line": 2806, "function": "all_reduce"}]),
        ]}],
        "collectives": [
            {"pg": "default_pg", "seq": s, "op": "allreduce",
             "state": "scheduled" if s == 12 else "completed", "pg_id": "0", "in": sizes,
             "out": sizes, "t": 1765100000.0 + s + rank / ranks}
            for s in range(first, first + 8)
        ],
    }  # fmt: skip


def test_many_ranks_keep_few_objects_for_the_garbage_collector() -> None:
    """A document of many ranks, each with its Flight Recorder's entries, is read keeping three
    objects a rank that the garbage collector tracks (its entry, its threads and its
    collectives), not one per collective: the collector's full passes run by that count, over
    everything json.loads made, and made reading 4,096 ranks cost more than judging the dicts.
    The verdict read from them is the one the ranks' places give."""
    import gc  # noqa: PLC0415

    ranks = 512
    sent = {"run_id": "r", "t": 1.0, "ranks": [_fr_entry(r, ranks) for r in range(ranks)]}
    doc = json.loads(json.dumps(sent))
    gc.collect()
    before = len(gc.get_objects())
    read = StacksDoc.from_json(doc)
    gc.collect()
    kept = len(gc.get_objects()) - before
    assert kept <= 3 * ranks + 64, f"{kept} objects tracked for {ranks} ranks"
    assert read.to_json() == {**doc, "verdict": read.verdict.to_json()}
    said = verdict(read.ranks)
    assert said.ranks == (1,), said
    assert said.message.startswith(
        "rank 1 never entered allreduce #12: it is in step at train.py:44"
    )
    # Every rank's start times are its own, though the ranks share the rest.
    assert {e.collectives[-1].t for e in read.ranks} == {
        1765100000.0 + (11 if r == 1 else 12) + r / ranks for r in range(ranks)
    }
