"""``xl stop RUN``: SIGTERM to every rank, SIGKILL after the grace period; waits until it ended."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from xl.errors import ArgumentParser
from xl.launcher.control import grace_for, stop_run, wait_for_end
from xl.launcher.rundir import record
from xl.launcher.rundir.record import RunStatus
from xl.launcher.rundir.store import resolve_run

_STOPPED_WAIT_S = 15.0  # beyond the grace: the supervisor's own ending (events, run.json, torchrun)


def main(argv: Sequence[str]) -> int:
    p = ArgumentParser(prog="xl stop", description="Stop a run: every rank ends, none is left behind.")
    p.add_argument("run", metavar="RUN", help="run id, unique prefix, or 'last'")
    ns = p.parse_args(list(argv))
    run_dir = resolve_run(ns.run)
    rec = record.load(run_dir)
    if rec is None or rec.status != RunStatus.RUNNING:
        print(f"{run_dir.name} already {rec.status if rec else 'ended'}")
        return 0
    stop_run(run_dir)
    rec = wait_for_end(run_dir, grace_for(rec) + _STOPPED_WAIT_S) or rec
    if not rec.final:
        sys.stderr.write(f"xl stop: {run_dir.name} is still stopping; see 'xl runs'\n")
        return 1
    print(f"{run_dir.name} {rec.status}")
    return 0
