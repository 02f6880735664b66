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
import os
import threading
from collections.abc import Iterator, Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any

from xl.atomic import write_json_atomic
from xl.figures import PHASE_KEYS
from xl.figures import finite as _finite
from xl.launcher.rundir.events import EventKind, EventLine, parse_lines
from xl.launcher.rundir.layout import EVENTS, METRICS, RunLayout
from xl.launcher.rundir.metrics import MetricKind, MetricsRow, read_rows
from xl.launcher.rundir.runrecord import RunRecord, read_object
from xl.launcher.view import timing
from xl.stats import median

VERSION = 3  # 2: each rank's step split (``ranks``); 3: its samples/s (``rank_samples_per_s``)
SERIES_POINTS = 2000  # at most this many steps kept for the loss and samples/s series
_CHUNK = 8 << 20  # metrics.jsonl is read this much at a time: memory stays bounded
_MAX_STEPS = 1_000_000  # distinct steps tracked; a file with more keeps its first ones
_BATCH = 1024  # metrics lines made rows at a time (at least jsonl.FAST_FROM: orjson reads them)


# The events the accounting reads; the rest of events.jsonl is passed over. Each kind is a
# module name here: an enum's member read off its class costs a call of the enum's own
# attribute lookup (~4x a plain one), which a digest of thousands of stalls pays per event.
_STALLED, _RECOVERED = EventKind.STALLED, EventKind.RECOVERED
_RANK_EXITED, _RESTARTED = EventKind.RANK_EXITED, EventKind.RESTARTED
_KINDS = frozenset({_STALLED, _RECOVERED, _RANK_EXITED, _RESTARTED})
_MAX_EVENTS = 100_000
_MAX_QUERIES = 32  # stalls looked at per rank, and restarts: more is a broken run's noise


class Digester:
    """Reads a run dir's events.jsonl and metrics.jsonl as they grow (a chunk at a time) and keeps
    only what the digest needs: memory stays bounded whatever the run's length.

    Each stall (of a rank) and restart (of every rank) is a moment whose neighbours are wanted:
    each rank's last train line at or before it and first one after. Every train line is checked
    against its rank's moments, so lines that come out of order (a rank's spool, merged when it
    reconnects or ends) count by their time. ``follow`` polls on a thread while the run goes
    (the supervisor), so its end reads only the rest; one ``poll`` reads a finished run whole.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._at = {EVENTS: 0, METRICS: 0}  # bytes read of each file (whole lines)
        self.events: list[EventLine] = []  # those of _KINDS, each with its time
        self.spans: dict[int, list[float]] = {}  # rank -> [its first train line's t, its last's]
        self.waited: dict[int, float] = {}
        # rank -> [samples, seconds] of its lines that gave a count and its rate (RankView's
        # run_samples_per_s: the same rule, over the whole run)
        self.counted: dict[int, list[float]] = {}
        # rank -> [steps timed, data_s, compute_s, comm_s, other_s] summed (per-step means x steps)
        self.split: dict[int, list[float]] = {}
        # step -> [its latest line's t, loss sum, loss count, samples/s sum, samples/s count]
        self.steps: dict[float, list[Any]] = {}
        self.queries: list[float] = []
        self.moments: list[EventLine] = []  # per query: its event
        self.before: list[dict[int, float]] = []  # per query: rank -> its last line at or before it
        self.after: list[dict[int, float]] = []  # per query: rank -> its first line after it
        self._of_rank: dict[int, list[int]] = {}  # a rank's stall queries
        self._every: list[int] = []  # restart queries: every rank's
        self._near: dict[int, list[int]] = {}  # a rank's queries, its stalls' and the restarts'
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- reading
    def _chunks(self, name: str) -> Iterator[list[bytes]]:
        try:
            fh = open(self.run_dir / name, "rb")  # noqa: SIM115 - closed below, read a chunk at a time
        except OSError:
            return
        with fh:
            if fh.seek(0, os.SEEK_END) < self._at[name]:
                self._at[name] = 0  # replaced or cut: read it again
            fh.seek(self._at[name])
            while data := fh.read(_CHUNK):
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    if len(data) == _CHUNK:  # a line longer than a chunk: nobody's record, skipped
                        self._at[name] += len(data)
                        continue
                    return  # a line still being written: next time
                self._at[name] += cut
                fh.seek(self._at[name])
                yield data[:cut].split(b"\n")

    def poll(self) -> None:
        """Take in what was appended since the last poll: events first, so a line after a stall
        is checked against it."""
        for lines in self._chunks(EVENTS):
            for e in parse_lines([ln for ln in lines if ln]):
                if e.kind in _KINDS and e.t is not None and len(self.events) < _MAX_EVENTS:
                    self._event(e)
        for lines in self._chunks(METRICS):
            kept = [ln for ln in lines if ln and (b'"sys"' not in ln or b"comm_wait_s" in ln)]
            # A batch's rows are gone before the next is made: fewer objects alive at once, so
            # the collector's passes over them (a row and its object each) stay short.
            for at in range(0, len(kept), _BATCH):
                self.feed(read_rows(kept[at : at + _BATCH]))

    def _event(self, e: EventLine) -> None:
        self.events.append(e)
        rank = e.rank
        if (
            e.kind is _STALLED
            and rank is not None
            and len(self._of_rank.get(rank, ())) < _MAX_QUERIES
        ):
            self._of_rank.setdefault(rank, []).append(self._query(e, [rank]))
            # Kept as it grows (rebuilding it per event cost O(ranks^2) when thousands stall).
            self._near[rank] = [*self._of_rank[rank], *self._every]
        elif e.kind is _RESTARTED and len(self._every) < _MAX_QUERIES:
            j = self._query(e, list(self.spans))
            self._every.append(j)
            for near in self._near.values():
                near.append(j)

    def _query(self, e: EventLine, ranks: list[int]) -> int:
        """A new moment (the event's); what was read already is its ``before`` where it came
        before it."""
        q = e.t or 0.0  # every event kept has its time (poll)
        self.queries.append(q)
        self.moments.append(e)
        self.before.append(
            {r: self.spans[r][1] for r in ranks if r in self.spans and self.spans[r][1] <= q}
        )
        self.after.append({})
        return len(self.queries) - 1

    def feed(self, rows: list[MetricsRow]) -> None:
        """Rows of metrics.jsonl. The hot loop of a digest (6.4M lines for 64 ranks x 100k
        steps): one dict lookup per rank and per step, no call per field."""
        spans, steps, waited = self.spans, self.steps, self.waited
        sys_kind, train_kind = MetricKind.SYS, MetricKind.TRAIN
        for rank, t, kind, rec in rows:
            if kind is sys_kind:
                wait: Any = rec.get("comm_wait_s")
                n: Any = rec.get("comm_steps")
                if _finite(wait):
                    waited[rank] = waited.get(rank, 0.0) + wait * (n if _finite(n) else 1)
                continue
            if kind is not train_kind:
                continue
            span = spans.get(rank)
            if span is None:
                spans[rank] = [t, t]
            elif t < span[0]:
                span[0] = t
            elif t > span[1]:
                span[1] = t
            near = self._near.get(rank, self._every) if self._near or self._every else None
            if near:
                self._beside(rank, t, near)
            if "step_s" in rec:
                self._split(rank, rec)
            if "samples" in rec:
                self._count(rank, rec)
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

    def _count(self, rank: int, rec: Mapping[str, Any]) -> None:
        """A line's samples and the time they took (its count over its rate), onto its rank's."""
        n: Any = rec.get("samples")
        rate: Any = rec.get("samples_per_s")
        if not (_finite(n) and _finite(rate) and n > 0 and rate > 0):
            return
        got = self.counted.get(rank)
        if got is None:
            got = self.counted[rank] = [0.0, 0.0]
        got[0] += n
        got[1] += n / rate

    def _split(self, rank: int, rec: Mapping[str, Any]) -> None:
        """A line's phases (per-step means) times the steps it stands for, onto its rank's sums."""
        parts: list[Any] = [rec.get(k) for k in PHASE_KEYS]
        if not all(_finite(v) and v >= 0 for v in parts):
            return
        n: Any = rec.get("steps")
        n = n if _finite(n) and n >= 1 else 1
        acc = self.split.get(rank)
        if acc is None:
            acc = self.split[rank] = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        acc[0] += n
        for i, v in enumerate(parts, 1):
            acc[i] += v * n
        if rec.get("clock") == "cuda":  # timed on the GPU's clock (docs/frameworks.md)
            acc[5] += n

    def _beside(self, rank: int, t: float, near: list[int]) -> None:
        for j in near:
            if t <= self.queries[j]:
                if t > self.before[j].get(rank, -math.inf):
                    self.before[j][rank] = t
            elif t < self.after[j].get(rank, math.inf):
                self.after[j][rank] = t

    # ---------------------------------------------------------------- following a live run
    def follow(self, interval: float = 2.0) -> Digester:
        """Poll every ``interval`` seconds on a thread until ``stop``."""

        def loop() -> None:
            while not self._stop.wait(interval):
                with contextlib.suppress(Exception):  # a bad line costs the digest, never the run
                    self.poll()

        self._thread = threading.Thread(target=loop, name="xl-digest", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    # ---------------------------------------------------------------- what it comes to
    def _spans(self, end: float) -> tuple[list[timing.Span], list[timing.Span]]:
        # The events each stall's end is looked for in, indexed once: a scan of every event per
        # stall cost O(ranks^2) when thousands stalled.
        recovered: dict[int, list[float]] = {}  # rank -> its `recovered` (of a stall) times
        exited: dict[int, list[float]] = {}  # rank -> its `rank_exited` times
        restarted: list[float] = []
        failed: list[float] = []  # the times of `rank_exited` with an exit code besides 0
        for f in self.events:
            kind, who, t = f.kind, f.rank, f.t or 0.0
            if kind is _RECOVERED and f.of is _STALLED and who is not None:
                recovered.setdefault(who, []).append(t)
            elif kind is _RESTARTED:
                restarted.append(t)
            elif kind is _RANK_EXITED:
                if who is not None:
                    exited.setdefault(who, []).append(t)
                if f.data.get("exit_code") not in (0, None):
                    failed.append(t)
        stalled = []
        for rank, queries in self._of_rank.items():
            for j in queries:
                # From the rank's last line before the stall was seen (its last progress: the
                # event's idle_s is rounded) to its first line after (its progress again) or its
                # end: the earliest of those after it (timing.span_end), so their order is moot.
                seen = self.queries[j]
                idle = self.moments[j].idle_s
                since = self.before[j].get(rank, seen - (idle if idle and idle > 0 else 0.0))
                ends: list[Any] = [self.after[j].get(rank)]
                for times in (recovered.get(rank, ()), restarted, exited.get(rank, ())):
                    ends += [t for t in times if t >= seen]
                stalled.append((since, timing.span_end(since, ends, end)))
        restarts = []
        before = -math.inf
        for j in self._every:
            at = self.queries[j]
            back = list(self.after[j].values())
            earliest = min((t for t in failed if before < t <= at), default=at)
            restarts.append((earliest, max(back) if back else end))
            before = at
        return stalled, restarts

    # edge: digest.json's document, written to the file and read back by load
    def doc(self, rec: RunRecord) -> dict[str, Any]:
        """The digest of what was read, for the run ``rec`` (a run still going: up to now)."""
        start = rec.started_at
        lasts = [s[1] for s in self.spans.values()]
        end = rec.ended_at or max(
            [*lasts, *(e.t or 0.0 for e in self.events)], default=start or 0.0
        )
        time_doc: dict[str, Any] | None = None
        if start is not None:
            stalled, restarts = self._spans(end)
            firsts = [s[0] for s in self.spans.values()]
            moments = timing.Moments(
                start, end, max(firsts, default=None), max(lasts, default=None), stalled, restarts
            )
            time_doc = dict(timing.account(moments))
            phases = timing.by_phase(self.split)
            if phases is not None:
                time_doc["phases"] = phases
        at = self.steps
        steps = _thin(sorted(at))
        return {
            "version": VERSION,
            "time": time_doc,
            "waited_s": {str(r): round(w, 3) for r, w in sorted(self.waited.items())},
            "ranks": {str(r): timing.rank_split(acc) for r, acc in sorted(self.split.items())},
            # each rank's samples / time in steps, where its lines counted samples
            "rank_samples_per_s": {
                str(r): round(n / took, 3) for r, (n, took) in sorted(self.counted.items())
            },
            "speed": _speed(at),
            "steps": steps,
            "loss": [round(at[s][1] / at[s][2], 6) if at[s][2] else None for s in steps],
            "samples_per_s": [round(at[s][3], 6) if at[s][4] else None for s in steps],
        }


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


def _speed(at: dict[float, list[Any]]) -> dict[str, float | None]:
    """The median step time and samples/s after warm-up (the first tenth of the steps, at least
    2)."""
    steps = sorted(at)
    post = steps[max(2, len(steps) // 10) :]
    per_step = [(at[b][0] - at[a][0]) / (b - a) for a, b in pairwise(post) if b > a]
    step_s = median(per_step) if per_step else None
    full = max((at[s][4] for s in post), default=0)
    rates = [at[s][3] for s in post if full and at[s][4] == full]
    return {"step_s": step_s, "samples_per_s": median(rates) if rates else None}


# edge: digest.json's document (doc)
def build(run_dir: Path, rec: RunRecord) -> dict[str, Any]:
    """The digest of ``run_dir`` as it is now, read whole."""
    digester = Digester(run_dir)
    digester.poll()
    return digester.doc(rec)


def _whole(doc: dict[str, Any]) -> bool:
    """digest.json as this version writes it (a damaged or foreign one is made again)."""
    steps, speed, waited = doc.get("steps"), doc.get("speed"), doc.get("waited_s")
    if (
        doc.get("version") != VERSION
        or not isinstance(steps, list)
        or not all(_finite(s) for s in steps)
    ):
        return False
    series = [doc.get("loss"), doc.get("samples_per_s")]
    if not all(
        isinstance(x, list) and len(x) == len(steps) and all(v is None or _finite(v) for v in x)
        for x in series
    ):
        return False
    if not isinstance(speed, dict) or not all(
        speed.get(k) is None or _finite(speed.get(k)) for k in ("step_s", "samples_per_s")
    ):
        return False
    time_ok = doc.get("time") is None or timing.valid(doc.get("time")) is not None
    ranks = doc.get("ranks")
    if not isinstance(ranks, dict) or not all(
        isinstance(v, dict) and all(_finite(x) for x in v.values()) for v in ranks.values()
    ):
        return False
    rates = doc.get("rank_samples_per_s")
    if not isinstance(rates, dict) or not all(_finite(r) for r in rates.values()):
        return False
    return time_ok and isinstance(waited, dict) and all(_finite(w) for w in waited.values())


# edge: digest.json's document, as the file holds it (checked whole)
def load(run_dir: Path, rec: RunRecord) -> dict[str, Any]:
    """digest.json of a finished run, made (and kept, if the run is over) when it is missing."""
    kept = read_object(RunLayout(run_dir).digest)
    if kept is not None and _whole(kept):
        return kept
    doc = build(run_dir, rec)
    if rec.final:
        with contextlib.suppress(OSError):
            write_json_atomic(RunLayout(run_dir).digest, doc)
    return doc


RankFigures = dict[int, dict[str, float]]  # rank -> what its run.json row gains at the end


def close_run(run_dir: Path, rec: RunRecord, digester: Digester | None = None) -> RankFigures:
    """At a run's end (after ``rec.end``): digest.json written, ``time`` put in ``rec``; for each
    rank's row, its ``waited_s`` (where xl.watch measured it) and ``samples_per_s`` (samples /
    time in steps, where it counted samples). ``digester``: the one that followed the run (it
    reads only the rest). A failure here costs the accounting only."""
    try:
        if digester is None:
            digester = Digester(run_dir)
        digester.stop()
        digester.poll()
        doc = digester.doc(rec)
    except Exception:  # never a reason for a run to stay "running"
        return {}
    if doc.get("time") is not None:
        rec.update(time=doc["time"])
    with contextlib.suppress(OSError):
        write_json_atomic(RunLayout(run_dir).digest, doc)
    out: RankFigures = {}
    for key, of in (("waited_s", "waited_s"), ("samples_per_s", "rank_samples_per_s")):
        for r, value in doc[of].items():
            out.setdefault(int(r), {})[key] = value
    return out


# edge: run.json's rank rows as the file holds them
def with_waits(ranks: list[dict[str, Any]], figures: RankFigures) -> list[dict[str, Any]]:
    """run.json's rank rows, each with what the end measured of it (close_run)."""
    return [{**row, **figures.get(row.get("rank", -1), {})} for row in ranks]
