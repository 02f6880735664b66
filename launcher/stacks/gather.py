"""Every rank at once: the stacks document (``stacks/<unix-seconds>.json``, docs/launch.md).

Ranks are asked in parallel, each under the same deadline, so eight ranks cost what the slowest
one costs and a rank that does not answer never holds up the others. Ranks of other nodes
(``remote``) are asked through node 0's socket (xl.launcher.stacks.nodes: its collector asks
each node over its link, and that node's supervisor asks its ranks), under the same deadline;
a node that does not answer in time has its ranks listed with an ``error`` saying where to ask.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from xl.atomic import write_json_atomic
from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.runrecord import RunStatus
from xl.launcher.stacks import nodes as nodestacks
from xl.launcher.stacks.ask import ask_rank
from xl.launcher.stacks.model import RankStacks, StacksDoc, Target
from xl.launcher.telemetry.stall import Progress, judge, judged, recent_cpu

TIMEOUT_S = 3.0  # "a few seconds": the rank's socket, then faulthandler's signal
NOT_ASKED = "not asked: on"  # the start of the error of a rank that lives on another node


def local_entries(
    run_dir: Path, ranks: Sequence[Target], timeout: float = TIMEOUT_S
) -> list[RankStacks]:
    """Stacks of the ranks running on this node."""
    if not ranks:
        return []
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - when asked only

    with ThreadPoolExecutor(
        max_workers=min(32, len(ranks)), thread_name_prefix="xl-stacks"
    ) as pool:
        return list(pool.map(lambda target: ask_rank(run_dir, target, timeout), ranks))


def gather(
    run_dir: Path, ranks: Sequence[Target], timeout: float = TIMEOUT_S
) -> tuple[float, list[RankStacks]]:
    """(when, every rank's entry sorted by rank): the ranks of this node and, through node 0's
    socket, the others'."""
    t = time.time()
    elsewhere = [r for r in ranks if r.remote]
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - when asked only

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="xl-stacks-nodes") as pool:
        only = elsewhere[0].rank if len(elsewhere) == 1 and len(ranks) == 1 else None
        far = pool.submit(nodestacks.ask, run_dir, only, timeout) if elsewhere else None
        entries = local_entries(run_dir, [r for r in ranks if not r.remote], timeout)
        answer = far.result() if far is not None else None
    entries += remote_entries(elsewhere, answer, timeout)
    entries.sort(key=lambda e: e.rank if e.rank is not None else -1)
    return t, entries


def rank_ids(ranks: Sequence[Target]) -> list[int]:
    return [r.rank for r in ranks if r.rank is not None]


def assemble(
    run_dir: Path, run_id: str, t: float, entries: Sequence[RankStacks], progress: Progress
) -> StacksDoc:
    """The document; its verdict names a culprit only when ``progress`` says the run is stalled.
    A stalled run's entries get each rank's recent CPU (``cpu_pct``), which tells a rank working
    from one waiting."""
    if progress.stalled:
        cpu = recent_cpu(run_dir, t)
        entries = [
            replace(e, cpu_pct=cpu[e.rank]) if e.rank in cpu and not e.error else e
            for e in entries
        ]
    return StacksDoc(run_id, round(t, 3), tuple(entries), judged(entries, progress))


def document(
    run_dir: Path, run_id: str, ranks: Sequence[Target], *, timeout: float = TIMEOUT_S
) -> StacksDoc:
    """The whole document: every rank's entry, sorted by rank, and the verdict, judged with the
    run's progress (xl.launcher.telemetry.stall) over ``ranks``."""
    t, entries = gather(run_dir, ranks, timeout)
    return assemble(run_dir, run_id, t, entries, judge(run_dir, rank_ids(ranks), entries, now=t))


def remote_entries(
    ranks: Sequence[Target], answer: nodestacks.NodesAnswer | None, timeout: float
) -> list[RankStacks]:
    """Other nodes' ranks from node 0's answer (None: no socket: they are not asked)."""
    if answer is None:
        return [not_asked(target) for target in ranks]
    got = {e.rank: e for e in answer.entries}
    out = []
    for target in ranks:
        entry = got.get(target.rank)
        if entry is not None:
            out.append(replace(entry, host=entry.host or target.host))
            continue
        node_rank = target.node_rank
        why = (
            f"did not answer within {timeout:g} s"
            if node_rank in answer.asked
            else "is not connected to node 0"
        )
        out.append(not_asked(target, f"node {node_rank} {why}"))
    return out


def not_asked(target: Target, why: str = "") -> RankStacks:
    """A rank of another node: its stacks are asked on that node (its own run dir and `xl
    stacks`)."""
    host = target.host
    where = f"node {target.node_rank}" + (f" ({host})" if host else "")
    return target.failed(
        f"{NOT_ASKED} {where}"
        + (f" ({why})" if why else "")
        + ": ask it there ('xl runs' names the run, 'xl stacks RUN' asks its ranks)"
    )


def save(run_dir: Path, doc: StacksDoc) -> str:
    """Write ``doc`` to ``stacks/<unix-seconds>.json``; returns that path relative to the run
    dir."""
    name = RunLayout(run_dir).stacks_capture(doc.t)
    path = run_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, doc.to_json())
    return name


class NotRunning(Exception):
    """The run has no live rank to ask on this node; ``str()`` is the one line to show."""


def live_ranks(rec: record.RunRecord) -> list[Target]:
    """run.json's ranks still running on this node (another node's pid means nothing here)."""
    return [t for t in _live(rec) if not t.remote]


def _live(rec: record.RunRecord) -> list[Target]:
    """run.json's ranks still running, those of other nodes ``remote``."""
    here = rec.node_rank
    return [
        Target(r.rank, r.host, r.pid, r.node_rank, remote=(r.node_rank or 0) != here)
        for r in rec.ranks
        if r.rank is not None and r.exit_code is None
    ]


def run_document(run_dir: Path, rank: int | None = None, timeout: float = TIMEOUT_S) -> StacksDoc:
    """Ask the run's live ranks now: what ``xl stacks`` and the Monitor show. ``rank`` keeps
    only that rank's entry in the document; the verdict is always the whole run's."""
    rec = record.load(run_dir)
    if rec is None or rec.status != RunStatus.RUNNING:
        status = rec.status if rec else "unreadable"
        raise NotRunning(
            f"run {run_dir.name} is not running ({status}): no stacks to ask for; "
            f"'xl logs {run_dir.name}' shows its output"
        )
    live = _live(rec)  # this node's first: the stable sort by rank keeps them first among equals
    ranks = [t for t in live if not t.remote] + [t for t in live if t.remote]
    if rank is not None and not any(r.rank == rank for r in ranks):
        raise NotRunning(f"rank {rank} of run {run_dir.name} is not running on this node")
    if not ranks:
        raise NotRunning(f"run {run_dir.name} has no live rank on this node yet")
    doc = document(run_dir, rec.run_id, ranks, timeout=timeout)
    if rank is not None:
        doc = replace(doc, ranks=tuple(e for e in doc.ranks if e.rank == rank))
    return doc
