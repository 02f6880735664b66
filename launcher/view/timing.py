"""Where a run's time went: run.json's ``time``, worked out from what the run dir records.

Pure: it takes the moments the run dir holds (start and end from run.json, each rank's first and
last step from metrics.jsonl, stalls and restarts from events.jsonl) and splits the run's wall
time into parts that sum to it. ``xl.launcher.view.digest`` reads the files; this module only
decides. docs/compare.md says what each part means; in short, an instant belongs to the first of:

- restarts: from a failure until the restarted ranks log again;
- stalled: a rank was stalled (from its last progress until it made progress again, exited, or
  the run ended; a hang is a stall with its culprit named);
- startup: before every rank that logs had logged its first step;
- shutdown: after the last step;
- training: the rest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from xl.figures import PHASE_KEYS, PHASES

PARTS = ("startup_s", "training_s", "stalled_s", "restarts_s", "shutdown_s")
# The words of the one-line summary, in run.json's order.
_WORDS = {
    "startup_s": "startup",
    "training_s": "training",
    "stalled_s": "stalled",
    "restarts_s": "restarts",
    "shutdown_s": "shutdown",
}

Span = tuple[float, float]


@dataclass
class Moments:
    """What the accounting is made of (unix seconds)."""

    started_at: float
    ended_at: float
    first_step_at: float | None = None  # every rank that logged had logged its first step
    last_step_at: float | None = None  # the last step of any rank
    stalled: list[Span] = field(default_factory=list)
    restarts: list[Span] = field(default_factory=list)


def account(m: Moments) -> dict[str, float]:
    """run.json's ``time``: ``total_s`` and the five parts, which sum to it (to the millisecond)."""
    start, end = m.started_at, max(m.started_at, m.ended_at)
    parts = dict.fromkeys(PARTS, 0.0)
    if m.first_step_at is None:
        parts["startup_s"] = end - start  # no rank ever logged a step: it never got past startup
        return _rounded(parts)
    first = min(max(m.first_step_at, start), end)
    last = min(max(m.last_step_at if m.last_step_at is not None else first, first), end)
    restarts = _clip(m.restarts, start, end)
    stalled = _clip(m.stalled, start, end)
    cuts = sorted({start, end, first, last, *(x for s in (*restarts, *stalled) for x in s)})
    mids = [(a + b) / 2 for a, b in pairwise(cuts)]
    in_restarts, in_stalled = _covered(mids, restarts), _covered(mids, stalled)
    for i, (a, b) in enumerate(pairwise(cuts)):
        mid = mids[i]
        if in_restarts[i]:
            part = "restarts_s"
        elif in_stalled[i]:
            part = "stalled_s"
        elif mid < first:
            part = "startup_s"
        elif mid > last:
            part = "shutdown_s"
        else:
            part = "training_s"
        parts[part] += b - a
    return _rounded(parts)


def _clip(spans: Iterable[Span], lo: float, hi: float) -> list[Span]:
    return [
        (max(a, lo), min(b, hi))
        for a, b in spans
        if math.isfinite(a) and math.isfinite(b) and min(b, hi) > max(a, lo)
    ]


def _covered(mids: list[float], spans: list[Span]) -> list[bool]:
    """For each of ``mids`` (ascending), whether a span holds it (its ends included): a span
    holds ``t`` exactly when the latest end of the spans begun by ``t`` is ``t`` or later. One
    sweep, not a look at every span per point (thousands of ranks stalled made that
    O(ranks^2))."""
    starts = sorted(spans)
    latest = -math.inf  # the latest end of the spans begun so far
    out = []
    i = 0
    for t in mids:
        while i < len(starts) and starts[i][0] <= t:
            latest = max(latest, starts[i][1])
            i += 1
        out.append(latest >= t)
    return out


def _rounded(parts: dict[str, float]) -> dict[str, float]:
    out = {k: round(v, 3) for k, v in parts.items()}
    return {"total_s": round(sum(out.values()), 3), **out}


# edge: run.json's (or digest.json's) ``time`` object, checked: its figures as the file holds them
def valid(time: object) -> dict[str, Any] | None:
    """run.json's ``time`` when it is whole (every part a number), else None; its ``phases``
    kept when they are whole too."""
    if not isinstance(time, Mapping):
        return None
    keys = ("total_s", *PARTS)
    if not all(_number(time.get(k)) for k in keys):
        return None
    out: dict[str, Any] = {k: float(time[k]) for k in keys}
    phases = time.get("phases")
    if isinstance(phases, Mapping) and all(
        _number(phases.get(k)) for k in (*PHASE_KEYS, "steps_s")
    ):
        out["phases"] = {k: float(phases[k]) for k in (*PHASE_KEYS, "steps_s")}
    return out


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def rank_split(acc: Sequence[float]) -> dict[str, float]:
    """A rank's steps in brief (digest.json's ``ranks``): ``steps`` timed, the seconds they
    spent in each phase (each line's per-step means times its ``steps``, summed), ``step_s``,
    their mean step time, and ``cuda_steps`` when some were timed on the GPU's clock (``acc``'s
    sixth figure, where there is one)."""
    steps = acc[0]
    out: dict[str, float] = {"steps": int(steps)}
    for key, total in zip(PHASE_KEYS, acc[1:5], strict=True):
        out[key] = round(total, 3)
    out["step_s"] = round(sum(acc[1:5]) / steps, 6) if steps > 0 else 0.0
    if len(acc) > 5 and acc[5] > 0:
        out["cuda_steps"] = int(acc[5])
    return out


def clock(split: object) -> str:
    """Which clock a rank's split (digest.json's ``ranks`` entry) is on: ``cuda`` when most of
    its timed steps were timed with CUDA events, else ``host``."""
    if not isinstance(split, Mapping):
        return "host"
    on_device, steps = split.get("cuda_steps"), split.get("steps")
    if isinstance(on_device, (int, float)) and isinstance(steps, (int, float)):
        return "cuda" if on_device * 2 > steps else "host"
    return "host"


def by_phase(split: Mapping[int, Sequence[float]]) -> dict[str, float] | None:
    """run.json's ``time.phases``: where the training steps' time went, per phase, in seconds:
    the mean over the ranks that timed steps of the seconds each spent in it; ``steps_s`` is
    their sum (a rank's time in steps). None when no rank timed a step."""
    timed = [acc for acc in split.values() if acc[0] > 0]
    if not timed:
        return None
    out = {
        key: round(sum(acc[i] for acc in timed) / len(timed), 3)
        for i, key in enumerate(PHASE_KEYS, 1)
    }
    return {**out, "steps_s": round(sum(out.values()), 3)}


def per_step(split: object) -> dict[str, float] | None:
    """A rank's timed steps (digest.json's ``ranks`` entry: sums) as per-step means: ``steps``,
    ``step_s`` and each phase's seconds per step; None when it timed no step."""
    if not isinstance(split, Mapping):
        return None
    steps = split.get("steps")
    values = [split.get(k) for k in PHASE_KEYS]
    if not isinstance(steps, (int, float)) or isinstance(steps, bool) or steps <= 0:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    out = {key: round(float(v) / steps, 6) for key, v in zip(PHASE_KEYS, values, strict=True)}  # type: ignore[arg-type]
    return {"steps": int(steps), "step_s": round(sum(out.values()), 6), **out}


def run_split(ranks: object) -> dict[str, float] | None:
    """A run's per-step split (``xl compare``): each figure of per_step, the mean over its ranks
    that timed steps; None when none did."""
    per = [
        p
        for p in (per_step(v) for v in (ranks.values() if isinstance(ranks, Mapping) else ()))
        if p is not None
    ]
    if not per:
        return None
    keys = ("steps", "step_s", *PHASE_KEYS)
    out = {k: round(sum(p[k] for p in per) / len(per), 6) for k in keys}
    out["steps"] = int(out["steps"])
    return out


def split_cells(split: object) -> list[str] | None:
    """A per-step split (per_step, run_split) as the tables show it: the step time, then each
    phase's time and share, e.g. ["312 ms", "250 ms 80%", "20 ms 6%", "35 ms 11%", "7 ms 2%"]."""
    if not isinstance(split, Mapping) or not split.get("step_s"):
        return None
    step = float(split["step_s"])
    return [ms(step)] + [f"{ms(float(split[k]))} {float(split[k]) / step:.0%}" for k in PHASE_KEYS]


def ms(s: float) -> str:
    """A step's time: "7.3 ms", "312 ms", "2.41 s"."""
    if s < 0.01:
        return f"{s * 1000:.1f} ms"
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def phase_shares(split: object) -> list[tuple[str, float]] | None:
    """(phase word, its share of the steps' time 0-1) for a ``phases`` or ``ranks`` entry (keys
    data_s, compute_s, comm_s, other_s), in PHASES order; None when it has none or no time."""
    if not isinstance(split, Mapping):
        return None
    values = [split.get(k) for k in PHASE_KEYS]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values):
        return None
    total = float(sum(values))  # type: ignore[arg-type]
    if total <= 0:
        return None
    return [(word, float(v) / total) for word, v in zip(PHASES, values, strict=True)]  # type: ignore[arg-type]


def describe_phases(time: object) -> str | None:
    """The line after describe's for a run whose steps were timed, e.g. "time in steps (131 s per
    rank): data 12%, compute 70%, comm 15%, other 3%". None without ``time.phases``."""
    phases = time.get("phases") if isinstance(time, Mapping) else None
    shares = phase_shares(phases)
    if shares is None or not isinstance(phases, Mapping):
        return None
    parts = ", ".join(f"{word} {share:.0%}" for word, share in shares)
    total = phases.get("steps_s")
    per_rank = f" ({seconds(float(total))} per rank)" if isinstance(total, (int, float)) else ""
    return f"time in steps{per_rank}: {parts}"


def seconds(s: float) -> str:
    """A duration as a person reads it: 0.4 s, 14 s, 131 s, 12 min 05 s, 2 h 07 min."""
    if s < 10:
        return f"{s:.1f} s"
    if s < 600:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def describe(time: object) -> str | None:
    """The one line the plain view, ``xl attach`` and the Monitor show for a finished run, e.g.
    "time: startup 14 s (9%), training 131 s (85%), stalled 8 s (5%), shutdown 2 s (1%)";
    parts that took no time are left out. None when the run has no accounting."""
    t = valid(time)
    if t is None:
        return None
    total = t["total_s"]
    if _unsplit(t):
        return (
            f"time: {seconds(total)} (not split into startup and training: no rank logged a step)"
        )
    shown = []
    for key in PARTS:
        value = t[key]
        if value <= 0 and not (key == "training_s" and total <= 0):
            continue
        share = f" ({value / total:.0%})" if total > 0 and value / total >= 0.005 else ""
        shown.append(f"{_WORDS[key]} {seconds(value)}{share}")
    return "time: " + ", ".join(shown)


def rows(time: object) -> list[tuple[str, str]]:
    """(part, "14 s (9%)") for every part and the total, for the side-by-side tables."""
    t = valid(time)
    if t is None:
        return [(_WORDS[k], "") for k in PARTS] + [("total", "")]
    total = t["total_s"]
    out = []
    for key in PARTS:
        share = f" ({t[key] / total:.0%})" if total > 0 else ""
        if key == "startup_s" and _unsplit(t):
            share = " (no step logged)"
        out.append((_WORDS[key], seconds(t[key]) + share))
    return [*out, ("total", seconds(total))]


def _unsplit(t: Mapping[str, float]) -> bool:
    """No rank logged a step (see account): all of it is startup in the record, which a person
    must not read as a run that never got going; a script that prints no progress xl reads
    trains all the same."""
    return t["total_s"] > 0 and t["startup_s"] >= t["total_s"]


def span_end(start: float, candidates: Iterable[object], fallback: float) -> float:
    """The earliest of ``candidates`` (numbers or None) after ``start``, else ``fallback``."""
    later = [float(c) for c in candidates if isinstance(c, (int, float)) and c > start]
    return min(later) if later else fallback
