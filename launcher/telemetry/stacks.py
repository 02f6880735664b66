"""Every rank at once: the stacks document (DESIGN.md, ``stacks/<unix-seconds>.json``).

Ranks are asked in parallel, each under the same deadline, so eight ranks cost what the slowest
one costs and a rank that does not answer never holds up the others. Ranks of other nodes
(``remote``) are listed with the command that asks them on their own node.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from xl.atomic import write_json_atomic
from xl.launcher.rundir import record
from xl.launcher.rundir.record import RunStatus
from xl.launcher.telemetry.probe import probe
from xl.launcher.telemetry.verdict import verdict

TIMEOUT_S = 3.0  # "a few seconds": the socket door, then faulthandler's signal door
STACKS_DIR = "stacks"
NOT_ASKED = "not asked: on"  # the start of the error of a rank that lives on another node


def local_entries(run_dir: Path, ranks: list[dict[str, Any]], timeout: float = TIMEOUT_S) -> list[dict[str, Any]]:
    """Stacks of the ranks running on this node (``ranks``: run.json's rank records)."""
    if not ranks:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(ranks)), thread_name_prefix="xl-stacks") as pool:
        return list(pool.map(lambda info: probe(run_dir, info, timeout), ranks))


def document(
    run_dir: Path,
    run_id: str,
    ranks: list[dict[str, Any]],
    *,
    timeout: float = TIMEOUT_S,
) -> dict[str, Any]:
    """The whole document: every rank's entry, sorted by rank, and the verdict."""
    t = time.time()
    elsewhere = [r for r in ranks if r.get("remote")]
    entries = local_entries(run_dir, [r for r in ranks if not r.get("remote")], timeout)
    entries += [not_asked(info) for info in elsewhere]
    entries.sort(key=lambda e: e["rank"] if isinstance(e.get("rank"), int) else -1)
    return {"run_id": run_id, "t": round(t, 3), "ranks": entries, "verdict": verdict(entries)}


def not_asked(info: dict[str, Any]) -> dict[str, Any]:
    """A rank of another node: its stacks are asked on that node (its own run dir and `xl stacks`)."""
    node = info.get("node_rank")
    where = f"node {node}" + (f" ({info['node']})" if info.get("node") else "")
    error = f"{NOT_ASKED} {where}: ask it there ('xl runs' names the run, 'xl stacks RUN' asks its ranks)"
    return {"rank": info.get("rank"), "node": info.get("node"), "pid": info.get("pid"), "error": error}


def save(run_dir: Path, doc: dict[str, Any]) -> str:
    """Write ``doc`` to ``stacks/<unix-seconds>.json``; returns that path relative to the run dir."""
    name = f"{STACKS_DIR}/{int(doc['t'])}.json"
    path = run_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, doc)
    return name


class NotRunning(Exception):
    """The run has no live rank to ask on this node; ``str()`` is the one line to show."""


def live_ranks(rec: record.RunRecord) -> list[dict[str, Any]]:
    """run.json's ranks still running on this node (another node's pid means nothing here)."""
    here = rec.get("node_rank") or 0
    return [
        r
        for r in rec.ranks
        if isinstance(r.get("rank"), int) and r.get("exit_code") is None and (r.get("node_rank") or 0) == here
    ]


def run_document(run_dir: Path, rank: int | None = None, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """Ask the run's live ranks (or just ``rank``) now: what ``xl stacks`` and the Monitor show."""
    rec = record.load(run_dir)
    if rec is None or rec.status != RunStatus.RUNNING:
        status = rec.status if rec else "unreadable"
        raise NotRunning(f"run {run_dir.name} is not running ({status}): no stacks to ask for; 'xl logs {run_dir.name}' shows its output")
    here = rec.get("node_rank") or 0
    ranks = live_ranks(rec) + [
        {**r, "remote": True}
        for r in rec.ranks
        if isinstance(r.get("rank"), int) and r.get("exit_code") is None and (r.get("node_rank") or 0) != here
    ]
    if rank is not None:
        ranks = [r for r in ranks if r["rank"] == rank]
        if not ranks:
            raise NotRunning(f"rank {rank} of run {run_dir.name} is not running on this node")
    if not ranks:
        raise NotRunning(f"run {run_dir.name} has no live rank on this node yet")
    return document(run_dir, rec.run_id, ranks, timeout=timeout)
