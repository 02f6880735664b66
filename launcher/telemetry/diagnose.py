"""Diagnoses from the live metrics: stalled ranks, NaN/inf loss, GPU memory, stragglers.

Fed by the collector (train records, xl.watch waits), the log parser and the sampler; ``tick()``
runs at 1 Hz. Each diagnosis (``stalled``, ``straggler``, ``recovered``, ``nan_loss``,
``gpu_mem_high``, ``supervisor_paused``) is a frozen value (diagnosis.py) until it is sent: then
it is its event (events.Diagnosis), handed to ``emit``; ``stalled`` ones go through ``on_stall``
when given (``hang.HangCapture``: it asks every rank where it is first, and words them).

Stragglers. In synchronous data parallel training every rank has the same step time: they all
wait at the gradient all-reduce. What differs is how long each rank waits there. Where the ranks'
train lines split their steps (``data_s``, ``compute_s``, ``comm_s``, ``other_s``), the rule of
straggler.py decides each tick's window: the culprit waits least while the others wait much, and
its ``phase`` is where it spends more than the others. Otherwise ``xl.watch``'s waits (from "bucket
ready on this rank" to "all-reduce done") tell the same culprit without a phase. The diagnoser
hands each tick's evidence (``Evidence``) to the votes (straggler_votes.py), which name the
straggler once it is the same rank for ``XL_STRAGGLER_SUSTAIN`` ticks running; the waiting ranks
are never named. Without either (ranks not synchronised, or nothing timed) step times are compared
directly: >= 1.2x the median.

Thresholds can be overridden through the environment (tests use short ones):
``XL_STALL_MIN_S`` (30), ``XL_STALL_FACTOR`` (10), ``XL_STRAGGLER_WINDOW_S`` (10),
``XL_STRAGGLER_SUSTAIN`` (5 ticks), ``XL_STRAGGLER_MIN_WAIT_S`` (0.02), ``XL_GPU_MEM_HIGH`` (0.95).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xl import envnames, settings
from xl.figures import PHASE_KEYS, finite, number, stamp, steps_of
from xl.launcher.rundir.events import Diagnosis as DiagnosisEvent
from xl.launcher.rundir.events import Emit, EventKind
from xl.launcher.rundir.metrics import MetricKind
from xl.launcher.telemetry.diagnosis import (
    Diagnosis,
    Evidence,
    GpuMemHigh,
    NanLoss,
    Recovered,
    Stalled,
    SupervisorPaused,
)
from xl.stats import RunningMedian, TimedWindow, fmean, median, standard_error, trimmed_mean
from xl.units import ranks_text

if TYPE_CHECKING:
    from xl.launcher.telemetry.straggler_votes import Stragglers

# The records here are the wire's (xl.wire), not rows read back: their kind is matched as the
# line spells it, MetricKind's value.
_SYS = MetricKind.SYS.value
# Ticks come once a second; one this much later than the last means this process was paused.
PAUSED_AFTER_S = 5.0


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    return settings.number(name, default, positive=True, env=env)


@dataclass
class Thresholds:
    stall_min_s: float = 30.0
    stall_factor: float = 10.0
    straggler_window_s: float = 10.0
    straggler_sustain: int = 5
    straggler_min_wait_s: float = 0.02
    straggler_wait_ratio: float = 0.5
    straggler_min_share: float = 0.1  # of their step, the others wait at least this for the culprit
    step_time_ratio: float = 1.2
    gpu_mem_high: float = 0.95
    # A quiet spell this long (and a few median steps) is looked at for a collective mismatch.
    mismatch_after_s: float = 3.0
    mismatch_steps: float = 3.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Thresholds:
        env = os.environ if env is None else env
        d = cls()
        return cls(
            stall_min_s=_env_float(env, envnames.STALL_MIN_S, d.stall_min_s),
            stall_factor=_env_float(env, envnames.STALL_FACTOR, d.stall_factor),
            straggler_window_s=_env_float(env, envnames.STRAGGLER_WINDOW_S, d.straggler_window_s),
            straggler_sustain=int(_env_float(env, envnames.STRAGGLER_SUSTAIN, d.straggler_sustain)),
            straggler_min_wait_s=_env_float(
                env, envnames.STRAGGLER_MIN_WAIT_S, d.straggler_min_wait_s
            ),
            gpu_mem_high=_env_float(env, envnames.GPU_MEM_HIGH, d.gpu_mem_high),
        )


@dataclass
class _Rank:
    last_step: float | None = None
    last_step_t: float | None = None
    last_progress_t: float | None = None
    step_times: RunningMedian = field(default_factory=RunningMedian)
    # Timed steps (train lines with the split): (t, steps, data_s, compute_s, comm_s, other_s); at
    # most ~10 lines a second come, so 512 cover the window (10 s) five times over.
    splits: TimedWindow[tuple[float, int, float, float, float, float]] = field(
        default_factory=lambda: TimedWindow(512)
    )
    waits: TimedWindow[tuple[float, float]] = field(default_factory=lambda: TimedWindow(4096))
    # The last window's (first line, last line, per-step phases): the same lines give the same.
    window: tuple[Any, Any, dict[str, float]] | None = None
    # Latest xl.watch report: (when, seconds the oldest all-reduce bucket has been pending).
    pending: tuple[float, float] | None = None
    alive: bool = True
    stalled: bool = False
    nan_reported: bool = False
    mem_high: bool = False


def _window_splits(ranks: dict[int, _Rank], since: float) -> dict[int, dict[str, float]]:
    """Each live rank's per-step phases over its window: per phase, the mean of its timed
    lines since ``since`` with the highest and lowest tenth left out, and at least the highest
    and the lowest one (one odd step, a GC pause, a checkpoint or an eval loop between epochs on
    one rank's side of the window only, would move a plain mean for the whole window, and on
    slow steps the window holds a handful of lines), and ``comm_se_s``, the
    standard error of its comm_s there (how much of a difference in waits chance explains);
    ranks with fewer than 3 lines there left out."""
    out: dict[int, dict[str, float]] = {}
    for rank, st in ranks.items():
        if not st.alive or st.stalled:
            continue
        recent = st.splits.since(since)
        if len(recent) < 3:
            continue
        memo = st.window
        # In time order the window is the newest lines: the same first and last, the same lines
        # (slow steps, a line every few seconds, leave most ranks' windows as they were).
        if memo and memo[0] is recent[0] and memo[1] is recent[-1] and st.splits.ordered:
            out[rank] = memo[2]
            continue
        cols = list(zip(*recent, strict=True))  # (t, steps, data_s, compute_s, comm_s, other_s)
        out[rank] = {key: trimmed_mean(cols[2 + i]) for i, key in enumerate(PHASE_KEYS)}
        out[rank]["comm_se_s"] = standard_error(cols[4])
        st.window = (recent[0], recent[-1], out[rank])
    return out


def _is_loss_key(key: str) -> bool:
    return key == "loss" or key.endswith("_loss") or key.startswith("loss")


class Diagnoser:
    def __init__(
        self,
        emit: Emit,
        thresholds: Thresholds | None = None,
        on_stall: Callable[[list[DiagnosisEvent]], None] | None = None,
    ) -> None:
        self._emit = emit
        # Stalled events go here instead when set: a hang capture words them with the stacks.
        self._on_stall = on_stall
        self.th = thresholds or Thresholds.from_env()
        self._ranks: dict[int, _Rank] = {}
        self._lock = threading.Lock()
        self._ticked: float | None = None  # monotonic, the last tick
        # The straggler votes: made at the first tick with evidence from two ranks.
        self._stragglers: Stragglers | None = None
        # rank -> its last sys line with its GPU's figures (what a straggler's GPU was doing)
        self._gpu_seen: dict[int, dict[str, Any]] = {}
        # Wall clock, the end of the latest pause of this process.
        self._thawed_at: float | None = None

    def _rank(self, rank: int) -> _Rank:
        st = self._ranks.get(rank)
        if st is None:
            st = self._ranks[rank] = _Rank()
        return st

    def _send(self, diagnosis: Diagnosis) -> None:
        try:
            self._emit(diagnosis.event())
        except Exception:  # the supervisor's event sink failing must not stop diagnosis
            pass

    # -- inputs -------------------------------------------------------------------------------

    # A value made per line would cost the collector's hot path an allocation a record, and
    # only a few figures of each line are read here.
    # edge: metrics lines as the wire decoded them
    def ingest(self, rank: int, records: list[dict[str, Any]]) -> None:
        """Records of ``rank`` (metrics.jsonl lines); one without a finite time is skipped, as
        every reader of the file skips it (xl.figures)."""
        with self._lock:
            st = self._rank(rank)
            for rec in records:
                # xl.figures.stamp: the rule of decode() for a line, without decoding every
                # figure of it (none but the few read below are used here).
                head = stamp(rec)
                if head is None:
                    continue
                if rec.get("kind") == _SYS:
                    self._ingest_sys(rank, st, head[1], rec)
                else:
                    self._ingest_train(rank, st, head[1], rec)

    def _ingest_train(self, rank: int, st: _Rank, t: float, rec: dict[str, Any]) -> None:
        step = number(rec.get("step"))
        # xl.figures.phases' rule (all four parts, each a finite number >= 0), as one tuple.
        get: Callable[[str], Any] = rec.get
        d, c, m, o = get("data_s"), get("compute_s"), get("comm_s"), get("other_s")
        if finite(d) and finite(c) and finite(m) and finite(o) and min(d, c, m, o) >= 0:
            st.splits.append((t, steps_of(rec), float(d), float(c), float(m), float(o)))
        if step is not None:
            if st.last_step is None or step != st.last_step:
                if st.last_step is not None and st.last_step_t is not None and step > st.last_step:
                    dt = (t - st.last_step_t) / (step - st.last_step)
                    if dt >= 0:
                        st.step_times.append(dt)
                st.last_step, st.last_step_t = step, t
                self._progress(rank, st, t, step)
        else:
            self._progress(rank, st, t, None)
        nonfinite = rec.get("nonfinite")
        if not isinstance(nonfinite, dict):
            return
        bad = [k for k in nonfinite if _is_loss_key(k)]
        if bad and not st.nan_reported:
            st.nan_reported = True
            key = bad[0]
            at = f" at step {step}" if step is not None else ""
            self._send(NanLoss(rank, f"rank {rank}: {key} is {nonfinite[key]}{at}", step, key))

    def _progress(self, rank: int, st: _Rank, t: float, step: float | None) -> None:
        st.last_progress_t = t if st.last_progress_t is None else max(st.last_progress_t, t)
        if st.stalled:
            st.stalled = False
            at = f" (step {step})" if step is not None else ""
            message = f"rank {rank} made progress again{at}"
            self._send(Recovered(rank, message, EventKind.STALLED))

    def _ingest_sys(self, rank: int, st: _Rank, t: float, rec: dict[str, Any]) -> None:
        if "gpu" in rec:
            self._gpu_seen[rank] = rec
        wait = rec.get("comm_wait_s")
        if isinstance(wait, (int, float)) and not isinstance(wait, bool):
            st.waits.append((t, float(wait)))
        pending = rec.get("comm_pending_s")
        if isinstance(pending, (int, float)) and not isinstance(pending, bool):
            st.pending = (t, float(pending))
        used, total = rec.get("gpu_mem_used_mib"), rec.get("gpu_mem_total_mib")
        if isinstance(used, (int, float)) and isinstance(total, (int, float)) and total > 0:
            frac = used / total
            if frac > self.th.gpu_mem_high and not st.mem_high:
                st.mem_high = True
                gpu = rec.get("gpu")
                message = (
                    f"rank {rank}: GPU {gpu} memory at {frac:.0%} ({used:.0f} of {total:.0f} MiB)"
                )
                self._send(GpuMemHigh(rank, message, gpu, round(frac, 4)))
            elif frac < self.th.gpu_mem_high - 0.05:
                st.mem_high = False

    def set_alive(self, rank: int, alive: bool) -> None:
        with self._lock:
            st = self._rank(rank)
            st.alive = alive

    # -- the 1 Hz pass ------------------------------------------------------------------------

    def tick(self, now: float | None = None, *, mono: float | None = None) -> None:
        now = time.time() if now is None else now
        mono = time.monotonic() if mono is None else mono
        with self._lock:
            self._notice_pause(now, mono)
            self._check_stalls(now)
            self._check_stragglers(now)

    def _check_stragglers(self, now: float) -> None:
        evidence = self._evidence(now - self.th.straggler_window_s)
        if self._stragglers is None:
            if not (
                len(evidence.splits) >= 2 or len(evidence.waits) >= 2 or len(evidence.steps) >= 2
            ):
                return
            from xl.launcher.telemetry.straggler_votes import Stragglers  # noqa: PLC0415 - once two ranks give evidence: after their torch imports, not beside them

            self._stragglers = Stragglers(self.th)
        for diagnosis in self._stragglers.check(now, evidence):
            self._send(diagnosis)

    def _evidence(self, since: float) -> Evidence:
        """The best evidence on stragglers the ranks give over the window from ``since``: their
        timed steps, else their waits at the all-reduce, else their step times (the first that
        two ranks give; the others left empty, never computed)."""
        splits = _window_splits(self._ranks, since)
        waits: dict[int, float] = {}
        steps: dict[int, float] = {}
        if len(splits) < 2:
            for rank, st in self._ranks.items():
                recent = [w for _, w in st.waits.since(since)]
                if st.alive and recent:
                    waits[rank] = fmean(recent)
        if len(splits) < 2 and len(waits) < 2:
            for rank, st in self._ranks.items():
                if st.alive and not st.stalled and len(st.step_times) >= 3:
                    steps[rank] = median(st.step_times.last(20))
        return Evidence(splits, waits, steps, self._gpu_seen)

    def _waiting_at_collective(self, now: float) -> dict[int, float]:
        """Ranks (watched by xl.watch) stuck in an all-reduce right now, and for how long."""
        out = {}
        for rank, st in self._ranks.items():
            if st.alive and st.pending is not None:
                t, pending = st.pending
                if now - t <= 5.0 and pending >= 1.0:
                    out[rank] = pending + (now - t)
        return out

    def _notice_pause(self, now: float, mono: float) -> None:
        """A tick long after the last one: this process did not run (SIGSTOP, a swapping or
        overloaded host), so the ranks' records of that time have not been read yet. Their own
        timestamps say whether they progressed once they are in; until then, each rank's idle
        time counts from the end of the pause, never from its last record before it."""
        gap = mono - self._ticked if self._ticked is not None else 0.0
        self._ticked = mono
        if gap < PAUSED_AFTER_S:
            return
        self._thawed_at = now
        message = (
            f"the supervisor itself did not run for {gap:.0f} s (stopped, or a swapping or "
            "overloaded host); the ranks are judged by their own records' times"
        )
        self._send(SupervisorPaused(message, round(gap, 1)))

    def _check_stalls(self, now: float) -> None:
        waiting: dict[int, float] | None = None
        stalled: list[Stalled] = []
        for rank, st in sorted(self._ranks.items()):
            if not st.alive or st.stalled or st.last_progress_t is None:
                continue
            limit = self.th.stall_min_s
            quiet = now - max(st.last_progress_t, self._thawed_at or 0.0)
            if quiet <= limit:
                continue  # within the least threshold: no need of the rank's median step
            if st.step_times:
                limit = max(limit, self.th.stall_factor * st.step_times.median())
            idle = now - st.last_progress_t
            if quiet <= limit:
                continue
            st.stalled = True
            if waiting is None:
                waiting = self._waiting_at_collective(now)
            at = f" after step {st.last_step:g}" if st.last_step is not None else ""
            message = f"rank {rank} made no progress for {idle:.0f} s{at}"
            said = Stalled(rank, message, round(idle, 1), st.last_step)
            if rank in waiting:
                # A victim of a hang: it sits in the all-reduce waiting for someone else.
                message += f": waiting {waiting[rank]:.0f} s at the all-reduce for another rank"
                said = Stalled(rank, message, said.idle_s, said.step, round(waiting[rank], 1))
            elif waiting and st.pending is not None:
                # Watched, not in the all-reduce, while others wait there: the one holding up.
                others = tuple(sorted(waiting))
                message += (
                    f" and is not in the all-reduce where {ranks_text(others)} "
                    f"wait{'' if len(others) > 1 else 's'} for it: rank {rank} is holding them up"
                )
                said = Stalled(rank, message, said.idle_s, said.step, holding_up=others)
            stalled.append(said)
        if stalled and self._on_stall is not None:
            self._on_stall([diagnosis.event() for diagnosis in stalled])
            return
        for diagnosis in stalled:
            self._send(diagnosis)

    def any_stalled(self) -> bool:
        with self._lock:
            return any(st.stalled for st in self._ranks.values())

    def named(self) -> dict[int, str]:
        """Each rank named ``stalled`` or ``straggler`` now (stalled first)."""
        with self._lock:
            stragglers = self._stragglers.named() if self._stragglers is not None else set()
            out = {}
            for rank, st in self._ranks.items():
                if st.stalled:
                    out[rank] = "stalled"
                elif rank in stragglers:
                    out[rank] = "straggler"
            return out

    def quiet_spell(self, now: float | None = None) -> tuple[float | None, float]:
        """(seconds since any live rank progressed, None if none did; the seconds of it after
        which a mismatch is looked for: ``mismatch_after_s``, or mismatch_steps slowest median
        steps)."""
        now = time.time() if now is None else now
        with self._lock:
            live = [
                st for st in self._ranks.values() if st.alive and st.last_progress_t is not None
            ]
            step = max((st.step_times.median() for st in live if st.step_times), default=0.0)
            idle = max(0.0, now - max(st.last_progress_t or 0.0 for st in live)) if live else None
        return idle, max(self.th.mismatch_after_s, self.th.mismatch_steps * step)


def quiet_spell(d: Diagnoser, now: float | None = None) -> tuple[float | None, float]:
    """``d.quiet_spell(now)``: what the hang capture looks at each tick."""
    return d.quiet_spell(now)
