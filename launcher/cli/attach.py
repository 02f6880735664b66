"""``xl attach RUN``: watch an existing run; leaving the view (Ctrl-C) leaves the run going."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from xl.errors import ArgumentParser
from xl.launcher.cli.console import watch
from xl.launcher.cli.logs import main as follow_logs
from xl.launcher.control import abandon_if_supervisor_gone
from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.store import list_runs, resolve_run


def _whole_run(run_dir: Path) -> Path:
    """`last` on a shared XL_HOME may be another node's part of a multi-node run (it started
    later): node 0's run of the same rendezvous is the whole view, so that one is shown."""
    rec = record.load(run_dir)
    if rec is None or rec.node_rank == 0 or rec.nnodes < 2:
        return run_dir
    rdzv = rec.rdzv
    started = rec.started_at or 0.0
    best: tuple[float, Path] | None = None
    for info in list_runs():
        other = record.load(info.run_dir)
        if other is None or other.node_rank != 0 or other.rdzv != rdzv:
            continue
        if other.nnodes != rec.nnodes or (other.ended_at is not None and other.ended_at < started):
            continue  # another run on the same address, over before this part began
        gap = abs((other.started_at or 0.0) - started)
        if best is None or gap < best[0]:
            best = (gap, info.run_dir)
    if best is None:
        return run_dir
    sys.stderr.write(
        f"xl: the last run, {run_dir.name}, is node {rec.node_rank}'s part; showing node 0's "
        f"{best[1].name}, the whole run ('xl attach {run_dir.name}' shows that part)\n"
    )
    return best[1]


def main(argv: Sequence[str], viewer: Callable[[Path], int] | None = None) -> int:
    p = ArgumentParser(prog="xl attach", description="Show a run live; exits with its outcome.")
    p.add_argument("run", metavar="RUN", help="run id, unique prefix, or 'last'")
    p.add_argument(
        "--no-tui", action="store_true", help="a plain live table instead of the monitor"
    )
    ns = p.parse_args(list(argv))
    run_dir = resolve_run(ns.run, "attach")
    if ns.run == "last":
        run_dir = _whole_run(run_dir)
    if record.load(run_dir) is None:
        # Nothing to show but its output: follow it until no process of the run is left.
        follow_logs([run_dir.name, "-f"])
        sys.stderr.write(
            f"xl: {run_dir.name}'s run.json is unreadable; its output is above ('xl stop "
            f"{run_dir.name}' ends it)\n"
        )
        return 1
    if viewer is not None and not ns.no_tui:
        abandon_if_supervisor_gone(run_dir)
        return viewer(run_dir)
    last = [time.monotonic()]

    def on_tick() -> None:
        # A supervisor killed outright cannot finish its run.json: notice and clean up.
        if time.monotonic() - last[0] > 1.0:
            last[0] = time.monotonic()
            abandon_if_supervisor_gone(run_dir)

    try:
        return watch(run_dir, on_tick=on_tick)
    except KeyboardInterrupt:
        sys.stderr.write(
            f"\nxl: detached; {run_dir.name} goes on ('xl stop {run_dir.name}' stops it)\n"
        )
        return 130
