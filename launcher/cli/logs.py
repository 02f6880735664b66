"""``xl logs RUN [--rank R] [-f]``: a run's per-rank output (never interleaved mid-line)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from xl.errors import ArgumentParser, UsageError
from xl.launcher import runprocs
from xl.launcher.rundir import record
from xl.launcher.rundir.layout import RunLayout, log_rank
from xl.launcher.rundir.store import resolve_run
from xl.launcher.rundir.tail import RankLogs, Tail
from xl.textsafe import bytes_for_terminal


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
            known = ", ".join(map(str, ranks)) or "none yet"
            raise UsageError(f"run {run_dir.name} has no rank {ns.rank} (ranks: {known})")
        ranks = [ns.rank]
    prefix = ns.rank is None and len(ranks) > 1
    # Bytes, in large reads and writes: a 100 MB log (or one 100 MB line) costs a few MiB here.
    layout = RunLayout(run_dir)
    logs = RankLogs(layout.logs, prefix=prefix, ranks=ranks if ns.rank is not None else None)
    logs.tails.update(
        {r: Tail(layout.rank_log(r), stream=True) for r in ranks if r not in logs.tails}
    )
    # a terminal sees control characters drawn, a pipe the bytes
    out = bytes_for_terminal(sys.stdout.buffer)
    while True:
        rec = record.load(run_dir)
        # A run whose run.json is damaged is over once no process carries its id.
        done = rec.final if rec is not None else not runprocs.find_run_pids(run_dir.name)
        logs.discover()
        if not ns.follow or done:
            logs.copy(out.write, drain=True)
            break
        # Following: a round of every rank at a time, so one chatty rank cannot hold back the
        # others.
        if not logs.copy(out.write):
            out.flush()
            time.sleep(0.2)
    logs.finish(out.write)  # a last line without its newline yet
    out.flush()
    return 0
