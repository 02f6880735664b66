"""The one option parser of `xl launch`, shared by `xl launch`, `xl launch --slurm`, `xl sbatch`.

What `xl launch` takes is defined here once: the options (with torchrun's spellings accepted,
unlisted), where xl's options stop and the script's begin, and how the options become a
LaunchSpec. `xl sbatch` adds its #SBATCH options to the same parser; the launch form and the
commands xl writes for other nodes go through xl.launcher.spec.spec_to_argv, whose output this
module parses back to the same spec (tests/launcher/test_spec_argv.py).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from xl import envnames
from xl.address import format_address
from xl.cgroup import parse_size
from xl.errors import ArgumentParser, UsageError
from xl.launcher.spec import MIXED_PRECISION, LaunchSpec, parse_env_pairs

# `xl launch python train.py`: the interpreter written where the script goes (python, python3.11).
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")

# `--accelerate-config` takes a value only when one is given: the next word is its PATH only when
# it names a config file, else it is the script (`xl launch --accelerate-config train.py`).
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json")

# torchrun's own spellings of xl's options (docs/launch.md): accepted, not listed in
# --help, so a torchrun command line works with `torchrun` replaced by `xl launch`.
_TORCHRUN_SPELLINGS = {
    "nproc": ("--nproc-per-node", "--nproc_per_node"),
    "node_rank": ("--node_rank",),
    "rdzv": ("--rdzv-endpoint", "--rdzv_endpoint"),
    "master_addr": ("--master-addr", "--master_addr"),
    "master_port": ("--master-port", "--master_port"),
    "max_restarts": ("--max-restarts", "--max_restarts"),
}
_INT_DESTS = ("node_rank", "master_port", "max_restarts")
# torchrun's words for --nproc-per-node: every GPU (gpu), every CPU core (cpu), GPUs or else
# CPU cores (auto).
NPROC_WORDS = ("auto", "cpu", "gpu")

# torchrun options xl does not take, and what to do instead: one line each, so a torchrun
# command line that needs one says so instead of "unrecognized arguments".
_TORCHRUN_NOT_TAKEN = {
    "--rdzv-backend":
        "xl chooses the rendezvous (static on one node, c10d with restarts or several nodes); drop "
        "it"
    ,
    "--rdzv-id": "xl derives the rendezvous id from the run's token; drop it",
    "--rdzv-conf": "xl sets the c10d options itself; drop it",
    "--rdzv-timeout": "xl sets no rendezvous timeout; drop it",
    "--monitor-interval": "xl's supervisor watches the ranks; drop it",
    "--start-method": "xl starts ranks as torchrun's default (spawn) does; drop it",
    "--role": "drop it",
    "--log-dir": "xl writes each rank's output to its run dir (xl logs RUN --rank R); drop it",
    "--logs-specs": "xl writes each rank's output to its run dir (xl logs RUN --rank R); drop it",
    "--redirects": "xl captures every rank's output (xl logs RUN --rank R); drop it",
    "--tee": "xl captures every rank's output (xl logs RUN --rank R); drop it",
    "--local-ranks-filter": "every rank's output is in its run dir (xl logs RUN --rank R); drop it",
    "--local-addr": "drop it (xl uses the address the rendezvous sees)",
    "--no-python": "xl runs a Python script or -m MODULE; give the script",
    "--no_python": "xl runs a Python script or -m MODULE; give the script",
    "--run-path": "give the script's path as the script",
    "--run_path": "give the script's path as the script",
    "--omp-num-threads": "set it with --env OMP_NUM_THREADS=N",
    "--signals-to-handle": "xl stops runs itself (xl stop RUN); drop it",
    "--numa-binding": "drop it",
    "--local_addr": "drop it (xl uses the address the rendezvous sees)",
}
for _name in [n for n in _TORCHRUN_NOT_TAKEN if "-" in n[2:]]:
    _TORCHRUN_NOT_TAKEN.setdefault("--" + _name[2:].replace("-", "_"), _TORCHRUN_NOT_TAKEN[_name])
# Short forms torchrun takes for two of them.
_TORCHRUN_NOT_TAKEN.update(
    {"-r": _TORCHRUN_NOT_TAKEN["--redirects"], "-t": _TORCHRUN_NOT_TAKEN["--tee"]}
)

# --max-restarts N goes to torchrun, which restarts every rank of the node after a failure; the
# supervisor keeps the run through each restart and records it as an attempt. Across nodes a
# restart is a new rendezvous of every node, which the supervisors do not follow yet.
RESTARTS_ACROSS_NODES = False


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0 (`xl demo --seconds`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (e.g. 60)") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0 (e.g. 60)")
    return value


def memory_size(text: str) -> str:
    """An argparse type: --memory-limit SIZE as written (64G, 512M), once it reads as a size."""
    try:
        parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def nproc_value(text: str) -> int | str:
    """An argparse type: --nproc N, or torchrun's auto | cpu | gpu (resolved by nproc_for)."""
    word = text.strip().lower()
    if word in NPROC_WORDS:
        return word
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a number of processes, or auto, cpu or gpu"
        ) from None


def nnodes_value(text: str) -> int:
    """An argparse type: --nnodes N, or torchrun's MIN:MAX when both are the same."""
    low, sep, high = text.partition(":")
    try:
        first, last = int(low), int(high if sep else low)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a number of nodes (e.g. 2), or torchrun's MIN:MAX"
        ) from None
    if first != last:
        raise argparse.ArgumentTypeError(
            f"{text!r}: xl runs a fixed number of nodes and waits for all of them (no elastic "
            f"MIN:MAX range); give --nnodes {last}"
        )
    return first


def cpu_cores() -> int:
    """What torchrun's --nproc-per-node cpu counts: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def launch_parser(prog: str = "xl launch", *, sbatch: bool = False) -> ArgumentParser:
    """Every option of `xl launch`; ``sbatch``: the base of `xl sbatch`'s parser, without what
    a batch script cannot take (--detach, --dry-run, --json, --slurm, --nnodes, --node-rank: the
    job is detached, is the Slurm launch, and takes its nodes from --nodes)."""
    p = ArgumentParser(
        prog=prog,
        allow_abbrev=False,  # split_argv must know every option: `--gpu 2` would make 2 the script
        usage=f"{prog} [OPTIONS] [--] SCRIPT [ARGS...]  |  {prog} [OPTIONS] -m MODULE [ARGS...]",
        description="Launch a distributed PyTorch run on torchrun, supervised by xl. "
        "The run goes on when the terminal closes; 'xl attach RUN' reopens it.",
        epilog="torchrun's spellings work too (--nproc-per-node, --standalone, --rdzv-endpoint, "
        "--master-addr/--master-port, --max-restarts N): replace `torchrun` with `xl launch`.",
    )
    p.add_argument(
        "--gpus",
        help=(
            "0,2 | GPU-<uuid>,... | all | auto (every free GPU) | auto:N (order = LOCAL_RANK order)"
        ),
    )
    p.add_argument(
        "--nproc",
        type=nproc_value,
        help=(
            "processes on this node (default: one per GPU, 1 on CPU; fewer: the first N GPUs "
            "chosen; or auto, cpu, gpu as torchrun)"
        ),
    )
    if not sbatch:
        p.add_argument("--nnodes", type=nnodes_value, help="number of nodes (default 1)")
        p.add_argument("--node-rank", type=int, help="this node's rank (multi-node)")
    p.add_argument("--rdzv", metavar="HOST:PORT", help="node 0's address (multi-node)")
    p.add_argument(
        "--mixed-precision", choices=MIXED_PRECISION, help="sets ACCELERATE_MIXED_PRECISION"
    )
    p.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="extra variable (repeatable)"
    )
    p.add_argument("--name", help="a name for the run")
    p.add_argument(
        "--memory-limit",
        type=memory_size,
        metavar="SIZE",
        help="the most memory (e.g. 64G) every process of the run together may use on a node; "
        "past it the kernel's OOM killer ends one (the run's cgroup, docs/launch.md)",
    )
    p.add_argument(
        "--allow-env-diff",
        action="store_true",
        help="several nodes: start even when a node's environment differs from the others' where "
        "a run cannot work (another torch or NCCL, ...; docs/multinode.md)",
    )
    p.add_argument(
        "--accelerate-config",
        nargs="?",
        const="",
        metavar="PATH",
        help=(
            "take settings from an Accelerate config (default "
            "$HF_HOME/accelerate/default_config.yaml)"
        ),
    )
    p.add_argument(
        "--python",
        metavar="PY",
        help="run the ranks under this interpreter (another environment's; it needs torch, not xl)",
    )
    if not sbatch:
        p.add_argument(
            "--dry-run", action="store_true", help="print the command and variables; start nothing"
        )
        p.add_argument(
            "--json", action="store_true", help='with --dry-run: {"argv": [...], "env": {...}}'
        )
        p.add_argument("--detach", action="store_true", help="start the run and return at once")
    p.add_argument(
        "--no-tui", action="store_true", help="a plain live table instead of the monitor"
    )
    p.add_argument(
        "--no-instrument",
        action="store_true",
        help=(
            "leave HF Trainer, Lightning, Accelerate and DeepSpeed untouched (no per-rank "
            "callbacks; see docs/frameworks.md)"
        ),
    )
    if not sbatch:
        p.add_argument(
            "--slurm",
            action="store_true",
            help=(
                "inside a Slurm allocation: one xl agent per node with srun, rendezvous on the "
                "first node"
            ),
        )
    # Internal, for the tasks `--slurm` starts: node rank from SLURM_NODEID, the run id chosen by
    # the launcher (node 0's run is RUN_ID, node k's RUN_ID-nodeK).
    p.add_argument("--slurm-node", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run-id", help=argparse.SUPPRESS)
    for dest, spellings in _TORCHRUN_SPELLINGS.items():
        if sbatch and dest == "node_rank":
            continue
        kind = nproc_value if dest == "nproc" else int if dest in _INT_DESTS else str
        p.add_argument(*spellings, dest=dest, type=kind, default=None, help=argparse.SUPPRESS)
    # torchrun's one-node rendezvous, which is what xl does on one node anyway.
    p.add_argument("--standalone", action="store_true", help=argparse.SUPPRESS)
    return p


def value_options(parser: argparse.ArgumentParser) -> frozenset[str]:
    """The option strings of ``parser`` that always take a value (``--gpus 0``)."""
    return frozenset(
        flag
        for action in parser._actions  # argparse keeps no public list of a parser's options
        if action.nargs is None or (isinstance(action.nargs, int) and action.nargs > 0)
        for flag in action.option_strings
    )


def check_options(
    parser: argparse.ArgumentParser, opts: Sequence[str], not_taken: Mapping[str, str] | None = None
) -> None:
    """Every option in ``opts`` is one ``parser`` takes; else one line: a torchrun option xl
    does not take says what to do instead (as ``not_taken`` does for the command's own), a near
    miss (``--gpu``) gets "did you mean"."""
    known = parser._option_string_actions  # argparse keeps no public map of a parser's options
    not_taken = not_taken or {}
    takes_value = value_options(parser)
    skip = False
    for tok in opts:
        if skip or not tok.startswith("-") or tok == "-":
            skip = False
            continue  # the value of the option before it (split_argv put it there), or a stray word
        name = tok.split("=", 1)[0]
        skip = name in takes_value and "=" not in tok
        if name in known or (not name.startswith("--") and name[:2] in known):
            continue  # `-N4`: a short option with its value attached
        if name in not_taken:
            raise UsageError(f"{name} is not taken here: {not_taken[name]}")
        if name in _TORCHRUN_NOT_TAKEN:
            raise UsageError(f"torchrun's {name} is not taken here: {_TORCHRUN_NOT_TAKEN[name]}")
        public = [o for o, a in known.items() if a.help != argparse.SUPPRESS and o.startswith("--")]
        import difflib  # noqa: PLC0415 - only a mistyped option pays for it

        close = difflib.get_close_matches(name, public, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else f" (see '{parser.prog} --help')"
        raise UsageError(f"unknown option {name}{hint}")


def parse_command(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    example: str,
    not_taken: Mapping[str, str] | None = None,
) -> tuple[argparse.Namespace, str | None, str | None, list[str]]:
    """A launching command's (options, script, module, script args), or one clear UsageError:
    `xl launch` and `xl sbatch` read their command lines alike. ``example`` shows a whole command;
    ``not_taken``: options of `xl launch` this command does not take, and why."""
    opts, script, module, args = split_argv(argv, value_options(parser))
    check_options(parser, opts, not_taken)
    ns = parser.parse_args(opts)
    if script is None and module is None:
        raise UsageError(
            f"give a training script ({example}) or -m MODULE (see '{parser.prog} --help')"
        )
    if (
        script is not None
        and _PYTHON.match(os.path.basename(script))
        and not script.endswith(".py")
    ):
        rest = shlex.join(args) or "train.py"
        raise UsageError(
            f"{parser.prog} runs the script with Python itself: drop {script!r} ({parser.prog} "
            f"{rest})"
        )
    return ns, script, module, args


def split_argv(
    argv: Sequence[str], value_opts: frozenset[str]
) -> tuple[list[str], str | None, str | None, list[str]]:
    """(xl options, script, module, script args): xl's options stop at the script or -m MODULE.

    ``value_opts``: the options that take a value (value_options of the command's parser), whose
    value is never mistaken for the script."""
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
                if name in value_opts or (
                    name == "--accelerate-config" and nxt.endswith(_CONFIG_SUFFIXES)
                ):
                    opts.append(nxt)
                    i += 1
            i += 1
            continue
        return opts, tok, None, list(argv[i + 1 :])
    return opts, None, None, []


def _master_rdzv(ns: argparse.Namespace) -> str | None:
    """torchrun's --master-addr / --master-port as xl's --rdzv HOST:PORT (torchrun's defaults
    for the one not given: 127.0.0.1, 29500)."""
    addr, port = getattr(ns, "master_addr", None), getattr(ns, "master_port", None)
    if addr is None and port is None:
        return None
    if getattr(ns, "rdzv", None):
        raise UsageError(
            "give --rdzv HOST:PORT (or --rdzv-endpoint) or --master-addr/--master-port, not both"
        )
    return format_address(addr or "127.0.0.1", port if port is not None else 29500)


def spec_from_args(
    ns: argparse.Namespace,
    script: str | None,
    module: str | None,
    args: list[str],
    *,
    read_config: bool = True,
) -> LaunchSpec:
    """The LaunchSpec the parsed options mean, in this directory.

    ``read_config=False``: the options as written, without the Accelerate config's settings
    (Slurm passes --accelerate-config on for each node to read its own)."""
    spec = LaunchSpec(script=script, module=module, args=args, cwd=os.getcwd())
    if read_config and ns.accelerate_config is not None:
        from xl.launcher.cli.accelconf import default_path, read_settings  # noqa: PLC0415 - only --accelerate-config reads one

        path = Path(ns.accelerate_config).expanduser() if ns.accelerate_config else default_path()
        acc = read_settings(path)
        # The config fills in; flags given beside it win.
        spec.gpus, spec.nproc, spec.mixed_precision = acc.gpus, acc.nproc, acc.mixed_precision
        spec.nnodes = acc.nnodes or 1
        spec.node_rank = acc.node_rank or 0
        spec.rdzv = acc.rdzv
    keys = (
        "gpus",
        "nproc",
        "nnodes",
        "node_rank",
        "rdzv",
        "mixed_precision",
        "max_restarts",
        "python",
        "memory_limit",
    )
    given = {k: getattr(ns, k, None) for k in keys}
    if isinstance(given["nproc"], str):
        # cpu: a number now; gpu and auto: one per chosen GPU (the default), checked by nproc_for.
        given["nproc"] = cpu_cores() if given["nproc"] == "cpu" else None
    given["rdzv"] = given["rdzv"] or _master_rdzv(ns)
    if given["python"] is not None:
        from xl.launcher.cli.interpreter import resolve_python  # noqa: PLC0415 - only --python: not every launch's start

        given["python"] = resolve_python(given["python"])
    spec = replace(spec, **{k: v for k, v in given.items() if v is not None})
    if spec.mixed_precision == "False":  # YAML 1.1 reads an unquoted `no` as false
        spec.mixed_precision = "no"
    if spec.max_restarts and spec.nnodes > 1 and not RESTARTS_ACROSS_NODES:
        raise UsageError(
            f"--max-restarts {spec.max_restarts} with --nnodes {spec.nnodes}: xl restarts ranks "
            "on one node only; drop --max-restarts, or run on one node"
        )
    if ns.standalone and (spec.nnodes != 1 or spec.rdzv is not None):
        raise UsageError("--standalone is a one-node run; drop it, or --nnodes and --rdzv")
    spec.env = parse_env_pairs(
        [*ns.env, *([f"{envnames.INSTRUMENT}=0"] if ns.no_instrument else [])]
    )
    spec.name = ns.name
    spec.allow_env_diff = bool(getattr(ns, "allow_env_diff", False))
    return spec


def nproc_for(word: object, gpus: int) -> int | None:
    """torchrun's --nproc-per-node gpu | auto once the GPUs are chosen: None (one per GPU) when
    there are GPUs; on CPU, auto is every core (as torchrun) and gpu is a UsageError."""
    if word not in ("gpu", "auto") or gpus:
        return None
    if word == "gpu":
        raise UsageError(
            "--nproc-per-node gpu: no GPU is chosen here; give a number of processes, or auto"
        )
    return cpu_cores()


def spec_from_argv(argv: Sequence[str]) -> LaunchSpec:
    """What `xl launch ARGV` would run, as a spec (the inverse of spec_to_argv)."""
    parser = launch_parser()
    opts, script, module, args = split_argv(argv, value_options(parser))
    check_options(parser, opts)
    return spec_from_args(parser.parse_args(opts), script, module, args)
