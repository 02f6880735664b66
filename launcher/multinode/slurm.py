"""Slurm: read an allocation from the environment and build the `srun` step that runs xl on it.

Pure where it can be: the nodelist parser, the allocation reader and the argv builders take the
environment and a command runner as arguments, so the tests feed them a fake allocation. The only
commands run are `scontrol show hostnames` / `scontrol show node` (with a timeout, and only when
`scontrol` exists; the parser and the node name are the fallbacks).

One step, one task per node: each task is `xl launch --slurm-node ...`, which reads its node rank
from its own SLURM_NODEID, so no shell and no quoting sit between srun and xl.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from xl import envnames
from xl.errors import UsageError

SCONTROL_TIMEOUT_S = 5.0
# Rendezvous ports derived from the job id land in [BASE, BASE + SPAN): two jobs sharing a node
# get different ports unless their ids are SPAN apart, and the range stays clear of torch's
# default 29500 and of the usual ephemeral range (32768+).
RDZV_PORT_BASE = 20000
RDZV_PORT_SPAN = 9000
NOT_IN_ALLOCATION = (
    "not inside a Slurm allocation: run it from salloc/sbatch, or use `xl sbatch` to write a batch "
    "script"
)
REDACTED = "<redacted>"

Runner = Callable[[Sequence[str]], "str | None"]


# ------------------------------------------------------------------------------------ nodelists
def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets: ``a[1,3],b`` -> ``["a[1,3]", "b"]``."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in nodelist {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in nodelist {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError(f"unbalanced '[' in nodelist {text!r}")
    parts.append("".join(cur))
    return parts


def _expand_range(body: str, whole: str) -> list[str]:
    """``01-03,07`` -> ``["01", "02", "03", "07"]``: a range keeps the zero padding of its start."""
    out: list[str] = []
    for item in body.split(","):
        lo, sep, hi = item.strip().partition("-")
        if not (lo.isascii() and lo.isdigit()) or (sep and not (hi.isascii() and hi.isdigit())):
            raise ValueError(f"bad range {item!r} in nodelist {whole!r}")
        if not sep:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"range {item!r} runs backwards in nodelist {whole!r}")
        width = len(lo) if lo.startswith("0") else 0
        out += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return out


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list -> host names, in order: ``node[01-03,07],gpu-a,rack1-[2-3]``.

    Several bracket groups in one name multiply (``r[1-2]n[1-2]`` -> r1n1, r1n2, r2n1, r2n2), as
    `scontrol show hostnames` does. ValueError on a malformed list.
    """
    hosts: list[str] = []
    for part in _split_top(text.strip()):
        part = part.strip()
        if not part:  # `a,,b`: scontrol skips the empty entry too
            continue
        names = [""]
        for literal, body in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", part):
            pieces = _expand_range(body, text) if body else [""]
            names = [n + literal + p for n in names for p in pieces]
        hosts += names
    return hosts


def _run(argv: Sequence[str]) -> str | None:
    """stdout of a short command, or None when it is missing, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def hostnames(nodelist: str, run: Runner = _run) -> list[str]:
    """The allocation's hosts: `scontrol show hostnames` when it answers, else xl's own parser."""
    out = run(["scontrol", "show", "hostnames", nodelist])
    if out is not None:
        names = out.split()
        if names:
            return names
    try:
        return expand_nodelist(nodelist)
    except ValueError as exc:
        raise UsageError(f"cannot read SLURM_JOB_NODELIST: {exc}") from None


def node_address(node: str, run: Runner = _run) -> str:
    """Where other nodes reach ``node``: Slurm's NodeAddr (what slurmd itself uses), else its
    name."""
    out = run(["scontrol", "show", "node", node, "--oneliner"])
    if out:
        match = re.search(r"(?:^|\s)NodeAddr=(\S+)", out)
        if match and match.group(1) not in ("(null)", ""):
            return match.group(1)
    return node


# ------------------------------------------------------------------------------------ allocation
@dataclass
class Allocation:
    job_id: str
    nodelist: str
    nodes: list[str]
    gpus_per_node: int | None = None
    cpus_per_node: int | None = None

    @property
    def nnodes(self) -> int:
        return len(self.nodes)


def _count(value: str | None) -> int | None:
    """``4``, ``a100:4``, ``gpu:a100:4`` -> 4; anything else -> None."""
    if not value:
        return None
    last = value.split(",")[0].rsplit(":", 1)[-1]
    last = last.split("(")[0]
    return int(last) if last.isascii() and last.isdigit() else None


def _min_cpus(value: str | None) -> int | None:
    """SLURM_JOB_CPUS_PER_NODE ``72(x2),36`` -> 36: the step asks every node for the least."""
    if not value:
        return None
    counts = [int(m) for m in re.findall(r"(\d+)(?:\(x\d+\))?", value)]
    return min(counts) if counts else None


def allocation_from_env(
    env: Mapping[str, str] | None = None, run: Runner = _run
) -> Allocation | None:
    """The Slurm allocation this process runs in, or None outside one."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job_id or not nodelist:
        return None
    nodes = hostnames(nodelist, run)
    expected = _count(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES"))
    if expected is not None and expected != len(nodes):
        raise UsageError(
            f"SLURM_JOB_NODELIST={nodelist!r} names {len(nodes)} node(s) but SLURM_JOB_NUM_NODES "
            f"says {expected}; is this shell's Slurm environment from another job?"
        )
    return Allocation(
        job_id=job_id,
        nodelist=nodelist,
        nodes=nodes,
        gpus_per_node=_count(env.get("SLURM_GPUS_ON_NODE"))
        or _count(env.get("SLURM_GPUS_PER_NODE")),
        cpus_per_node=_min_cpus(env.get("SLURM_JOB_CPUS_PER_NODE"))
        or _count(env.get("SLURM_CPUS_ON_NODE")),
    )


def node_rank_from_env(env: Mapping[str, str] | None = None) -> int:
    """`--slurm-node`: this task's node rank, as srun numbered it."""
    env = os.environ if env is None else env
    value = env.get("SLURM_NODEID", "")
    if not (value.isascii() and value.isdigit()):
        raise UsageError(
            "--slurm-node is for tasks srun starts (SLURM_NODEID is not set); use --slurm"
        )
    return int(value)


def rdzv_port(job_id: str) -> int:
    """The same port for every node of a job, derived from the job id (no node has to be asked)."""
    digits = re.sub(r"\D", "", job_id) or "0"
    return RDZV_PORT_BASE + int(digits) % RDZV_PORT_SPAN


# ------------------------------------------------------------------------------------ commands
def xl_command() -> list[str]:
    """This xl, by absolute path: the interpreter of the venv it runs from, then ``-m xl``."""
    return [os.path.abspath(sys.executable), "-m", "xl"]


def node_argv(
    alloc: Allocation,
    rdzv: str,
    run_id: str,
    launch_argv: Sequence[str],
    xl: Sequence[str] | None = None,
) -> list[str]:
    """What each srun task runs: one node's `xl launch`, its node rank from its own SLURM_NODEID.

    ``launch_argv``: the run's own `xl launch` arguments (xl.launcher.spec.spec_to_argv)."""
    return [
        *(xl or xl_command()),
        "launch",
        "--slurm-node",
        "--nnodes",
        str(alloc.nnodes),
        "--rdzv",
        rdzv,
        "--run-id",
        run_id,
        "--no-tui",
        *launch_argv,
    ]


def step_name(run_id: str) -> str:
    """The srun step's name: how `xl launch --slurm` finds its step again to signal it."""
    return f"xl-{run_id}"


def srun_argv(alloc: Allocation, task: Sequence[str], name: str, srun: str = "srun") -> list[str]:
    """One step over the whole allocation, one task per node, each task given the whole node."""
    n = alloc.nnodes
    argv = [
        srun,
        f"--nodes={n}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        # Never Slurm's kill (explicit, to override a cluster's default): a node whose xl exits 1
        # has told node 0 already, and xl's node link ends the run on every node; killing the
        # step would take node 0's supervisor with it while it records the failure.
        "--kill-on-bad-exit=0",
        # torchrun starts the ranks; binding the one task to a core would pin them all to it.
        "--cpu-bind=none",
        # XL_TOKEN and the caller's variables (PATH, XL_HOME, venv) reach every node.
        "--export=ALL",
        # All the job's memory on each node (a step's default share may be a sliver of it).
        "--mem=0",
        f"--job-name={name}",
    ]
    if alloc.cpus_per_node:
        argv.append(f"--cpus-per-task={alloc.cpus_per_node}")
    if alloc.gpus_per_node:
        argv.append(f"--gpus-per-node={alloc.gpus_per_node}")
    return [*argv, *task]


def find_step(job_id: str, name: str, run: Runner = _run) -> str | None:
    """``JOB.STEP`` of the running step called ``name`` in job ``job_id``, if squeue shows it."""
    out = run(["squeue", "--steps", "--noheader", f"--jobs={job_id}", "--format=%i %j"])
    for line in (out or "").splitlines():
        step, _, step_name_ = line.strip().partition(" ")
        if step_name_.strip() == name and step.startswith(f"{job_id}."):
            return step
    return None


def signal_step(step: str, sig: str | None, run: Runner = _run) -> bool:
    """`scancel --signal=SIG STEP` (the signal only: the step ends when its tasks do), or with
    ``sig`` None `scancel STEP` (Slurm's termination: SIGTERM, then SIGKILL after KillWait)."""
    argv = ["scancel", *([f"--signal={sig}"] if sig else []), step]
    return run(argv) is not None


def redacted(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if k == envnames.TOKEN else v) for k, v in env.items()}


# ------------------------------------------------------------------------------------ sbatch
@dataclass
class BatchOptions:
    nodes: int = 1
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    job_name: str | None = None
    output: str | None = None
    exclusive: bool = False
    extra: tuple[str, ...] = ()


def batch_script(
    opts: BatchOptions, launch_argv: Sequence[str], cwd: str, xl: Sequence[str] | None = None
) -> str:
    """A complete sbatch script whose one command is `xl launch --slurm ...`."""
    lines = ["#!/bin/bash", f"#SBATCH --nodes={opts.nodes}", "#SBATCH --ntasks-per-node=1"]
    if opts.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={opts.gpus_per_node}")
    if opts.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={opts.cpus_per_task}")
    for flag, value in (
        ("mem", opts.mem),
        ("time", opts.time),
        ("partition", opts.partition),
        ("account", opts.account),
        ("job-name", opts.job_name),
        ("output", opts.output),
    ):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    if opts.exclusive:
        lines.append("#SBATCH --exclusive")
    lines += [f"#SBATCH {extra}" for extra in opts.extra]
    lines += [
        "",
        "# Written by `xl sbatch`. xl starts one agent per node with srun, rendezvous on the first",
        "# node; `xl attach` on the first node's run (or this job's output) shows every rank.",
        "set -euo pipefail",
        f"cd {shlex.quote(cwd)}",
        "exec " + shlex.join([*(xl or xl_command()), "launch", "--slurm", *launch_argv]),
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------- what a batch script can run
# sbatch's --time forms (man sbatch): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, and no limit.
_TIME = re.compile(r"^(\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|unlimited|infinite)$", re.IGNORECASE)
# sbatch's --mem: a whole number, in megabytes unless K, M, G or T follows (0: all of the node's).
_MEM = re.compile(r"^\d+[KMGT]?$", re.IGNORECASE)


def check_batch_values(time: str | None, mem: str | None) -> None:
    """--time and --mem as sbatch reads them, so a typo fails here, not after the queue."""
    if time is not None and not _TIME.match(time):
        raise UsageError(
            f"--time {time!r} is not a Slurm time; write e.g. 04:00:00 (H:M:S), 90 (minutes) or "
            "1-12:00:00"
        )
    if mem is not None and not _MEM.match(mem):
        raise UsageError(
            f"--mem {mem!r} is not a Slurm memory size; write e.g. 200G, 64000 (MB) or 0 (all of "
            "it)"
        )


def _gpu_count(gpus: str) -> int | None:
    """How many GPUs a --gpus value names (None: every GPU, a count known only on the node)."""
    text = gpus.strip()
    if text == "all":
        return None
    if text.startswith("auto:"):
        return int(text[5:]) if text[5:].isdigit() else None
    return len([t for t in text.split(",") if t.strip()])


def check_gpus_fit(gpus: str | None, nproc: int | None, gpus_per_node: int | None) -> None:
    """A batch script whose ranks cannot all get a GPU on any node is refused on the login node."""
    named = _gpu_count(gpus) if gpus is not None else None
    if nproc is not None and named is not None and nproc > named:
        raise UsageError(
            f"--nproc {nproc} is more than the {named} GPU(s) in --gpus {gpus}; give as many GPUs "
            "as processes"
        )
    if gpus_per_node is not None:
        if nproc is not None and nproc > gpus_per_node:
            raise UsageError(
                f"--nproc {nproc} is more than --gpus-per-node {gpus_per_node}: each rank needs "
                "its own GPU; "
                f"use --nproc {gpus_per_node} or ask for more GPUs"
            )
        if named is not None and named > gpus_per_node:
            raise UsageError(
                f"--gpus {gpus} names {named} GPU(s) but --gpus-per-node is {gpus_per_node}; "
                "ask for as many GPUs as --gpus names"
            )
