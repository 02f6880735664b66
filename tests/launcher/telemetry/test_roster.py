"""The roster from the supervisor into telemetry: run.json's rank rows made RankInfo once, and
which of them this node samples."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from xl.launcher.telemetry.roster import RankInfo, Roster, from_rows

ROWS = [
    {"rank": 0, "local_rank": 0, "node": "a1", "node_rank": 0, "pid": 101, "gpu": 0,
     "state": "running", "exit_code": None},
    {"rank": 1, "local_rank": 1, "node": "a1", "node_rank": 0, "pid": 102, "gpu": "GPU-5e1f",
     "state": "failed", "exit_code": 1},
]  # fmt: skip


def _collector(**peers: int) -> Any:
    """A collector whose ranks sent frames with these pids (rank name -> pid)."""
    return SimpleNamespace(
        peers={int(rank[1:]): SimpleNamespace(pid=pid) for rank, pid in peers.items()}
    )


def test_rows_become_rank_infos_and_an_ended_rank_is_not_sampled() -> None:
    ranks = from_rows(ROWS)
    assert ranks == [
        RankInfo(0, pid=101, local_rank=0, node="a1", node_rank=0, gpu=0),
        RankInfo(1, pid=102, local_rank=1, node="a1", node_rank=0, gpu="GPU-5e1f", ended=True),
    ]
    roster = Roster()
    roster.set(ranks)
    assert [r.rank for r in roster.local(None, multinode=False)] == [0]


def test_odd_rows_are_read_as_far_as_they_go() -> None:
    """A row with no rank number names no rank; a GPU given as digits is its index."""
    odd: list[dict[str, object]] = [{"rank": "3", "pid": 7}, {"rank": 4, "gpu": "2", "pid": True}]
    assert from_rows(odd) == [RankInfo(4, gpu=2)]


def test_other_nodes_ranks_are_asked_in_a_hang_but_never_sampled_here() -> None:
    roster = Roster()
    roster.set(from_rows(ROWS[:1]) + from_rows([{"rank": 8, "node": "b7", "pid": 55}], remote=True))
    assert [r.rank for r in roster.local(None, multinode=True)] == [0]
    assert roster.remote() == [RankInfo(8, pid=55, node="b7", remote=True)]
    assert roster.remote()[0].row()["remote"] is True


def test_a_rank_not_reported_yet_is_sampled_from_the_pid_it_sent_on_one_node_only() -> None:
    roster = Roster()
    roster.set(from_rows(ROWS[:1]))
    collector = cast(Any, _collector(r0=101, r5=505))
    assert [(r.rank, r.pid) for r in roster.local(collector, multinode=False)] == [
        (0, 101),
        (5, 505),
    ]
    # On node 0 of several, a peer's pid may be another machine's: not sampled here.
    assert [r.rank for r in roster.local(collector, multinode=True)] == [0]
