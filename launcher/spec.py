"""What a person asked to launch, and the one place its `xl launch` command line is written.

LaunchSpec is the input of the plan, stored verbatim in run.json. ``spec_to_argv`` is its
inverse: the launch form's command, node 0's command for the other nodes, the Slurm step and the
Slurm batch script all write a spec back as `xl launch` arguments through it, so what a person
copies, what another node runs and what `xl launch` parses cannot drift apart (tests/
test_spec_argv.py parses it back to the same spec). The vocabulary both directions share (the
mixed-precision choices, the ``--env`` rule) is defined here too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from xl.errors import UsageError

# Accelerate's choices; --mixed-precision sets ACCELERATE_MIXED_PRECISION to one of them.
MIXED_PRECISION = ("no", "fp16", "bf16", "fp8")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class LaunchSpec:
    """One launch request. ``script`` xor ``module``; everything else is optional.

    ``gpus`` is the device spec as written (``"0,2"``, ``"GPU-..."``, ``"all"``, ``"auto:N"``);
    None means "every visible GPU, or CPU when there is none". ``nproc`` None means one process
    per chosen GPU (1 on CPU). ``cwd`` and ``python`` default to the launching process's.
    """

    script: str | None = None
    module: str | None = None
    args: list[str] = field(default_factory=list)
    gpus: str | None = None
    nproc: int | None = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv: str | None = None
    mixed_precision: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    cwd: str | None = None
    python: str | None = None
    max_restarts: int = 0  # torchrun's --max-restarts: restarts of every rank after a failure
    memory_limit: str | None = None  # --memory-limit as written ("64G"): the run's cgroup's
    # several nodes: start even when the nodes' environments differ where a run cannot work
    allow_env_diff: bool = False

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    # edge: run.json's spec as read from the file; the keys this class does not know are left out
    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchSpec:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def target(self) -> str:
        """What runs, for people: the script path or ``-m module``."""
        return self.script if self.script is not None else f"-m {self.module}"


def valid_env_name(name: str) -> bool:
    """A name a shell and torchrun's children take as a variable (``NCCL_DEBUG``, ``_X1``)."""
    return _ENV_NAME.match(name) is not None


def env_pair(word: str) -> tuple[str, str] | None:
    """``NAME=VALUE`` -> (name, value), split at the first ``=`` (values may hold more, and
    spaces); None when ``word`` is not one. The one rule for --env and the form's Env field."""
    key, sep, value = word.partition("=")
    if not sep or not valid_env_name(key):
        return None
    return key, value


def parse_env_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``--env`` values -> the spec's env (a later pair for a name wins); UsageError on a bad
    one."""
    out: dict[str, str] = {}
    for word in pairs:
        pair = env_pair(word)
        if pair is None:
            raise UsageError(f"--env {word!r} is not NAME=VALUE (e.g. --env NCCL_DEBUG=INFO)")
        out[pair[0]] = pair[1]
    return out


def _option(flag: str, value: str) -> list[str]:
    # A value that starts with '-' would read as an option to argparse; the = form cannot.
    return [f"{flag}={value}"] if value.startswith("-") else [flag, value]


def spec_to_argv(spec: LaunchSpec, options: Sequence[str] = ()) -> list[str]:
    """The `xl launch` arguments (what follows ``xl launch``) that parse back to ``spec``.

    Defaults are left out (one node, node rank 0, mixed precision unset), so a command reads as a
    person would write it. ``options``: more `xl launch` options that are not part of a spec
    (``--no-tui``, ``--accelerate-config``), placed before the script. The script always comes
    after ``--``, so a script named like an option still runs; its arguments follow it as given.
    ``cwd`` is not an option: a command runs where it is typed; ``python`` is ``--python`` when
    set (None: the ranks run under the interpreter xl runs from).
    """
    argv: list[str] = []
    if spec.gpus is not None:
        argv += _option("--gpus", spec.gpus)
    if spec.nproc is not None:
        argv += ["--nproc", str(spec.nproc)]
    if spec.nnodes != 1:
        argv += ["--nnodes", str(spec.nnodes)]
    if spec.node_rank != 0:
        argv += ["--node-rank", str(spec.node_rank)]
    if spec.rdzv is not None:
        argv += _option("--rdzv", spec.rdzv)
    if spec.mixed_precision is not None:
        argv += ["--mixed-precision", spec.mixed_precision]
    if spec.max_restarts:
        argv += ["--max-restarts", str(spec.max_restarts)]
    if spec.memory_limit is not None:
        argv += ["--memory-limit", spec.memory_limit]
    if spec.allow_env_diff:
        argv += ["--allow-env-diff"]
    for key, value in spec.env.items():
        argv += ["--env", f"{key}={value}"]
    if spec.name is not None:
        argv += _option("--name", spec.name)
    if spec.python is not None:
        argv += _option("--python", spec.python)
    argv += options
    if spec.module is not None:
        argv += ["-m", spec.module]
    elif spec.script is not None:
        argv += ["--", spec.script]
    return argv + list(spec.args)
