"""``xl launch [OPTIONS] [--] SCRIPT [ARGS...]`` (or ``-m MODULE``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from xl.errors import EXIT_USAGE, ArgumentParser, UsageError
from xl.launcher.plan import MIXED_PRECISION, Plan, build_plan, parse_env_pairs
from xl.launcher.spec import LaunchSpec

# Options that take a value; everything after the script (or -m MODULE) belongs to the script.
_VALUE_OPTS = {"--gpus", "--nproc", "--nnodes", "--node-rank", "--rdzv", "--mixed-precision", "--env", "--name", "--run-id"}
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def _parser(prog: str = "xl launch") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog,
        usage=f"{prog} [OPTIONS] [--] SCRIPT [ARGS...]  |  {prog} [OPTIONS] -m MODULE [ARGS...]",
        description="Launch a distributed PyTorch run on torchrun, supervised by xl. "
        "The run goes on when the terminal closes; 'xl attach RUN' reopens it.",
    )
    p.add_argument("--gpus", help="0,2 | GPU-<uuid>,... | all | auto:N (order = LOCAL_RANK order)")
    p.add_argument("--nproc", type=int, help="processes on this node (default: one per GPU, 1 on CPU)")
    p.add_argument("--nnodes", type=int, help="number of nodes (default 1)")
    p.add_argument("--node-rank", type=int, help="this node's rank (multi-node)")
    p.add_argument("--rdzv", metavar="HOST:PORT", help="node 0's address (multi-node)")
    p.add_argument("--mixed-precision", choices=MIXED_PRECISION, help="sets ACCELERATE_MIXED_PRECISION")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="extra variable (repeatable)")
    p.add_argument("--name", help="a name for the run")
    p.add_argument(
        "--accelerate-config",
        nargs="?",
        const="",
        metavar="PATH",
        help="take settings from an Accelerate config (default $HF_HOME/accelerate/default_config.yaml)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the command and variables; start nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: {\"argv\": [...], \"env\": {...}}")
    p.add_argument("--detach", action="store_true", help="start the run and return at once")
    p.add_argument("--no-tui", action="store_true", help="a plain live table instead of the monitor")
    p.add_argument(
        "--slurm",
        action="store_true",
        help="inside a Slurm allocation: one xl agent per node with srun, rendezvous on the first node",
    )
    # Internal, for the tasks `--slurm` starts: node rank from SLURM_NODEID, the run id chosen by
    # the launcher (node 0's run is RUN_ID, node k's RUN_ID-nodeK).
    p.add_argument("--slurm-node", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run-id", help=argparse.SUPPRESS)
    return p


def split_argv(
    argv: Sequence[str], value_opts: set[str] | frozenset[str] = frozenset()
) -> tuple[list[str], str | None, str | None, list[str]]:
    """(xl options, script, module, script args): xl's options stop at the script or -m MODULE.

    ``value_opts``: more options that take a value (`xl sbatch`'s)."""
    opts: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            rest = list(argv[i + 1 :])
            if not rest:
                raise UsageError("nothing to run after '--'; give a training script")
            return opts, rest[0], None, rest[1:]
        if tok in ("-m", "--module"):
            if i + 1 >= len(argv):
                raise UsageError("-m needs a module name (e.g. -m pkg.train)")
            return opts, None, argv[i + 1], list(argv[i + 2 :])
        if tok.startswith("-") and tok != "-":
            opts.append(tok)
            name = tok.split("=", 1)[0]
            if "=" not in tok and i + 1 < len(argv):
                nxt = argv[i + 1]
                if name in _VALUE_OPTS or name in value_opts or (name == "--accelerate-config" and nxt.endswith(_CONFIG_SUFFIXES)):
                    opts.append(nxt)
                    i += 1
            i += 1
            continue
        return opts, tok, None, list(argv[i + 1 :])
    return opts, None, None, []


def spec_from_args(ns: argparse.Namespace, script: str | None, module: str | None, args: list[str]) -> LaunchSpec:
    spec = LaunchSpec(script=script, module=module, args=args, cwd=os.getcwd())
    if ns.accelerate_config is not None:
        from xl.launcher.cli.accelconf import default_path, read_settings

        path = Path(ns.accelerate_config).expanduser() if ns.accelerate_config else default_path()
        acc = read_settings(path)
        # The config fills in; flags given beside it win.
        spec.gpus, spec.nproc, spec.mixed_precision = acc.gpus, acc.nproc, acc.mixed_precision
        spec.nnodes = acc.nnodes or 1
        spec.node_rank = acc.node_rank or 0
        spec.rdzv = acc.rdzv
    if ns.gpus is not None:
        spec.gpus = ns.gpus
    if ns.nproc is not None:
        spec.nproc = ns.nproc
    if ns.nnodes is not None:
        spec.nnodes = ns.nnodes
    if ns.node_rank is not None:
        spec.node_rank = ns.node_rank
    if ns.rdzv is not None:
        spec.rdzv = ns.rdzv
    if ns.mixed_precision is not None:
        spec.mixed_precision = ns.mixed_precision
    if spec.mixed_precision == "False":  # YAML 1.1 reads an unquoted `no` as false
        spec.mixed_precision = "no"
    spec.env = parse_env_pairs(ns.env)
    spec.name = ns.name
    return spec


def inventory() -> Any:
    from xl.gpu.nvml import inventory as _inventory

    return _inventory(processes=False)


def print_dry_run(plan: Plan, as_json: bool, spec: LaunchSpec | None = None) -> None:
    if as_json:
        print(json.dumps(plan.to_json(), indent=2))
        return
    print("# xl launch --dry-run: nothing was started. xl would run, in " + plan.cwd + ":")
    for key, value in plan.env.items():
        print(f"{key}={shlex.quote(value)} \\")
    print(shlex.join(plan.argv))
    if spec is not None and spec.nnodes > 1:
        print(
            f"# xl node {spec.node_rank} of {spec.nnodes} (node 0 gathers every node); torch numbers "
            "nodes and global ranks in the order nodes join the c10d rendezvous"
        )
        if not os.environ.get("XL_TOKEN"):
            print("# --rdzv-id: the real run's comes from the run's token (XL_TOKEN), which node 0 makes")
    if plan.devices:
        for k, g in enumerate(plan.devices[: plan.nproc]):
            print(f"# LOCAL_RANK {k} -> GPU {g.index} {g.name} ({g.uuid})")
    else:
        print(f"# {plan.nproc} CPU rank(s) (gloo): no GPU chosen")
    print("# each rank also gets XL_RUN_ID, XL_RUN_DIR, XL_COLLECTOR and XL_TOKEN from the supervisor")


def run_foreground(run_dir: Path, proc: Any, *, plain: bool | None, slurm_node: bool = False, lines: bool = True) -> int:
    """Watch a run this process started; Ctrl-C stops it (a second Ctrl-C leaves it stopping).

    ``slurm_node``: a task of an srun step, which Slurm ends with SIGINT, SIGTERM and, KillWait
    later, SIGKILL: every one of them stops the run and the task waits for it, so the step ends
    when the run has. ``lines=False`` shows events and the outcome only (nodes other than 0).
    """
    from xl.launcher.cli.view import watch
    from xl.launcher.control import abandon_if_supervisor_gone, stop_run

    stopping = False

    def on_sigint(_signum: int, _frame: Any) -> None:
        nonlocal stopping
        if stopping:
            if slurm_node:
                return
            raise KeyboardInterrupt
        stopping = True
        how = "" if slurm_node else " (Ctrl-C again leaves it stopping in the background)"
        sys.stderr.write(f"\nxl: stopping {run_dir.name}{how}\n")
        stop_run(run_dir)

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if slurm_node else (signal.SIGINT,)
    previous = {s: signal.signal(s, on_sigint) for s in signals}
    checked = [time.monotonic()]

    def on_tick() -> None:
        # Reap the supervisor; if it vanished without finishing the run, clean up after it.
        if proc is not None and proc.poll() is not None and time.monotonic() - checked[0] > 0.5:
            checked[0] = time.monotonic()
            abandon_if_supervisor_gone(run_dir, exited=True)

    try:
        return watch(run_dir, plain=plain, on_tick=on_tick, lines=lines)
    except KeyboardInterrupt:
        sys.stderr.write(f"xl: left {run_dir.name} stopping; 'xl runs' shows its status\n")
        return 130
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# Opens a view on a run this process started: (run_dir, supervisor process, notice=) -> exit
# code; ``notice`` is what the person must still do (node 0's command for the other nodes).
# The Textual monitor is passed in from outside (xl.tui.commands) because xl.launcher never
# imports the UI.
Viewer = Callable[..., int]


def launch(
    spec: LaunchSpec,
    *,
    detach: bool,
    plain: bool | None,
    plan: Plan | None = None,
    viewer: Viewer | None = None,
    run_id: str | None = None,
    slurm_node: bool = False,
    notice: str | None = None,
) -> int:
    from xl.launcher.control import start_run

    handle = start_run(spec, plan, fork=True, run_id=run_id)
    if detach:
        print(handle.run_id)
        sys.stderr.write(
            f"xl: started {handle.run_id} in the background; 'xl attach {handle.run_id}' to watch, "
            f"'xl stop {handle.run_id}' to stop\n"
        )
        return 0
    if viewer is not None:
        # The full-screen monitor covers what was printed before it: it shows the notice itself.
        code = viewer(handle.run_dir, handle.proc, notice=notice) if notice else viewer(handle.run_dir, handle.proc)
    else:
        # Under --slurm, node 0's view speaks for the run (it gathers every node); the other
        # nodes say only what happens to them.
        lines = not slurm_node or spec.node_rank == 0
        code = run_foreground(handle.run_dir, handle.proc, plain=plain, slurm_node=slurm_node, lines=lines)
    # The view holds nothing worth tearing down; skipping interpreter cleanup returns the
    # prompt sooner (it counts in the launch overhead bench).
    with contextlib.suppress(OSError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str], viewer: Viewer | None = None) -> int:
    opts, script, module, args = split_argv(argv)
    ns = _parser().parse_args(opts)
    if script is None and module is None:
        sys.stderr.write("xl launch: give a training script (xl launch train.py) or -m MODULE (see 'xl launch --help')\n")
        return EXIT_USAGE
    if ns.json and not ns.dry_run:
        raise UsageError("--json only goes with --dry-run")
    if ns.slurm:
        from xl.launcher.cli.sbatch import launch_slurm

        return launch_slurm(ns, script, module, args)
    run_id = None
    if ns.slurm_node:
        from xl.launcher.cli.sbatch import node_rank_from_env

        ns.node_rank = node_rank_from_env()
        if ns.run_id:
            run_id = ns.run_id if ns.node_rank == 0 else f"{ns.run_id}-node{ns.node_rank}"
    elif ns.run_id:
        raise UsageError("--run-id is for the tasks `xl launch --slurm` starts")
    spec = spec_from_args(ns, script, module, args)
    inv = inventory()
    plan = build_plan(spec, inv)
    if ns.dry_run:
        print_dry_run(plan, ns.json, spec)
        return 0
    join: str | None = None
    if spec.nnodes > 1:
        from xl.launcher.multinode.nodelink import prepare_launch

        # Node 0 prints the command for the other nodes, with the run's token (stderr: stdout
        # stays the run id under --detach). Tasks of --slurm are all started already.
        join = prepare_launch(spec, os.environ)
        # Node 0 may just have made the token, which the rendezvous id derives from.
        plan = build_plan(spec, inv)
        if join and not getattr(ns, "slurm_node", False):
            sys.stderr.write(join)
            sys.stderr.flush()
    # A terminal gets the Textual monitor (the viewer) unless --no-tui; --no-tui on a terminal
    # gets the Rich live table; anything else plain lines.
    return launch(
        spec,
        detach=ns.detach,
        plain=None,
        plan=plan,
        viewer=None if ns.no_tui else viewer,
        run_id=run_id,
        slurm_node=ns.slurm_node,
        notice=join.strip() if spec.nnodes > 1 and join and not ns.slurm_node else None,
    )
