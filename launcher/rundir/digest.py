"""A finished run in brief: its time accounting, each rank's wait, its loss and speed over steps.

One pass over metrics.jsonl (after events.jsonl, which says which moments to look for) gives
everything ``xl compare`` and run.json's ``time`` need. It is made once, when the run ends (the
supervisor's finish, or ``settle`` for a run whose supervisor was gone), and kept in
``digest.json`` beside run.json, so comparing two runs of 64 ranks and 100k steps reads two small
files instead of millions of lines (bench/bench_compare.py). A run without one (still running, or
ended by an older xl) is digested on the spot. docs/compare.md explains each figure.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from xl.atomic import write_json_atomic
from xl.launcher.rundir import timing
from xl.launcher.rundir.events import EVENTS_FILE
from xl.launcher.rundir.jsonl import decode_lines
from xl.launcher.rundir.metrics import METRICS_FILE
from xl.launcher.rundir.record import RunRecord, read_object

DIGEST_FILE = "digest.json"
VERSION = 1
SERIES_POINTS = 2000  # at most this many steps kept for the loss and samples/s series
_CHUNK = 8 << 20  # metrics.jsonl is read this much at a time: memory stays bounded
_EVENTS_CAP = 64 << 20  # events.jsonl past this is not read (a hostile or broken file)
_MAX_STEPS = 1_000_000  # distinct steps tracked; a file with more keeps its first ones
_MAX_MOMENTS = 512  # stalls and restarts looked at; more is a broken run's noise


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _finite(v: Any) -> bool:
    """A number (not a bool), finite: ``v - v`` is 0 only then (inf - inf and nan - nan are nan)."""
    return (type(v) is float or type(v) is int) and v - v == 0


@dataclass
class _Scan:
    """What one pass over metrics.jsonl found."""

    queries: list[float]  # moments (sorted) whose next train line per rank is wanted
    spans: dict[int, list[float]] = field(default_factory=dict)  # rank -> [its first line's t, its last's]
    after: dict[int, list[float | None]] = field(default_factory=dict)  # rank -> per query: its first line after
    before: dict[int, list[float | None]] = field(default_factory=dict)  # rank -> per query: its last line until
    # Every train line's time by rank, kept only when there are queries (a run that stalled or
    # restarted): lines come out of order (a rank's spool is merged when it reconnects or ends).
    times: dict[int, array[float]] = field(default_factory=dict)
    waited: dict[int, float] = field(default_factory=dict)
    # step -> [its latest line's t, loss sum, loss count, samples/s sum, samples/s count]
    steps: dict[float, list[Any]] = field(default_factory=dict)

    @property
    def first(self) -> dict[int, float]:
        return {r: s[0] for r, s in self.spans.items()}

    @property
    def last(self) -> dict[int, float]:
        return {r: s[1] for r, s in self.spans.items()}

    def feed(self, records: list[Any]) -> None:
        """One chunk's records. The hot loop of a digest (6.4M lines for 64 ranks x 100k steps):
        one dict lookup per rank and per step, no call per field."""
        spans, steps, waited = self.spans, self.steps, self.waited
        times = self.times if self.queries else None
        for rec in records:
            if type(rec) is not dict:
                continue
            rank: Any = rec.get("rank")
            t: Any = rec.get("t")
            if type(rank) is not int or not _finite(t):
                continue
            kind = rec.get("kind")
            if kind == "sys":
                wait: Any = rec.get("comm_wait_s")
                n: Any = rec.get("comm_steps")
                if _finite(wait):
                    waited[rank] = waited.get(rank, 0.0) + wait * (n if _finite(n) else 1)
                continue
            if kind != "train":
                continue
            span = spans.get(rank)
            if span is None:
                spans[rank] = [t, t]
            elif t < span[0]:
                span[0] = t
            elif t > span[1]:
                span[1] = t
            if times is not None:
                if rank not in times:
                    times[rank] = array("d")
                times[rank].append(t)
            step: Any = rec.get("step")
            if not _finite(step):
                continue
            acc = steps.get(step)
            if acc is None:
                if len(steps) >= _MAX_STEPS:
                    continue
                acc = steps[step] = [t, 0.0, 0, 0.0, 0]
            elif t > acc[0]:
                acc[0] = t
            v: Any = rec.get("loss")
            if _finite(v):
                acc[1] += v
                acc[2] += 1
            v = rec.get("samples_per_s")
            if _finite(v):
                acc[3] += v
                acc[4] += 1

    def answer(self) -> None:
        """Each rank's last line until, and first line after, each query."""
        for rank, times in self.times.items():
            ordered = sorted(times)
            after: list[float | None] = []
            before: list[float | None] = []
            for q in self.queries:
                i = bisect_right(ordered, q)
                before.append(ordered[i - 1] if i > 0 else None)
                after.append(ordered[i] if i < len(ordered) else None)
            self.after[rank], self.before[rank] = after, before
        self.times.clear()


def _lines(path: Path) -> Any:
    """metrics.jsonl's complete lines, a chunk at a time (sys lines without a wait skipped unread)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below, read a chunk at a time
    except OSError:
        return
    with fh:
        rest = b""
        while True:
            data = fh.read(_CHUNK)
            if not data:
                break
            data = rest + data
            cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            yield [ln for ln in data[:cut].split(b"\n") if ln and (b'"sys"' not in ln or b"comm_wait_s" in ln)]


def scan(run_dir: Path, queries: list[float]) -> _Scan:
    out = _Scan(queries=sorted(set(queries)))
    for lines in _lines(run_dir / METRICS_FILE):
        out.feed(decode_lines(lines))
    out.answer()
    return out


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    try:
        with open(run_dir / EVENTS_FILE, "rb") as fh:
            data = fh.read(_EVENTS_CAP)
    except OSError:
        return []
    return [e for e in decode_lines(data.split(b"\n")) if isinstance(e, dict) and _num(e.get("t")) is not None]


def _moments(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[float]]:
    """The stalls (with their start) and restart moments of ``events``, and every moment whose
    next train line is wanted."""
    stalls = [e for e in events if e.get("kind") == "stalled" and isinstance(e.get("rank"), int)][:_MAX_MOMENTS]
    restarts = [float(e["t"]) for e in events if e.get("kind") == "restarted"][:_MAX_MOMENTS]
    return stalls, [float(s["t"]) for s in stalls] + restarts


def _spans(events: list[dict[str, Any]], stalls: list[dict[str, Any]], sc: _Scan, end: float) -> tuple[list[timing.Span], list[timing.Span]]:
    def next_line(rank: int, t: float, lines: dict[int, list[float | None]] = sc.after) -> float | None:
        row = lines.get(rank)
        return row[bisect_left(sc.queries, t)] if row is not None else None

    stalled = []
    for s in stalls:
        # From the rank's last line before the stall was seen (its last progress: the event's
        # idle_s is rounded) to its first line after (its progress again) or its end.
        rank, seen = s["rank"], float(s["t"])
        idle = _num(s.get("idle_s"))
        since = next_line(rank, seen, sc.before) or seen - (idle if idle is not None and idle > 0 else 0.0)
        ends = [next_line(rank, seen)]
        ends += [e["t"] for e in events if e["t"] >= seen and e.get("kind") == "recovered" and e.get("of") == "stalled" and e.get("rank") == rank]
        ends += [e["t"] for e in events if e["t"] >= seen and (e.get("kind") == "restarted" or (e.get("kind") == "rank_exited" and e.get("rank") == rank))]
        stalled.append((since, timing.span_end(since, ends, end)))
    restarts = []
    before = -math.inf
    for e in events:
        if e.get("kind") != "restarted":
            continue
        at = float(e["t"])
        failed = [f["t"] for f in events if before < f["t"] <= at and f.get("kind") == "rank_exited" and f.get("exit_code") not in (0, None)]
        back = [v for rank in sc.after if (v := next_line(rank, at)) is not None]
        restarts.append((min(failed, default=at), max(back) if back else end))
        before = at
    return stalled, restarts


def _thin(steps: list[float]) -> list[float]:
    """At most SERIES_POINTS steps, the multiples of a 1-2-5 stride: two runs of about the same
    length keep the same steps, so their losses meet at common steps."""
    stride = 1
    while True:
        for m in (1, 2, 5):
            kept = [s for s in steps if s % (stride * m) == 0]
            if len(kept) <= SERIES_POINTS:
                if len(kept) >= min(len(steps), 20):
                    return kept
                return steps[:: max(1, math.ceil(len(steps) / SERIES_POINTS))]
        stride *= 10


def _speed(sc: _Scan) -> dict[str, float | None]:
    """The median step time and samples/s after warm-up (the first tenth of the steps, at least 2)."""
    steps = sorted(sc.steps)
    post = steps[max(2, len(steps) // 10) :]
    at = sc.steps
    per_step = [(at[b][0] - at[a][0]) / (b - a) for a, b in pairwise(post) if b > a]
    step_s = statistics.median(per_step) if per_step else None
    full = max((at[s][4] for s in post), default=0)
    rates = [at[s][3] for s in post if full and at[s][4] == full]
    return {"step_s": step_s, "samples_per_s": statistics.median(rates) if rates else None}


def build(run_dir: Path, rec: RunRecord) -> dict[str, Any]:
    """The digest of ``run_dir`` as it is now (a run still going is accounted up to now)."""
    events = read_events(run_dir)
    stalls, queries = _moments(events)
    sc = scan(run_dir, queries)
    start = rec.started_at
    end = rec.ended_at or max([*sc.last.values(), *(float(e["t"]) for e in events)], default=start or 0.0)
    time_doc = None
    if start is not None:
        stalled, restarts = _spans(events, stalls, sc, end)
        firsts = list(sc.first.values())
        time_doc = timing.account(
            timing.Moments(start, end, max(firsts) if firsts else None, max(sc.last.values(), default=None), stalled, restarts)
        )
    steps = _thin(sorted(sc.steps))
    at = sc.steps

    return {
        "version": VERSION,
        "time": time_doc,
        "waited_s": {str(r): round(w, 3) for r, w in sorted(sc.waited.items())},
        "speed": _speed(sc),
        "steps": steps,
        "loss": [round(at[s][1] / at[s][2], 6) if at[s][2] else None for s in steps],
        "samples_per_s": [round(at[s][3], 6) if at[s][4] else None for s in steps],
    }


def load(run_dir: Path, rec: RunRecord) -> dict[str, Any]:
    """digest.json of a finished run, made (and kept, if the run is over) when it is missing."""
    kept = read_object(run_dir / DIGEST_FILE)
    if kept is not None and kept.get("version") == VERSION:
        return kept
    doc = build(run_dir, rec)
    if rec.final:
        with contextlib.suppress(OSError):
            write_json_atomic(run_dir / DIGEST_FILE, doc)
    return doc


def close_run(run_dir: Path, rec: RunRecord) -> dict[int, float]:
    """At a run's end (after ``rec.end``): digest.json written, ``time`` put in ``rec``; the
    wait of each rank xl.watch measured, for its row. A failure here costs the accounting only."""
    try:
        doc = build(run_dir, rec)
    except Exception:  # never a reason for a run to stay "running"
        return {}
    if doc.get("time") is not None:
        rec.update(time=doc["time"])
    with contextlib.suppress(OSError):
        write_json_atomic(run_dir / DIGEST_FILE, doc)
    return {int(r): w for r, w in doc["waited_s"].items()}


def with_waits(ranks: list[dict[str, Any]], waited: dict[int, float]) -> list[dict[str, Any]]:
    """run.json's rank rows, each measured one with its ``waited_s``."""
    return [{**row, "waited_s": waited[row["rank"]]} if row.get("rank") in waited else row for row in ranks]
