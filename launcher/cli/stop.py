"""``xl stop RUN``: SIGTERM to every rank, SIGKILL after the grace period; waits until it ended."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from xl.errors import ArgumentParser
from xl.launcher.control import grace_from_env, read_run, resolve_run, stop_run, wait_for_end


def main(argv: Sequence[str]) -> int:
    p = ArgumentParser(prog="xl stop", description="Stop a run: every rank ends, none is left behind.")
    p.add_argument("run", metavar="RUN", help="run id, unique prefix, or 'last'")
    ns = p.parse_args(list(argv))
    run_dir = resolve_run(ns.run)
    run = read_run(run_dir)
    if run.get("status") != "running":
        print(f"{run_dir.name} already {run.get('status', 'ended')}")
        return 0
    stop_run(run_dir)
    grace = float(run.get("grace_s") or grace_from_env())
    run = wait_for_end(run_dir, grace + 15.0)
    status = run.get("status")
    if status == "running":
        sys.stderr.write(f"xl stop: {run_dir.name} is still stopping; see 'xl runs'\n")
        return 1
    print(f"{run_dir.name} {status}")
    return 0
