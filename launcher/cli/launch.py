"""``xl launch [OPTIONS] [--] SCRIPT [ARGS...]`` (or ``-m MODULE``)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from xl import envnames
from xl.errors import UsageError
from xl.gpu.nvml import Inventory
from xl.gpu.nvml import inventory as _inventory
from xl.launcher.cli.options import (
    launch_parser,
    nproc_for,
    parse_command,
    spec_from_args,
)
from xl.launcher.cli.preflight import check_launch
from xl.launcher.cli.startchecks import check_python, check_rdzv_port
from xl.launcher.plan import HELD_PORT, Plan, build_plan
from xl.launcher.spec import LaunchSpec

if TYPE_CHECKING:
    import subprocess

    from xl.launcher.control import ForkedSupervisor

    # The process a launch started its supervisor as (xl.launcher.control.RunHandle's proc).
    Supervisor = subprocess.Popen[bytes] | ForkedSupervisor


def inventory(*, processes: bool = False) -> Inventory:
    """This machine's GPUs, read once per command (``processes``: who holds each one too, which
    the checks of a launch on GPUs ask; ``xl demo`` plans from the GPUs alone)."""
    return _inventory(processes=processes)


def with_interpreter(plan: Plan, spec: LaunchSpec, *, dry_run: bool = False) -> Plan:
    """Under --python, torchrun and the ranks find xl's stdlib-only rank code on PYTHONPATH
    (xl.launcher.cli.interpreter), whether or not that environment has xl."""
    if spec.python:
        from xl.launcher.cli.interpreter import ranks_pythonpath  # noqa: PLC0415 - only --python: not every launch's start

        existing = spec.env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
        plan.env["PYTHONPATH"] = ranks_pythonpath(existing, create=not dry_run)
    return plan


def say_warnings(plan: Plan) -> None:
    """What the plan found worth saying (the doctor's warnings that touch this run): stderr,
    before the monitor covers the screen."""
    for line in plan.warnings:
        sys.stderr.write(f"xl: warning: {line}\n")
    sys.stderr.flush()


def print_dry_run(plan: Plan, as_json: bool, spec: LaunchSpec | None = None) -> None:
    if as_json:
        print(json.dumps(plan.to_json(), indent=2))
        return
    print("# xl launch --dry-run: nothing was started. xl would run, in " + plan.cwd + ":")
    for key, value in plan.env.items():
        print(f"{key}={shlex.quote(value)} \\")
    print(shlex.join(plan.argv))
    if (
        "--master-port" in plan.argv
        and "--rdzv-backend" not in plan.argv
        and plan.argv[plan.argv.index("--master-port") + 1] == HELD_PORT
    ):
        print(
            "# --master-port 0: the supervisor holds a free loopback port for torchrun's store "
            "(run.json's argv names it)"
        )
    if spec is not None and spec.nnodes > 1:
        print(
            f"# xl node {spec.node_rank} of {spec.nnodes} (node 0 gathers every node); torch "
            "numbers nodes and global ranks in the order nodes join the c10d rendezvous"
        )
        if not os.environ.get(envnames.TOKEN):
            print(
                "# --rdzv-id: the real run's comes from the run's token (XL_TOKEN), which node 0 "
                "makes"
            )
    if plan.devices:
        for k, g in enumerate(plan.devices[: plan.nproc]):
            print(f"# LOCAL_RANK {k} -> GPU {g.index} {g.name} ({g.uuid})")
    else:
        print(f"# {plan.nproc} CPU rank(s) (gloo): no GPU chosen")
    print(
        "# each rank also gets XL_RUN_ID, XL_RUN_DIR, XL_COLLECTOR and XL_TOKEN from the supervisor"
    )


def run_foreground(
    run_dir: Path,
    proc: Supervisor | None,
    *,
    plain: bool | None,
    slurm_node: bool = False,
    lines: bool = True,
) -> int:
    """Watch a run this process started; Ctrl-C stops it (a second Ctrl-C leaves it stopping).

    ``slurm_node``: a task of an srun step, which Slurm ends with SIGINT, SIGTERM and, KillWait
    later, SIGKILL: every one of them stops the run and the task waits for it, so the step ends
    when the run has. ``lines=False`` shows events and the outcome only (nodes other than 0).
    """
    from xl.launcher.cli.console import watch  # noqa: PLC0415 - the run reader; --dry-run and --detach never watch
    from xl.launcher.control import abandon_if_supervisor_gone, stop_run  # noqa: PLC0415 - see launch()
    from xl.launcher.runprocs import give_way  # noqa: PLC0415 - as control

    stopping = False

    def on_sigint(_signum: int, _frame: FrameType | None) -> None:
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

    give_way()  # a view on a run gives way to the run's ranks, as its supervisor does
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
    # control loads psutil and the supervisor's stopping code (~50 ms) that --dry-run never needs.
    from xl.launcher.control import start_run  # noqa: PLC0415 - only a run that starts needs it

    handle = start_run(spec, plan, fork=True, run_id=run_id)
    if handle.cgroup_reason is not None:
        from xl.launcher.runcgroup import FALLBACK  # noqa: PLC0415 - as start_run

        sys.stderr.write(f"xl: no cgroup for this run ({handle.cgroup_reason}); {FALLBACK}\n")
    if detach:
        print(handle.run_id)
        sys.stderr.write(
            f"xl: started {handle.run_id} in the background; 'xl attach {handle.run_id}' to watch, "
            f"'xl stop {handle.run_id}' to stop\n"
        )
        return 0
    if viewer is not None:
        # The full-screen monitor covers what was printed before it: it shows the notice itself.
        code = (
            viewer(handle.run_dir, handle.proc, notice=notice)
            if notice
            else viewer(handle.run_dir, handle.proc)
        )
    else:
        # Under --slurm, node 0's view speaks for the run (it gathers every node); the other
        # nodes say only what happens to them.
        lines = not slurm_node or spec.node_rank == 0
        code = run_foreground(
            handle.run_dir, handle.proc, plain=plain, slurm_node=slurm_node, lines=lines
        )
    # The supervisor ends a moment after run.json says the run did: wait for it (bounded), so
    # nothing of the run outlives the command.
    deadline = time.monotonic() + 2.0
    while handle.proc is not None and handle.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    # The view holds nothing worth tearing down; skipping interpreter cleanup returns the
    # prompt sooner (it counts in the launch overhead bench).
    with contextlib.suppress(OSError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str], viewer: Viewer | None = None) -> int:
    parser = launch_parser()
    ns, script, module, args = parse_command(parser, argv, "xl launch train.py")
    if ns.json and not ns.dry_run:
        raise UsageError("--json only goes with --dry-run")
    if not (ns.slurm or ns.slurm_node):
        # Kubernetes: torchrun's options from PET_* when the command line leaves them out
        from xl.launcher.multinode.petenv import apply  # noqa: PLC0415 - a few variables read: not worth a module load on every import

        apply(ns, parser, os.environ)
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
    if spec.python:
        check_python(spec.python)
    # GPUs the Accelerate config chose are the config's mistake when they are wrong, not --gpus's.
    gpus_from = (
        "gpu_ids in the Accelerate config"
        if ns.accelerate_config is not None and ns.gpus is None
        else "--gpus"
    )
    # One inventory and one plan for the whole launch: the plan's GPUs, the checks of them (with
    # the processes that hold them) and the run's record all see the same moment.
    inv = inventory(processes=True)
    made_token = False
    if spec.nnodes > 1 and not ns.dry_run:
        # Node 0 makes the run's token before its plan: the rendezvous id derives from it.
        from xl.launcher.multinode.join import make_token  # noqa: PLC0415 - several nodes only: not a one-node launch's start

        made_token = make_token(spec, os.environ)
    plan = with_interpreter(
        build_plan(spec, inv, gpus_from=gpus_from, cpu_nproc=lambda: nproc_for(ns.nproc, 0)),
        spec,
        dry_run=ns.dry_run,
    )
    if ns.nproc == "auto" and spec.nproc is None and not plan.devices:
        # torchrun's --nproc-per-node auto on CPU: run.json's spec says how many
        spec.nproc = plan.nproc
    # torch without CUDA, busy or sick GPUs
    check_launch(spec, plan, inv, gpus_given=ns.gpus is not None)
    say_warnings(plan)
    if ns.dry_run:
        print_dry_run(plan, ns.json, spec)
        return 0
    check_rdzv_port(spec)
    join: str | None = None
    if spec.nnodes > 1:
        # Node 0 prints the command for the other nodes, with the run's token (stderr: stdout
        # stays the run id under --detach). Tasks of --slurm are all started already.
        from xl.launcher.multinode.join import prepare_launch  # noqa: PLC0415 - several nodes only: not a one-node launch's start

        join = prepare_launch(spec, os.environ, made=made_token)
        if join and not ns.slurm_node:
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
