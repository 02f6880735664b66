"""The Launch form as plain data: its values, the LaunchSpec they mean, the equivalent command.

Kept free of Textual so the tests can check that the command shown is the one `xl launch` parses
to the same plan.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, fields
from typing import Any

from xl.errors import UsageError

MIXED_PRECISION = ("no", "fp16", "bf16", "fp8")


@dataclass
class LaunchForm:
    target: str = ""  # a script path, or "-m package.module"
    args: str = ""  # shell words
    gpus: str = ""  # --gpus SPEC; "" = launcher default
    nproc: str = ""  # "" = one per chosen GPU (or 1 on CPU)
    nnodes: str = "1"
    node_rank: str = "0"
    rdzv: str = ""
    mixed_precision: str = "no"
    env: str = ""  # K=V words
    name: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchForm:
        known = {f.name for f in fields(cls)}
        return cls(**{k: str(v) for k, v in data.items() if k in known and v is not None})

    @property
    def key(self) -> str:
        """What the settings are remembered under: the script or module, not its arguments."""
        return self.target.strip()


def _words(value: str, what: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError as exc:
        raise UsageError(f"{what}: {exc} (check the quotes)") from None


def _int(value: str, what: str, *, minimum: int) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise UsageError(f"{what} must be a whole number, got {value.strip()!r}") from None
    if n < minimum:
        raise UsageError(f"{what} must be at least {minimum}, got {n}")
    return n


def parse_target(target: str) -> tuple[str | None, str | None]:
    """(script, module) from the target field."""
    words = _words(target, "script")
    if not words:
        raise UsageError("give a script to run (e.g. train.py) or a module as -m package.module")
    if words[0] == "-m":
        if len(words) != 2:
            raise UsageError("write the module as '-m package.module' (arguments go in Args)")
        return None, words[1]
    if len(words) != 1:
        raise UsageError("the script field takes one path; put its arguments in Args")
    return words[0], None


def parse_env(value: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for word in _words(value, "env"):
        key, sep, val = word.partition("=")
        if not sep or not key:
            raise UsageError(f"env entries are KEY=VALUE, got {word!r}")
        env[key] = val
    return env


def to_spec(form: LaunchForm) -> Any:
    """The LaunchSpec these values mean; UsageError (one line) when they mean nothing valid."""
    from xl.launcher.spec import LaunchSpec  # the launcher is only needed once someone launches

    script, module = parse_target(form.target)
    # Blank: the launcher's default (one process per chosen GPU, 1 on CPU).
    nproc = _int(form.nproc, "processes per node", minimum=1) if form.nproc.strip() else None
    if form.mixed_precision not in MIXED_PRECISION:
        raise UsageError(f"mixed precision is one of {', '.join(MIXED_PRECISION)}")
    return LaunchSpec(
        script=script,
        module=module,
        args=_words(form.args, "args"),
        gpus=form.gpus.strip() or None,
        nproc=nproc,
        nnodes=_int(form.nnodes or "1", "nodes", minimum=1),
        node_rank=_int(form.node_rank or "0", "node rank", minimum=0),
        rdzv=form.rdzv.strip() or None,
        # "no" is the launcher's default: leave it unset, as `xl launch` without the flag does.
        mixed_precision=None if form.mixed_precision == "no" else form.mixed_precision,
        env=parse_env(form.env),
        name=form.name.strip() or None,
    )


def command(form: LaunchForm) -> list[str]:
    """The `xl launch ...` argv equivalent to the form (what the person can paste in a shell)."""
    argv = ["xl", "launch"]
    if form.gpus.strip():
        argv += ["--gpus", form.gpus.strip()]
    if form.nproc.strip():
        argv += ["--nproc", form.nproc.strip()]
    if form.nnodes.strip() not in ("", "1"):
        argv += ["--nnodes", form.nnodes.strip()]
    if form.node_rank.strip() not in ("", "0"):
        argv += ["--node-rank", form.node_rank.strip()]
    if form.rdzv.strip():
        argv += ["--rdzv", form.rdzv.strip()]
    if form.mixed_precision != "no":
        argv += ["--mixed-precision", form.mixed_precision]
    try:
        env_words = shlex.split(form.env)
        target = shlex.split(form.target)
        args = shlex.split(form.args)
    except ValueError:
        return argv
    for word in env_words:
        argv += ["--env", word]
    if form.name.strip():
        argv += ["--name", form.name.strip()]
    if target[:1] == ["-m"]:
        argv += target + args
    else:
        argv += ["--", *target, *args]
    return argv
