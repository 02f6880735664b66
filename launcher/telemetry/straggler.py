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

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from xl.figures import PHASE_KEYS, PHASES
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

    def fields(self) -> dict[str, Any]:
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
# The rank's sys line must be this recent for its GPU's state to count (the sampler's is 1 Hz).
GPU_FRESH_S = 10.0
# A spell held this many straggler windows in a row is chronic; a second ``straggler`` event
# for the rank says so, with how long.
CHRONIC_WINDOWS = 6


def _thousands(mhz: Any) -> str:
    return f"{mhz:,.0f}" if isinstance(mhz, (int, float)) else "?"


def explain_gpu(seen: Mapping[str, Any] | None, phase: str | None, now: float) -> dict[str, Any]:
    """``gpu``, ``gpu_reason`` and ``gpu_detail`` of a straggler whose rank's last ``sys`` line
    (with its GPU's figures) is ``seen``."""
    gpu = seen.get("gpu") if seen is not None else None
    out: dict[str, Any] = {
        "gpu": gpu if isinstance(gpu, int) else None,
        "gpu_reason": None,
        "gpu_detail": None,
    }
    if seen is None or out["gpu"] is None or phase not in GPU_PHASES:
        return out
    t = seen.get("t")
    if not isinstance(t, (int, float)) or now - t > GPU_FRESH_S:
        return out
    from xl.gpu.clocks import slowing  # noqa: PLC0415 - a straggler on a GPU only: not every supervisor's start

    name = f"GPU {gpu}"
    sm = (
        f", SM {_thousands(seen.get('sm_clock_mhz'))} of "
        f"{_thousands(seen.get('sm_clock_max_mhz'))} MHz"
        if seen.get("sm_clock_mhz") is not None
        else ""
    )
    reasons = slowing(seen.get("clock_event_reasons"))
    xid, xid_t = seen.get("xid"), seen.get("xid_t")
    ecc = seen.get("ecc_volatile")
    if reasons:
        reason, words = reasons[0]
        if "thermal" in reason and isinstance(seen.get("temp_c"), (int, float)):
            words += f" at {seen['temp_c']:.0f} °C"
        elif reason == "sw_power_cap" and isinstance(seen.get("power_w"), (int, float)):
            limit = seen.get("power_limit_w")
            of = f" of {limit:,.0f}" if isinstance(limit, (int, float)) else ""
            words += f" at {seen['power_w']:,.0f}{of} W"
        out.update(gpu_reason=reason, gpu_detail=f"{name}: {words}{sm}")
    elif isinstance(xid, int) and isinstance(xid_t, (int, float)) and now - xid_t <= XID_RECENT_S:
        out.update(
            gpu_reason="xid",
            gpu_detail=f"{name}: XID {xid} {max(0.0, now - xid_t):.0f} s ago{sm}",
        )
    elif isinstance(ecc, int) and ecc > 0:
        errors = "error" if ecc == 1 else "errors"
        out.update(
            gpu_reason="ecc",
            gpu_detail=f"{name}: {ecc} uncorrectable ECC {errors} since the driver loaded{sm}",
        )
    return out


def _span(seconds: float) -> str:
    s = int(max(0.0, seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s // 60 % 60} min"


class Votes(Protocol):
    """A rank's straggler votes as the diagnoser keeps them (diagnose._Rank)."""

    straggler: bool
    straggle_votes: int
    clear_votes: int


Emit = Callable[..., None]  # (kind, rank, message, **fields)
GpuOf = Callable[[int, "str | None"], dict[str, Any]]  # (rank, phase) -> gpu, gpu_reason, ...


class Spells:
    """Naming a straggler from the 1 Hz votes, and its spells: a rank is named (a ``straggler``
    event) after ``sustain`` votes in a row and cleared (``recovered``) after as many against.
    The event says ``lasting``: ``transient`` until the spell has held ``CHRONIC_WINDOWS``
    windows, when a second ``straggler`` event says ``chronic``; ``since_s``: the spell's length
    from its first vote; ``spells``: how often the rank was named in the run, this time
    included, over ``spells_since_s``; and its GPU's part (``explain_gpu``)."""

    def __init__(self, sustain: int, window_s: float, emit: Emit, gpu: GpuOf) -> None:
        self.sustain = sustain
        self.chronic_s = CHRONIC_WINDOWS * window_s
        self._emit = emit
        self._gpu = gpu
        self._began: dict[int, float] = {}  # rank -> first vote of its current run of votes
        self._named: dict[int, list[float]] = {}  # rank -> when each of its spells began
        # rank -> its spell in force: (the rule's message, the event's fields, said chronic)
        self._said: dict[int, tuple[str, dict[str, Any], bool]] = {}

    def vote(
        self,
        st: Votes,
        rank: int,
        now: float,
        is_it: bool,
        message: Callable[[], str],
        extra: dict[str, Any],
    ) -> None:
        if is_it:
            self._began.setdefault(rank, now)
            st.clear_votes = 0
            st.straggle_votes += 1
            if not st.straggler and st.straggle_votes >= self.sustain:
                st.straggler = True
                said, fields = self._named_now(rank, now, message(), extra)
                self._emit("straggler", rank, said, **fields)
            return
        st.straggle_votes = 0
        if not st.straggler:
            self._began.pop(rank, None)
            return
        st.clear_votes += 1
        if st.clear_votes >= self.sustain:
            st.straggler = False
            st.clear_votes = 0
            self._said.pop(rank, None)
            self._began.pop(rank, None)
            self._emit("recovered", rank, f"rank {rank} is no longer a straggler", of="straggler")

    def _named_now(
        self, rank: int, now: float, message: str, extra: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        began = self._began.setdefault(rank, now)
        self._named.setdefault(rank, []).append(began)
        fields = {**extra, **self._gpu(rank, extra.get("phase")), **self._lasting(rank, now)}
        self._said[rank] = (message, fields, False)
        return self._words(message, fields), fields

    def tick(self, now: float) -> None:
        """A second ``straggler`` event for each spell that has just become chronic, with its
        GPU's part as it stands now."""
        for rank, (message, fields, said) in list(self._said.items()):
            if said or now - self._began.get(rank, now) < self.chronic_s:
                continue
            fields = {
                **fields,
                **self._gpu(rank, fields.get("phase")),
                **self._lasting(rank, now, chronic=True),
            }
            self._said[rank] = (message, fields, True)
            self._emit("straggler", rank, self._words(message, fields), **fields)

    def _lasting(self, rank: int, now: float, *, chronic: bool = False) -> dict[str, Any]:
        times = self._named.get(rank, [])
        return {
            "lasting": "chronic" if chronic else "transient",
            "since_s": round(now - self._began.get(rank, now), 1),
            "spells": len(times),
            "spells_since_s": round(now - times[0], 1) if times else 0.0,
        }

    @staticmethod
    def _words(message: str, fields: Mapping[str, Any]) -> str:
        """The rule's message, then the GPU's detail and how long it has lasted."""
        out = message
        if fields.get("gpu_detail"):
            out += f"; {fields['gpu_detail']}"
        if fields.get("lasting") == "chronic":
            out += f" (chronic: for {_span(fields['since_s'])})"
        elif fields.get("spells", 0) > 1:
            out += (
                f" (transient: the {_ordinal(fields['spells'])} time in "
                f"{_span(fields['spells_since_s'])})"
            )
        return out


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# --------------------------------------------------------------------------- what was said
# `xl runs --json`'s ``stragglers`` (docs/contracts.md): each rank named in the run, by its last
# ``straggler`` event, and whether a ``recovered`` event followed it.
SAID = ("rank", "phase", "gpu", "gpu_reason", "gpu_detail", "lasting", "since_s", "spells")


def said(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each named rank's last straggler event's fields, with ``t``, ``message`` and
    ``recovered`` (a ``recovered`` event of ``straggler`` came after it), by rank."""
    last: dict[int, dict[str, Any]] = {}
    for event in events:
        rank, kind = event.get("rank"), event.get("kind")
        if type(rank) is not int:
            continue
        if kind == "straggler":
            last[rank] = {
                **{key: event.get(key) for key in SAID},
                "t": event.get("t"),
                "message": event.get("message"),
                "recovered": False,
            }
        elif kind == "recovered" and event.get("of") == "straggler" and rank in last:
            last[rank]["recovered"] = True
    return [last[rank] for rank in sorted(last)]
