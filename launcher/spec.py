"""What a person asked to launch: the input of the plan, stored verbatim in run.json."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchSpec:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def target(self) -> str:
        """What runs, for people: the script path or ``-m module``."""
        return self.script if self.script is not None else f"-m {self.module}"
