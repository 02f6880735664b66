"""``xl launch [OPTIONS] [--] SCRIPT [ARGS...]`` (or ``-m MODULE``).

Parses the command line and, for a one-node run, forks the supervisor at once; the rest
(xl.launcher.cli.runstart) loads after that fork.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from xl.errors import UsageError
from xl.launcher.cli.options import launch_parser, parse_command, spec_from_args
from xl.launcher.forked import fork_early_supervisor

if TYPE_CHECKING:
    from xl.launcher.cli.runstart import Viewer


def main(argv: Sequence[str], viewer: Viewer | None = None) -> int:
    parser = launch_parser()
    ns, script, module, args = parse_command(parser, argv, "xl launch train.py")
    if ns.json and not ns.dry_run:
        raise UsageError("--json only goes with --dry-run")
    if ns.slurm:
        from xl.launcher.cli.sbatch import launch_slurm  # noqa: PLC0415 - only `xl launch --slurm` submits a job: not every launch's start

        return launch_slurm(ns, script, module, args)
    run_id = None
    if ns.slurm_node:
        from xl.launcher.multinode.slurm import node_rank_from_env  # noqa: PLC0415 - only a Slurm task reads its node: not every launch's start

        ns.node_rank = node_rank_from_env()
        if ns.run_id:
            run_id = ns.run_id if ns.node_rank == 0 else f"{ns.run_id}-node{ns.node_rank}"
    elif ns.run_id:
        raise UsageError("--run-id is for the tasks `xl launch --slurm` starts")
    spec = spec_from_args(ns, script, module, args)
    early = None
    if not (ns.dry_run or ns.slurm_node or spec.nnodes != 1):
        # One node: the supervisor, and torchrun's interpreter with it, start now, while the rest
        # of the command loads and plans (xl.launcher.forked); they end unused if it stops first.
        early = fork_early_supervisor(spec)
    try:
        from xl.launcher.cli.runstart import plan_and_launch  # noqa: PLC0415 - after the early fork: its imports do not delay torchrun

        return plan_and_launch(ns, spec, viewer, run_id, early)
    finally:
        if early is not None:
            early.cancel()
