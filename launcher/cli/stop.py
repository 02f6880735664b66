"""``xl stop RUN``: SIGTERM to every rank, SIGKILL after the grace period; waits until it ended."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from xl import paths
from xl.errors import ArgumentParser, NotYours, UsageError
from xl.launcher import runprocs
from xl.launcher.control import STOPPED_WAIT_S, grace_for, stop_run, stop_unreadable, wait_for_end
from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.runrecord import RunStatus
from xl.launcher.rundir.store import resolve_run


def main(argv: Sequence[str]) -> int:
    p = ArgumentParser(
        prog="xl stop", description="Stop a run: every rank ends, none is left behind."
    )
    p.add_argument("run", metavar="RUN", help="run id, unique prefix, or 'last'")
    ns = p.parse_args(list(argv))
    try:
        run_dir = resolve_run(ns.run, "stop")
    except NotYours:
        raise  # another user's run: nothing of it is ours to stop
    except UsageError:
        # A run whose folder was deleted still has processes carrying its id: end them.
        if not runprocs.find_run_pids(ns.run):
            raise
        stop_unreadable(paths.runs_dir() / ns.run)
        print(f"{ns.run} stopped (its run folder is gone)")
        return 0
    rec = record.load(run_dir)
    if rec is None:
        # Its run.json is damaged or gone: its processes are still found by the run's id.
        stop_unreadable(run_dir)
        rec = record.load(run_dir)  # its supervisor, if it had one, rewrote it as it ended
        print(
            f"{run_dir.name} {rec.status}"
            if rec is not None
            else f"{run_dir.name} stopped (its run.json is unreadable)"
        )
        return 0
    if rec.status != RunStatus.RUNNING:
        print(f"{run_dir.name} already {rec.status}")
        return 0
    stop_run(run_dir)
    rec = wait_for_end(run_dir, grace_for(rec) + STOPPED_WAIT_S) or rec
    if not rec.final:
        sys.stderr.write(f"xl stop: {run_dir.name} is still stopping; see 'xl runs'\n")
        return 1
    print(f"{run_dir.name} {rec.status}")
    return 0
