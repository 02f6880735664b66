"""Which rank holds the others up, and where it loses its time: the straggler rule on timed steps.

Every rank's train lines split its step into ``data_s``, ``compute_s``, ``comm_s`` and ``other_s``
(docs/contracts.md, "metrics.jsonl"). In synchronous data parallel training every rank's step
takes as long as the slowest one's: the ranks meet at each all-reduce, and the ones that come
early wait there (their ``comm_s``) for the one that comes last. So the culprit is the rank that
waits least while the others wait much; never the ranks that wait. Its ``phase`` is where it
spends more than the others do: the non-communication phase in which it exceeds the others'
median most. A run in which every rank is slow at the same thing (every rank waits for data)
has nobody to blame: no rank waits much for another.

When ranks are not synchronised (their step times differ), the rank whose step takes 1.2x the
median or more is the straggler, and its phase is the one (communication included) in which it
exceeds the others' median most.

Pure: the diagnoser (diagnose.py) gives each rank's per-step means over its window and votes
over ticks; this module only decides one window.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from xl.figures import PHASE_KEYS, PHASES
from xl.launcher.rundir.events import EventKind, EventLine
from xl.launcher.telemetry.diagnosis import Fields, GpuPart
from xl.stats import median

# How each phase reads in a message: "210 ms of its 350 ms step waiting for data".
_DOING = {
    "data": "waiting for data",
    "compute": "computing",
    "comm": "in communication",
    "other": "in its own code between steps",
}

# "data_s", "compute_s", "comm_s", "other_s" (per-step seconds), "comm_se_s"?
Split = Mapping[str, float]
_SIGMAS = 5.0  # how many standard errors apart the culprit's and the others' waits must be


class Blame(NamedTuple):
    """One window's verdict: ``rank`` is the straggler, losing its time in ``phase``. (A
    NamedTuple: a frozen dataclass cost the supervisor's start ~3 ms of CPU to build.)"""

    rank: int
    phase: str
    phase_s: float  # its per-step seconds in the phase
    others_phase_s: float  # the other ranks' median there
    step_s: float  # its step time
    victims: tuple[int, ...]  # the ranks that wait for it (synchronised), else ()
    victims_wait_s: float  # their median comm_s (synchronised), else 0
    method: str  # "step_phase" (synchronised ranks) or "step_time"

    def message(self) -> str:
        own = (
            f"rank {self.rank} is the straggler: {self.phase_s * 1000:.0f} ms of its "
            f"{self.step_s * 1000:.0f} ms step {_DOING[self.phase]}"
        )
        if self.method == "step_phase":
            many = len(self.victims) > 1
            return (
                f"{own}; the other{'s' if many else ' rank'} wait{'' if many else 's'} "
                f"~{self.victims_wait_s * 1000:.0f} ms in communication for it"
            )
        return f"{own}, the others {self.others_phase_s * 1000:.0f} ms"

    def fields(self) -> Fields:
        """The ``straggler`` event's fields besides kind, rank and message (docs/contracts.md)."""
        return {
            "method": self.method,
            "phase": self.phase,
            "phase_s": round(self.phase_s, 4),
            "others_phase_s": round(self.others_phase_s, 4),
            "step_s": round(self.step_s, 4),
            "victims": list(self.victims),
            "victims_wait_s": round(self.victims_wait_s, 4),
        }


def _step(split: Split) -> float:
    return sum(split[k] for k in PHASE_KEYS)


def _worst_phase(
    rank: int, splits: Mapping[int, Split], phases: tuple[str, ...]
) -> tuple[str, float]:
    """The phase among ``phases`` where ``rank`` exceeds the other ranks' median most, and that
    median."""
    best: tuple[float, str, float] | None = None
    for phase in phases:
        key = f"{phase}_s"
        others = median([s[key] for r, s in splits.items() if r != rank])
        excess = splits[rank][key] - others
        if best is None or excess > best[0]:
            best = (excess, phase, others)
    assert best is not None
    return best[1], best[2]


def synchronised(
    splits: Mapping[int, Split], min_wait_s: float, wait_ratio: float, min_share: float
) -> Blame | None:
    """The straggler of synchronised ranks, or None. ``min_wait_s``: the others' median wait must
    be at least this; ``wait_ratio``: the culprit waits at most this fraction of it; ``min_share``:
    and the others' wait is at least this share of their step (a few ms of a 10 s step is noise)."""
    if len(splits) < 2:
        return None
    culprit = min(splits, key=lambda r: splits[r]["comm_s"])
    victims = tuple(sorted(r for r in splits if r != culprit))
    wait = median([splits[r]["comm_s"] for r in victims])
    typical_step = median([_step(splits[r]) for r in victims])
    if (
        wait < min_wait_s
        or splits[culprit]["comm_s"] > wait_ratio * wait
        or wait < min_share * typical_step
    ):
        return None
    # A difference chance explains is none: with every rank's batch jittering, one of them is
    # last more often than the others for a while (its waits' standard errors, when known).
    noise = (
        splits[culprit].get("comm_se_s", 0.0) ** 2
        + median([splits[r].get("comm_se_s", 0.0) for r in victims]) ** 2
    ) ** 0.5
    if wait - splits[culprit]["comm_s"] < _SIGMAS * noise:
        return None
    phase, others = _worst_phase(culprit, splits, tuple(p for p in PHASES if p != "comm"))
    own = splits[culprit]
    return Blame(culprit, phase, own[f"{phase}_s"], others, _step(own), victims, wait, "step_phase")


def unsynchronised(splits: Mapping[int, Split], ratio: float) -> Blame | None:
    """The rank whose step takes ``ratio`` times the others' median or more (the slowest such),
    with the phase where it loses most; None when there is none."""
    if len(splits) < 2:
        return None
    slowest = max(splits, key=lambda r: _step(splits[r]))
    others = median([_step(s) for r, s in splits.items() if r != slowest])
    if others <= 0 or _step(splits[slowest]) < ratio * others:
        return None
    phase, typical = _worst_phase(slowest, splits, PHASES)
    own = splits[slowest]
    return Blame(slowest, phase, own[f"{phase}_s"], typical, _step(own), (), 0.0, "step_time")


def judge(
    splits: Mapping[int, Split],
    *,
    min_wait_s: float,
    wait_ratio: float,
    min_share: float,
    step_ratio: float,
) -> Blame | None:
    """One window's straggler from the ranks' per-step means: synchronised ranks (their step
    times within ``step_ratio`` of each other) by who waits least, else by step time."""
    steps = [_step(s) for s in splits.values()]
    if len(steps) >= 2 and min(steps) > 0 and max(steps) < step_ratio * min(steps):
        return synchronised(splits, min_wait_s, wait_ratio, min_share)
    return unsynchronised(splits, step_ratio)


# --------------------------------------------------------------------------- the culprit's GPU
# A straggler in compute or communication (or one whose phase is not known) on a GPU that NVML
# says is held back carries why (docs/contracts.md, events.jsonl, ``straggler``): the worst
# clock-event reason that slows work (xl.gpu.clocks.SLOWING), else an XID raised in the last
# XID_RECENT_S, else uncorrectable ECC errors. A GPU idle or at its applications clocks is doing
# as it was set to: no reason. A straggler waiting for data, or in its own code, is not its GPU's.
GPU_PHASES = ("compute", "comm", None)
XID_RECENT_S = 300.0
# The rank's sys line must be this recent for its GPU's figures to count (the sampler's is 1 Hz).
GPU_FRESH_S = 10.0


def _thousands(mhz: object) -> str:
    return f"{mhz:,.0f}" if isinstance(mhz, (int, float)) else "?"


def _real(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def explain_gpu(seen: Mapping[str, object] | None, phase: str | None, now: float) -> GpuPart:
    """The GPU of a straggler whose rank's last ``sys`` line (with its GPU's figures) is
    ``seen``, and why it is held back, if it is."""
    gpu = seen.get("gpu") if seen is not None else None
    if seen is None or not isinstance(gpu, int):
        return GpuPart(None)
    t = _real(seen.get("t"))
    if phase not in GPU_PHASES or t is None or now - t > GPU_FRESH_S:
        return GpuPart(gpu)
    from xl.gpu.clocks import slowing  # noqa: PLC0415 - a straggler on a GPU only: not every supervisor's start

    name = f"GPU {gpu}"
    sm = (
        f", SM {_thousands(seen.get('sm_clock_mhz'))} of "
        f"{_thousands(seen.get('sm_clock_max_mhz'))} MHz"
        if seen.get("sm_clock_mhz") is not None
        else ""
    )
    bits = seen.get("clock_event_reasons")
    reasons = slowing(bits if isinstance(bits, int) else None)
    xid, xid_t, ecc = seen.get("xid"), _real(seen.get("xid_t")), seen.get("ecc_volatile")
    if reasons:
        reason, words = reasons[0]
        temp, power = _real(seen.get("temp_c")), _real(seen.get("power_w"))
        if "thermal" in reason and temp is not None:
            words += f" at {temp:.0f} °C"
        elif reason == "sw_power_cap" and power is not None:
            limit = _real(seen.get("power_limit_w"))
            of = f" of {limit:,.0f}" if limit is not None else ""
            words += f" at {power:,.0f}{of} W"
        return GpuPart(gpu, reason, f"{name}: {words}{sm}")
    if isinstance(xid, int) and xid_t is not None and now - xid_t <= XID_RECENT_S:
        return GpuPart(gpu, "xid", f"{name}: XID {xid} {max(0.0, now - xid_t):.0f} s ago{sm}")
    if isinstance(ecc, int) and ecc > 0:
        errors = "error" if ecc == 1 else "errors"
        detail = f"{name}: {ecc} uncorrectable ECC {errors} since the driver loaded{sm}"
        return GpuPart(gpu, "ecc", detail)
    return GpuPart(gpu)


# --------------------------------------------------------------------------- what was said
# `xl runs --json`'s ``stragglers`` (docs/contracts.md): each rank named in the run, by its last
# ``straggler`` event, and whether a ``recovered`` event followed it.
SAID = ("rank", "phase", "gpu", "gpu_reason", "gpu_detail", "lasting", "since_s", "spells")


# edge: each rank's object as `xl runs RUN --json` prints it, its values as the lines held them
def said(events: Iterable[EventLine]) -> list[dict[str, Any]]:
    """Each named rank's last straggler event's fields, with ``t``, ``message`` and
    ``recovered`` (a ``recovered`` event of ``straggler`` came after it), by rank."""
    last: dict[int, dict[str, Any]] = {}
    for event in events:
        rank, kind, data = event.rank, event.kind, event.data
        if rank is None:
            continue
        if kind is EventKind.STRAGGLER:
            last[rank] = {
                **{key: data.get(key) for key in SAID},
                "t": data.get("t"),
                "message": data.get("message"),
                "recovered": False,
            }
        elif kind is EventKind.RECOVERED and event.of is EventKind.STRAGGLER and rank in last:
            last[rank]["recovered"] = True
    return [last[rank] for rank in sorted(last)]
