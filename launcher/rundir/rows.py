"""run.json's rows: its ``devices`` and its ``ranks`` (docs/contracts.md, "run.json"), typed and
read leniently, with what they were read from kept so that a rewrite keeps another tool's keys.
``record.RunRecord`` hands them out; this module is only their shape. Pure, standard library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar


def as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def as_text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _gpu(value: object) -> int | str | None:
    """A rank's GPU as run.json names it: its index, or a name (a MIG UUID)."""
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None


# A row's keys: (attribute, JSON key, decoder), in the order a new row writes them.
_Keys = tuple[tuple[str, str, Callable[[object], object]], ...]


@dataclass(frozen=True)
class Row:
    """A row of run.json read leniently: each known key decoded to its type (a value of the wrong
    type reads as None), and the object as read kept in ``source``, so that writing the row back
    keeps another tool's keys, the order and every value xl did not change."""

    source: Mapping[str, object] = field(
        default_factory=dict, kw_only=True, repr=False, compare=False
    )
    _KEYS: ClassVar[_Keys] = ()

    @classmethod
    def json_keys(cls) -> tuple[str, ...]:
        """The keys xl knows (docs/contracts.md, "run.json")."""
        return tuple(key for _, key, _ in cls._KEYS)

    @classmethod
    def from_json(cls: type[_R], data: Mapping[str, object]) -> _R:
        return cls(**{attr: decode(data.get(key)) for attr, key, decode in cls._KEYS}, source=data)

    def to_json(self) -> dict[str, object]:
        """The row as run.json holds it: as read, with what changed since written over it; a row
        made here (no ``source``) writes every key xl knows."""
        out = dict(self.source)
        for attr, key, decode in self._KEYS:
            value = getattr(self, attr)
            if key in out:
                if decode(out[key]) != value:
                    out[key] = value
            elif value is not None or not self.source:
                out[key] = value
        return out


_R = TypeVar("_R", bound=Row)


@dataclass(frozen=True)
class DeviceRow(Row):
    """One GPU in run.json's ``devices``."""

    index: int | None
    uuid: str | None = None
    name: str | None = None

    _KEYS: ClassVar[_Keys] = (
        ("index", "index", as_int),
        ("uuid", "uuid", as_text),
        ("name", "name", as_text),
    )


@dataclass(frozen=True)
class RankRow(Row):
    """One rank in run.json's ``ranks``. ``host`` is the machine it runs on (the JSON key
    ``node``); ``state`` an ``outcome.RankPhase`` value."""

    rank: int | None
    local_rank: int | None = None
    host: str | None = None
    node_rank: int | None = None
    pid: int | None = None
    gpu: int | str | None = None  # its index (a name for a MIG instance); null on CPU
    gpu_uuid: str | None = None
    state: str | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    attempt: int | None = None
    waited_s: float | None = None  # once the run ended, for ranks xl.watch measured
    samples_per_s: float | None = None  # once the run ended: samples / time in steps

    _KEYS: ClassVar[_Keys] = (
        ("rank", "rank", as_int),
        ("local_rank", "local_rank", as_int),
        ("host", "node", as_text),
        ("node_rank", "node_rank", as_int),
        ("pid", "pid", as_int),
        ("gpu", "gpu", _gpu),
        ("gpu_uuid", "gpu_uuid", as_text),
        ("state", "state", as_text),
        ("exit_code", "exit_code", as_int),
        ("started_at", "started_at", as_number),
        ("ended_at", "ended_at", as_number),
        ("attempt", "attempt", as_int),
        ("waited_s", "waited_s", as_number),
        ("samples_per_s", "samples_per_s", as_number),
    )
