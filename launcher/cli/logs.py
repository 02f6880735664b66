"""``xl logs RUN [--rank R] [-f]``: a run's per-rank output (never interleaved mid-line).

On node 0 of a multi-node run, another node's rank's output stays in that node's run dir: ``xl
logs RUN --rank R`` reads it through that node while the run lives (node 0's supervisor asks it
over its link, a piece at a time: xl.launcher.stacks.nodes); once the run is over, node 0
has the last lines the node sent as each rank exited.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from xl.errors import ArgumentParser, UsageError
from xl.launcher import runprocs
from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.layout import RunLayout, log_rank
from xl.launcher.rundir.store import resolve_run
from xl.launcher.rundir.tail import RankLogs, Tail
from xl.launcher.stacks.nodes import ask_logs
from xl.textsafe import bytes_for_terminal
from xl.units import ranges, ranks_text


def _ranks(run_dir: Path) -> list[int]:
    """The ranks run.json lists and those with a log (a rank logs before run.json has it)."""
    rec = record.load(run_dir)
    found = {r.rank for r in rec.ranks if r.rank is not None} if rec else set()
    try:
        names = os.listdir(RunLayout(run_dir).logs)
    except OSError:
        names = []
    found.update(r for r in map(log_rank, names) if r is not None)
    return sorted(found)


def _remote(run_dir: Path, rank: int) -> tuple[int, str] | None:
    """(its node, that node's host) when this is node 0's run dir and ``rank`` ran on another
    node; None otherwise."""
    rec = record.load(run_dir)
    if rec is None or rec.nnodes < 2 or rec.node_rank != 0:
        return None
    row = next((r for r in rec.ranks if r.rank == rank), None)
    if row is None or not row.node_rank:
        return None
    return row.node_rank, row.host or "?"


def _elsewhere(run_dir: Path) -> str | None:
    """On node 0 of a multi-node run, the one line that says which ranks' output stays on their
    own nodes and the command that reads one (``xl logs RUN`` shows only what node 0 holds);
    None on any other run dir."""
    rec = record.load(run_dir)
    if rec is None or rec.nnodes < 2 or rec.node_rank != 0:
        return None
    nodes: dict[int, tuple[str, list[int]]] = {}
    for row in rec.ranks:
        if row.rank is not None and row.node_rank:
            nodes.setdefault(row.node_rank, (row.host or "?", []))[1].append(row.rank)
    if not nodes:
        return None
    where = "; ".join(
        f"{ranks_text(ranks)} on node {node} ({host})"
        for node, (host, ranks) in sorted(nodes.items())
    )
    first = min(min(ranks) for _, ranks in nodes.values())
    layout = RunLayout(run_dir)
    kept = sorted(r for _, ranks in nodes.values() for r in ranks if _size(layout.rank_log(r)) > 0)
    held = (
        f" (node 0 kept only the last lines of {ranks_text(kept)}, as they exited)"
        if kept
        else " (none of it is here)"
    )
    there = "that node" if len(nodes) == 1 else "each one"
    return (
        f"xl logs: the output of {where} stays on {there}{held}; read one with: "
        f"xl logs {run_dir.name} --rank {first}"
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _fetch(run_dir: Path, rank: int, where: tuple[int, str], follow: bool) -> bool:
    """Another node's rank: its output through node 0's supervisor while the run lives (True:
    printed); else what node 0 kept of it (the last lines its node sent: False, printed as a local
    log); with neither, says where it is (UsageError)."""
    node, host = where
    out = bytes_for_terminal(sys.stdout.buffer)
    offset, fetched = 0, False
    while True:
        piece = ask_logs(run_dir, rank, node, offset)
        if piece is None:
            break
        data = str(piece["data"]).encode("utf-8", "surrogateescape")
        out.write(data)
        fetched = True
        offset = int(piece.get("offset") or 0) + len(data)
        if offset < int(piece.get("size") or 0):
            continue
        rec = record.load(run_dir)
        if not follow or rec is None or rec.final:
            break
        out.flush()
        time.sleep(0.5)
    out.flush()
    if fetched:
        return True
    if RunLayout(run_dir).rank_log(rank).exists():
        return False
    raise UsageError(
        f"rank {rank} ran on node {node} ({host}), which keeps its output, and node 0 cannot "
        f"ask it now; on node {node}, run: xl logs RUN --rank {rank} (its 'xl runs' names RUN)"
    )


def main(argv: Sequence[str]) -> int:
    p = ArgumentParser(
        prog="xl logs", description="Print a run's logs (all ranks, prefixed, or one)."
    )
    p.add_argument("run", metavar="RUN", help="run id, unique prefix, or 'last'")
    p.add_argument("--rank", type=int, help="only this rank's log, unprefixed")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    ns = p.parse_args(list(argv))
    run_dir = resolve_run(ns.run, "logs")
    ranks = _ranks(run_dir)
    if ns.rank is not None:
        if ns.rank not in ranks:
            known = ranges(ranks) or "none yet"
            raise UsageError(f"run {run_dir.name} has no rank {ns.rank} (ranks: {known})")
        ranks = [ns.rank]
    if ns.rank is not None:
        remote = _remote(run_dir, ns.rank)
        if remote is not None and _fetch(run_dir, ns.rank, remote, ns.follow):
            return 0
    prefix = ns.rank is None and len(ranks) > 1
    # Bytes, in large reads and writes: a 100 MB log (or one 100 MB line) costs a few MiB here.
    layout = RunLayout(run_dir)
    logs = RankLogs(layout.logs, prefix=prefix, ranks=ranks if ns.rank is not None else None)
    logs.tails.update(
        {r: Tail(layout.rank_log(r), stream=True) for r in ranks if r not in logs.tails}
    )
    # a terminal sees control characters drawn, a pipe the bytes
    out = bytes_for_terminal(sys.stdout.buffer)
    shown = 0

    def write(data: bytes) -> None:
        nonlocal shown
        shown += len(data)
        out.write(data)

    while True:
        rec = record.load(run_dir)
        # A run whose run.json is damaged is over once no process carries its id.
        done = rec.final if rec is not None else not runprocs.find_run_pids(run_dir.name)
        logs.discover()
        if not ns.follow or done:
            logs.copy(write, drain=True)
            break
        # Following: a round of every rank at a time, so one chatty rank cannot hold back the
        # others.
        if not logs.copy(write):
            out.flush()
            time.sleep(0.2)
    logs.finish(write)  # a last line without its newline yet
    out.flush()
    elsewhere = _elsewhere(run_dir) if ns.rank is None else None
    if elsewhere is None:
        return 0
    print(elsewhere, file=sys.stderr)
    return 0 if shown else 1  # nothing at all could be shown
