"""The Launch form as plain data: its values, the LaunchSpec they mean, the equivalent command.

Kept free of Textual so the tests can check that the command shown is the one `xl launch` parses
to the same plan: the command is the spec written back by spec_to_argv, the writer every `xl
launch` command line xl shows goes through, and the form shares `xl launch`'s vocabulary (the
mixed-precision choices, the --env rule) from xl.launcher.spec.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from xl.errors import UsageError
from xl.launcher.spec import MIXED_PRECISION, LaunchSpec, env_pair, spec_to_argv

__all__ = ["MIXED_PRECISION", "LaunchForm", "command", "parse_env", "parse_target", "to_spec"]

# Settings for one launch only, never remembered for a script: a `Nodes 2` brought back behind the
# collapsed multi-node section made the next launch wait for a node that never came.
MULTI_NODE = ("nnodes", "node_rank", "rdzv")


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
    def from_dict(cls, data: Mapping[str, object]) -> LaunchForm:
        known = {f.name for f in fields(cls)}
        return cls(**{k: str(v) for k, v in data.items() if k in known and v is not None})

    def remembered(self) -> dict[str, str]:
        """What is remembered for the script: every field but the multi-node ones."""
        return {k: v for k, v in self.to_dict().items() if k not in MULTI_NODE}

    @classmethod
    def recalled(cls, data: Mapping[str, object]) -> LaunchForm:
        """The form a script's remembered settings fill in: single-node, whatever an older xl
        remembered."""
        return cls.from_dict({k: v for k, v in data.items() if k not in MULTI_NODE})

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
    """The Env field's ``KEY=VALUE`` words, by `xl launch --env`'s rule."""
    env: dict[str, str] = {}
    for word in _words(value, "env"):
        pair = env_pair(word)
        if pair is None:
            raise UsageError(f"env entries are KEY=VALUE with KEY a variable name, got {word!r}")
        env[pair[0]] = pair[1]
    return env


def _mixed_precision(value: str) -> str | None:
    if value not in MIXED_PRECISION:
        raise UsageError(f"mixed precision is one of {', '.join(MIXED_PRECISION)}")
    # "no" is the launcher's default: leave it unset, as `xl launch` without the flag does.
    return None if value == "no" else value


def _read(form: LaunchForm, *, lenient: bool) -> LaunchSpec:
    """The spec of ``form``. ``lenient``: a field that does not read (yet) keeps its default
    instead of raising, for the command shown while the person types."""

    def read(parse: Any, default: Any) -> Any:
        if not lenient:
            return parse()
        try:
            return parse()
        except UsageError:
            return default

    script, module = read(lambda: parse_target(form.target), (None, None))
    # Blank: the launcher's default (one process per chosen GPU, 1 on CPU).
    nproc = read(
        lambda: _int(form.nproc, "processes per node", minimum=1) if form.nproc.strip() else None,
        None,
    )
    return LaunchSpec(
        script=script,
        module=module,
        mixed_precision=read(lambda: _mixed_precision(form.mixed_precision), None),
        args=read(lambda: _words(form.args, "args"), []),
        gpus=form.gpus.strip() or None,
        nproc=nproc,
        nnodes=read(lambda: _int(form.nnodes or "1", "nodes", minimum=1), 1),
        node_rank=read(lambda: _int(form.node_rank or "0", "node rank", minimum=0), 0),
        rdzv=form.rdzv.strip() or None,
        env=read(lambda: parse_env(form.env), {}),
        name=form.name.strip() or None,
    )


def to_spec(form: LaunchForm) -> LaunchSpec:
    """The LaunchSpec these values mean; UsageError (one line) when they mean nothing valid."""
    return _read(form, lenient=False)


def command(form: LaunchForm) -> list[str]:
    """The `xl launch ...` argv equivalent to the form (what the person can paste in a shell);
    while a field does not read yet, the command leaves it out (the validation line says why)."""
    return ["xl", "launch", *spec_to_argv(_read(form, lenient=True))]
