"""`xl launch --slurm ...` (one srun step, one xl agent per node) and `xl sbatch ... > job.sh`.

The launcher holds no run of its own: the srun step is the run. Each task is a plain
`xl launch --slurm-node` on its node (node rank from its own SLURM_NODEID, rendezvous at the first
node), node 0's run is the one to watch, and the token every node shares travels in XL_TOKEN,
which srun's ``--export=ALL`` carries; it never appears on a command line.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import FrameType

from xl import envnames, paths
from xl.address import format_address
from xl.errors import UsageError
from xl.launcher.cli.options import (
    launch_parser,
    parse_command,
    spec_from_args,
)
from xl.launcher.multinode import slurm
from xl.launcher.plan import check_nproc, check_target, parse_rdzv
from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.runrecord import RunStatus
from xl.launcher.spec import LaunchSpec, spec_to_argv


def node_launch_argv(
    ns: argparse.Namespace,
    script: str | None,
    module: str | None,
    args: list[str],
    *,
    rdzv: str | None = None,
    no_tui: bool = False,
) -> list[str]:
    """The `xl launch` arguments each node's xl gets: the run as the person gave it.

    The Accelerate config is passed on, not read here: each node reads its own. The nodes, node
    ranks and (unless given, ``rdzv``) the rendezvous come from Slurm."""
    spec = replace(
        spec_from_args(ns, script, module, args, read_config=False),
        nnodes=1,
        node_rank=0,
        rdzv=rdzv,
    )
    options: list[str] = []
    if ns.accelerate_config is not None:
        # The bare flag means "the default config"; the = form keeps it from taking the script.
        options.append(
            f"--accelerate-config={ns.accelerate_config}"
            if ns.accelerate_config
            else "--accelerate-config"
        )
    if no_tui:
        options.append("--no-tui")
    return spec_to_argv(spec, options)


def _check_spec(
    ns: argparse.Namespace, script: str | None, module: str | None, args: list[str]
) -> None:
    """What can be checked before any node is asked: the target, --env pairs, --nproc."""
    spec = spec_from_args(ns, script, module, args)
    check_target(spec, spec.cwd or os.getcwd())
    check_nproc(spec.nproc)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _rdzv(alloc: slurm.Allocation, env: Mapping[str, str]) -> str:
    first = alloc.nodes[0]
    port = slurm.rdzv_port(alloc.job_id)
    if env.get("SLURMD_NODENAME") == first:
        # The batch script runs on the first node: there the ports (rendezvous, and node 0's
        # collector at port + 1) can be checked, and replaced.
        while not (_port_free(port) and _port_free(port + 1)):
            with socket.socket() as s:
                s.bind(("", 0))
                port = int(s.getsockname()[1])
    return format_address(slurm.node_address(first), port)


def _print_dry_run(
    argv: list[str],
    env: dict[str, str],
    alloc: slurm.Allocation,
    rdzv: str,
    run_id: str,
    as_json: bool,
) -> None:
    if as_json:
        print(json.dumps({"argv": argv, "env": slurm.redacted(env)}, indent=2))
        return
    print(
        f"# xl launch --slurm --dry-run: nothing was started. Inside job {alloc.job_id}, xl would "
        f"run, in {os.getcwd()}:"
    )
    for key, value in slurm.redacted(env).items():
        print(f"{key}={shlex.quote(value)} \\")
    print(shlex.join(argv))
    for k, node in enumerate(alloc.nodes):
        print(f"# node rank {k}: {node}" + (f" (rendezvous at {rdzv})" if k == 0 else ""))
    print(f"# node 0's run is {run_id}: 'xl attach {run_id}' there shows every rank")


def _stop_here(run_id: str) -> bool:
    """`xl stop` node 0's run when it runs on this machine (the batch script's node): its
    supervisor stops every rank and tells the other nodes, as for any xl run."""
    from xl.launcher.control import stop_run  # noqa: PLC0415 - psutil and the stopping code, for a Ctrl-C only

    run_dir = paths.runs_dir() / run_id
    rec = record.load(run_dir)
    if rec is None or rec.status != RunStatus.RUNNING or rec.host != socket.gethostname():
        return False
    stop_run(run_dir)
    return True


def _run_srun(argv: list[str], env: dict[str, str], job_id: str, name: str, run_id: str) -> int:
    """srun as a child in its own session, so Ctrl-C reaches only xl, which stops the run.

    srun's own Ctrl-C handling SIGKILLs the tasks at once (with or without --quit-on-interrupt),
    which leaves every node's run without its ending. xl stops node 0's run instead, as
    `xl stop` does, when it runs here; else it sends the step SIGINT (`scancel --signal=INT`),
    which every process of the step gets: each node's xl stops its run and the step ends when
    they have (a rank may then be reported as failed by its own KeyboardInterrupt). Again:
    `scancel STEP` (SIGTERM, SIGKILL after KillWait). Once more: srun is killed.
    """
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    sent: list[str] = []

    def escalate(signum: int, _frame: FrameType | None) -> None:
        signame = signal.Signals(signum).name
        if not sent:
            sent.append("INT")
            sys.stderr.write(
                f"\nxl: stopping the run on every node ({signame} again cancels step {name} at "
                "once)\n"
            )
            if _stop_here(run_id):
                return
            step = slurm.find_step(job_id, name)
            if not (step and slurm.signal_step(step, "INT")):
                # Never srun's kill on a first signal: it would leave every node's run without its
                # end.
                sys.stderr.write(
                    f"xl: step {name} not found in squeue (yet); {signame} again ends srun\n"
                )
            return
        step = slurm.find_step(job_id, name) if len(sent) <= 1 else None
        if step and slurm.signal_step(step, None):
            sent.append("cancel")
            return
        sent.append("kill")
        try:
            proc.kill()
        except ProcessLookupError:
            pass

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, escalate) for s in handled}
    try:
        # No timeout: the step is the training run itself; it ends when the run does.
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if "kill" in sent:
        return 130
    return 0 if code == 0 else 1


def launch_slurm(
    ns: argparse.Namespace, script: str | None, module: str | None, args: list[str]
) -> int:
    """`xl launch --slurm`: check, then run (or print) the srun step over the allocation.

    The view is node 0's, streamed through srun (see the module docstring)."""
    if ns.detach:
        raise UsageError(
            "--detach does not go with --slurm: the srun step is the run; for a run that outlives "
            "this shell use `xl sbatch`"
        )
    if ns.node_rank is not None:
        raise UsageError(
            "--node-rank does not go with --slurm: each node takes its rank from Slurm"
        )
    if ns.rdzv:
        parse_rdzv(ns.rdzv)
    alloc = slurm.allocation_from_env()
    if alloc is None:
        raise UsageError(slurm.NOT_IN_ALLOCATION)
    if ns.nnodes is not None and ns.nnodes != alloc.nnodes:
        raise UsageError(
            f"--nnodes {ns.nnodes}: this allocation has {alloc.nnodes} node(s) ({alloc.nodelist}); "
            "drop --nnodes (xl uses every node) or allocate the number you want"
        )
    _check_spec(ns, script, module, args)
    # The store lists runs with psutil (~50 ms): `xl sbatch` and bad input never need it.
    from xl.launcher.rundir.store import new_run_id  # noqa: PLC0415 - only a --slurm run names one

    rdzv = ns.rdzv or _rdzv(alloc, os.environ)
    run_id = new_run_id(LaunchSpec(script=script, module=module, name=ns.name))
    task = slurm.node_argv(alloc, rdzv, run_id, node_launch_argv(ns, script, module, args))
    name = slurm.step_name(run_id)
    argv = slurm.srun_argv(alloc, task, name)
    xl_env = {envnames.TOKEN: secrets.token_hex(16)}
    if ns.dry_run:
        _print_dry_run(argv, xl_env, alloc, rdzv, run_id, ns.json)
        return 0
    if shutil.which("srun") is None:
        raise UsageError(
            "srun is not on PATH: run this on a node of the Slurm allocation (salloc/sbatch)"
        )
    sys.stderr.write(
        f"xl: srun on {alloc.nnodes} node(s) {alloc.nodelist} of job {alloc.job_id}, rendezvous "
        f"at {rdzv}; node 0's run is {run_id} ('xl attach {run_id}' on {alloc.nodes[0]})\n"
    )
    sys.stderr.flush()
    return _run_srun(argv, {**os.environ, **xl_env}, alloc.job_id, name, run_id)


# ------------------------------------------------------------------------------------ xl sbatch
def _sbatch_parser() -> argparse.ArgumentParser:
    p = launch_parser("xl sbatch", sbatch=True)
    p.usage = "xl sbatch [SBATCH OPTIONS] [XL LAUNCH OPTIONS] [--] SCRIPT [ARGS...] > job.sh"
    p.epilog = (
        "torchrun's spellings of the launch options work too (--nproc-per-node, "
        "--rdzv-endpoint, ...)."
    )
    p.description = (
        "Print a Slurm batch script that runs `xl launch --slurm` over the allocation: one xl "
        "agent per node, rendezvous on the first node. Submit it with `sbatch job.sh`."
    )
    g = p.add_argument_group("sbatch options (become #SBATCH lines)")
    g.add_argument("-N", "--nodes", type=int, default=1, help="number of nodes (default 1)")
    g.add_argument("--gpus-per-node", type=int, metavar="G", help="GPUs on each node")
    g.add_argument(
        "-c",
        "--cpus-per-task",
        type=int,
        metavar="C",
        help="CPUs on each node (one xl task per node)",
    )
    g.add_argument("--mem", help="memory on each node, e.g. 200G (0 = all)")
    g.add_argument("-t", "--time", help="time limit, e.g. 04:00:00")
    g.add_argument("-p", "--partition", help="partition")
    g.add_argument("-A", "--account", help="account to charge")
    g.add_argument("-J", "--job-name", help="job name")
    g.add_argument("-o", "--output", help="the job's output file, e.g. xl-%%j.out")
    g.add_argument("--exclusive", action="store_true", help="whole nodes only")
    g.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="OPT",
        help="any other sbatch option, as written (repeatable), e.g. --sbatch=--qos=high",
    )
    return p


def _no_newline(name: str, value: object) -> None:
    if isinstance(value, str) and ("\n" in value or "\r" in value):
        raise UsageError(f"{name} must be one line")


# `xl launch` options a batch script cannot take, and what to do instead (not "did you mean
# --sbatch").
_NOT_TAKEN = {
    "--detach": "a batch job runs detached already; submit the script with `sbatch job.sh`",
    "--dry-run": "xl sbatch only prints the batch script; nothing starts until `sbatch job.sh`",
    "--json":
        "xl sbatch prints the batch script; `xl launch --slurm --dry-run --json` inside the job "
        "shows its command"
    ,
    "--slurm": "the batch script runs `xl launch --slurm` itself; drop it",
    "--node-rank": "Slurm gives each node its rank; drop it",
    "--node_rank": "Slurm gives each node its rank; drop it",
}


def sbatch_main(argv: Sequence[str]) -> int:
    parser = _sbatch_parser()
    ns, script, module, args = parse_command(
        parser, argv, "xl sbatch --nodes 2 train.py > job.sh", _NOT_TAKEN
    )
    if ns.nodes < 1:
        raise UsageError(f"--nodes must be at least 1 (got {ns.nodes})")
    for name in ("gpus_per_node", "cpus_per_task"):
        value = getattr(ns, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1 (got {value})")
    for name, value in vars(ns).items():
        _no_newline(f"--{name.replace('_', '-')}", value)
    for name in ("mem", "time", "partition", "account", "job_name", "output"):
        value = getattr(ns, name)
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise UsageError(
                f"--{name.replace('_', '-')} {value!r}: an #SBATCH value cannot be empty or hold "
                "spaces"
            )
    for extra in ns.sbatch:
        _no_newline("--sbatch", extra)
        if not extra.startswith("-"):
            raise UsageError(
                f"--sbatch {extra!r}: give an sbatch option as written, e.g. --sbatch=--qos=high"
            )
    slurm.check_batch_values(ns.time, ns.mem)
    if ns.rdzv:
        parse_rdzv(ns.rdzv)
    _check_spec(ns, script, module, args)
    spec = spec_from_args(ns, script, module, args)
    slurm.check_gpus_fit(spec.gpus, spec.nproc, ns.gpus_per_node)
    if ns.gpus_per_node is None and not any(
        "gpu" in extra.lower() or "gres" in extra.lower() for extra in ns.sbatch
    ):
        sys.stderr.write(
            "xl sbatch: warning: no --gpus-per-node: the job requests no GPUs and Slurm will give "
            "it none (a CPU run); add e.g. --gpus-per-node 8\n"
        )
    if ns.gpus_per_node is not None and ns.cpus_per_task is None:
        sys.stderr.write(
            f"xl sbatch: warning: --gpus-per-node {ns.gpus_per_node} without -c/--cpus-per-task: "
            "many clusters give the one task per node 1 CPU for every rank and data loader; add "
            "e.g. -c 64\n"
        )
    if any("\n" in a or "\r" in a for a in [str(script or module), *args]):
        raise UsageError("the script and its arguments must be one line each in a batch script")
    batch = slurm.BatchOptions(
        nodes=ns.nodes,
        gpus_per_node=ns.gpus_per_node,
        cpus_per_task=ns.cpus_per_task,
        mem=ns.mem,
        time=ns.time,
        partition=ns.partition,
        account=ns.account,
        job_name=ns.job_name,
        output=ns.output,
        exclusive=ns.exclusive,
        extra=tuple(ns.sbatch),
    )
    launch = node_launch_argv(ns, script, module, args, rdzv=ns.rdzv or None, no_tui=ns.no_tui)
    sys.stdout.write(slurm.batch_script(batch, launch, os.getcwd()))
    return 0
