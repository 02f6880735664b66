"""What the diagnoses say, one frozen value per kind, until the line is written.

The diagnoser (diagnose.py) and the straggler votes (straggler_votes.py) make these; ``event()``
turns one into events.jsonl's ``Diagnosis`` (launcher/rundir/events.py), the fields in the order
docs/contracts.md ("events.jsonl") shows them, and that value is what is sent on. Past
``event()`` only the hang capture reads one, through ``Diagnosis``'s typed properties.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from xl.launcher.rundir.events import Diagnosis as DiagnosisEvent
from xl.launcher.rundir.events import EventKind

# A JSON value of an event's line: what ``event()`` hands on is written, never read back here.
Fields = dict[str, object]


@dataclass(frozen=True, slots=True)
class Stalled:
    """``rank`` made no progress for ``idle_s``. ``waiting_s``: it sits that long in an
    all-reduce, waiting for another rank; ``holding_up``: it is not in the all-reduce where
    these ranks wait for it."""

    rank: int
    message: str
    idle_s: float
    step: float | None
    waiting_s: float | None = None
    holding_up: tuple[int, ...] = ()

    def event(self) -> DiagnosisEvent:
        fields: Fields = {"idle_s": self.idle_s, "step": self.step}
        if self.waiting_s is not None:
            fields["waiting_s"] = self.waiting_s
        elif self.holding_up:
            fields["holding_up"] = list(self.holding_up)
        return DiagnosisEvent(EventKind.STALLED, self.rank, self.message, fields)


@dataclass(frozen=True, slots=True)
class Recovered:
    """``rank`` is no longer what an earlier event said (``of``: ``stalled``, ``straggler``)."""

    rank: int
    message: str
    of: EventKind

    def event(self) -> DiagnosisEvent:
        return DiagnosisEvent(EventKind.RECOVERED, self.rank, self.message, {"of": self.of.value})


@dataclass(frozen=True, slots=True)
class NanLoss:
    rank: int
    message: str
    step: float | None
    key: str  # the loss figure that is not finite

    def event(self) -> DiagnosisEvent:
        fields: Fields = {"step": self.step, "key": self.key}
        return DiagnosisEvent(EventKind.NAN_LOSS, self.rank, self.message, fields)


@dataclass(frozen=True, slots=True)
class GpuMemHigh:
    rank: int
    message: str
    gpu: object  # the sys line's ``gpu``, as the sampler wrote it
    fraction: float

    def event(self) -> DiagnosisEvent:
        fields: Fields = {"gpu": self.gpu, "fraction": self.fraction}
        return DiagnosisEvent(EventKind.GPU_MEM_HIGH, self.rank, self.message, fields)


@dataclass(frozen=True, slots=True)
class SupervisorPaused:
    """This process did not run for ``paused_s`` (no rank's doing)."""

    message: str
    paused_s: float

    def event(self) -> DiagnosisEvent:
        fields: Fields = {"paused_s": self.paused_s}
        return DiagnosisEvent(EventKind.SUPERVISOR_PAUSED, None, self.message, fields)


@dataclass(frozen=True, slots=True)
class GpuPart:
    """The straggler's GPU, and why NVML says it is held back (straggler.explain_gpu)."""

    gpu: int | None
    reason: str | None = None  # sw_power_cap, hw_slowdown, ..., xid, ecc
    detail: str | None = None  # one line

    def fields(self) -> Fields:
        return {"gpu": self.gpu, "gpu_reason": self.reason, "gpu_detail": self.detail}


@dataclass(frozen=True, slots=True)
class Lasting:
    """How long a straggler's spell has held, and how often the rank was named in the run."""

    chronic: bool
    since_s: float
    spells: int
    spells_since_s: float

    def fields(self) -> Fields:
        return {
            "lasting": "chronic" if self.chronic else "transient",
            "since_s": self.since_s,
            "spells": self.spells,
            "spells_since_s": self.spells_since_s,
        }


class BlameFields(Protocol):
    """What every way of naming a straggler gives: the rank, its phase, the event's fields."""

    @property
    def rank(self) -> int: ...

    @property
    def phase(self) -> str | None: ...

    def message(self) -> str: ...

    def fields(self) -> Fields: ...


@dataclass(frozen=True, slots=True)
class WaitBlame:
    """xl.watch's waits name the culprit: it waits least at the all-reduce (no phase known)."""

    rank: int
    wait_s: float
    victims: tuple[int, ...]
    victims_wait_s: float
    phase: None = None

    def message(self) -> str:
        return (
            f"rank {self.rank} is the straggler: it waits {self.wait_s * 1000:.0f} ms per step "
            f"at the all-reduce while the other ranks wait {self.victims_wait_s * 1000:.0f} ms "
            "for it"
        )

    def fields(self) -> Fields:
        return {
            "method": "collective_wait",
            "phase": None,
            "wait_s": round(self.wait_s, 4),
            "victims": list(self.victims),
            "victims_wait_s": round(self.victims_wait_s, 4),
        }


@dataclass(frozen=True, slots=True)
class StepTimeBlame:
    """Step times alone name the culprit: its step takes the most (no phase known)."""

    rank: int
    step_s: float
    median_step_s: float
    phase: None = None

    def message(self) -> str:
        return (
            f"rank {self.rank} is the straggler: {self.step_s * 1000:.0f} ms per step vs a "
            f"median of {self.median_step_s * 1000:.0f} ms "
            f"({self.step_s / self.median_step_s:.1f}x)"
        )

    def fields(self) -> Fields:
        return {
            "method": "step_time",
            "phase": None,
            "step_s": round(self.step_s, 4),
            "median_step_s": round(self.median_step_s, 4),
        }


@dataclass(frozen=True, slots=True)
class Straggler:
    """``rank`` holds the others up: what named it (``straggler.Blame`` from timed steps, else
    ``WaitBlame`` or ``StepTimeBlame``), its GPU's part and how long it has lasted. ``message``
    is the rule's; the event's adds the GPU's detail and the spell's length."""

    rank: int
    message: str
    blame: BlameFields
    gpu: GpuPart
    lasting: Lasting

    def event(self) -> DiagnosisEvent:
        fields = {**self.blame.fields(), **self.gpu.fields(), **self.lasting.fields()}
        return DiagnosisEvent(EventKind.STRAGGLER, self.rank, self.words(), fields)

    def words(self) -> str:
        """The rule's message, then the GPU's detail and how long the spell has lasted."""
        out = self.message
        if self.gpu.detail:
            out += f"; {self.gpu.detail}"
        if self.lasting.chronic:
            out += f" (chronic: for {_span(self.lasting.since_s)})"
        elif self.lasting.spells > 1:
            out += (
                f" (transient: the {_ordinal(self.lasting.spells)} time in "
                f"{_span(self.lasting.spells_since_s)})"
            )
        return out


def _span(seconds: float) -> str:
    s = int(max(0.0, seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s // 60 % 60} min"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True, slots=True)
class Evidence:
    """One tick's evidence on stragglers, the best the ranks give, over the straggler window:
    each rank's per-step phases (``splits``: data_s, compute_s, comm_s, other_s, comm_se_s), else
    its mean wait at the all-reduce (``waits``), else its median step time (``steps``); and each
    rank's last ``sys`` line with its GPU's figures (``gpu_seen``), for the culprit's GPU."""

    splits: Mapping[int, Mapping[str, float]]
    waits: Mapping[int, float]
    steps: Mapping[int, float]
    gpu_seen: Mapping[int, Mapping[str, object]]


Diagnosis = Stalled | Recovered | NanLoss | GpuMemHigh | SupervisorPaused | Straggler
