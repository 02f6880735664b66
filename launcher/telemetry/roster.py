"""The ranks telemetry samples and diagnoses, as the supervisor last reported them.

``RankInfo`` is the one roster type from the supervisor into telemetry: made from run.json's
rank rows (``RankInfo.from_row``: this node's ranks, and other nodes' as their links send them,
``remote``), read by the sampler, the diagnoser and the hang capture.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xl.launcher.rundir.rows import RankRow
    from xl.launcher.telemetry.collector import Collector


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _gpu(value: object) -> int | str | None:
    """The GPU the launcher assigned: its index, else its UUID."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return int(value) if value.isdigit() else value
    if isinstance(value, Mapping):
        index, uuid = value.get("index"), value.get("uuid")
        return _int(index) if _int(index) is not None else uuid if isinstance(uuid, str) else None
    return None


@dataclass(frozen=True, slots=True)
class RankInfo:
    """One rank: ``node`` is its host, ``gpu`` the GPU the launcher assigned (index or UUID),
    ``ended`` once its exit code is known, ``remote`` when it runs on another node."""

    rank: int
    pid: int | None = None
    local_rank: int | None = None
    node: str | None = None
    node_rank: int | None = None
    gpu: int | str | None = None
    ended: bool = False
    remote: bool = False

    # edge: run.json's rank rows, this node's and other nodes' (as their links send them)
    @classmethod
    def from_row(cls, row: Mapping[str, object], *, remote: bool = False) -> RankInfo | None:
        """The rank of one row; None for a row without a rank number."""
        rank = _int(row.get("rank"))
        if rank is None:
            return None
        node = row.get("node")
        return cls(
            rank,
            pid=_int(row.get("pid")),
            local_rank=_int(row.get("local_rank")),
            node=node if isinstance(node, str) else None,
            node_rank=_int(row.get("node_rank")),
            gpu=_gpu(row.get("gpu")),
            ended=row.get("exit_code") is not None,
            remote=remote or bool(row.get("remote")),
        )

    @classmethod
    def of(cls, row: RankRow, *, remote: bool = False) -> RankInfo | None:
        """The rank of one typed row (the supervisor's own, and other nodes' as their links
        sent them), as ``from_row`` reads it; None for a row without a rank number."""
        if row.rank is None:
            return None
        return cls(row.rank, pid=row.pid, local_rank=row.local_rank, node=row.host,
                   node_rank=row.node_rank, gpu=_gpu(row.gpu), ended=row.exit_code is not None,
                   remote=remote)

    def row(self) -> dict[str, object]:
        """As the stacks capture lists a rank to ask (run.json's keys)."""
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "node": self.node,
            "node_rank": self.node_rank,
            "pid": self.pid,
            "remote": self.remote,
        }


def from_rows(rows: Iterable[Mapping[str, object]], *, remote: bool = False) -> list[RankInfo]:
    """``RankInfo.from_row`` of each row that names a rank."""
    return [info for row in rows if (info := RankInfo.from_row(row, remote=remote)) is not None]


class Roster:
    """The ranks as the launcher last reported them (``set``, from the supervisor's thread), read
    by the sampler's and the hang capture's threads: each read is a list of its own."""

    def __init__(self) -> None:
        self._ranks: tuple[RankInfo, ...] = ()
        self._lock = threading.Lock()

    def set(self, ranks: Sequence[RankInfo]) -> None:
        with self._lock:
            self._ranks = tuple(ranks)

    def local(self, collector: Collector | None, multinode: bool) -> list[RankInfo]:
        """This node's live ranks, to sample."""
        with self._lock:
            ranks = list(self._ranks)
        known = {r.rank for r in ranks if r.pid is not None}
        # Ranks the launcher has not reported yet are still sampled from the pid they sent;
        # not on node 0 of a multi-node run, where a peer's pid may be another machine's.
        if collector is not None and not multinode:
            for rank, peer in list(collector.peers.items()):
                if rank not in known:
                    ranks = [r for r in ranks if r.rank != rank]
                    ranks.append(RankInfo(rank, pid=peer.pid))
        return [r for r in ranks if not r.ended and not r.remote]

    def remote(self) -> list[RankInfo]:
        """Other nodes' live ranks."""
        with self._lock:
            return [r for r in self._ranks if r.remote and not r.ended]
