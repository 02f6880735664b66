"""Is the run stalled? The one rule that lets a stacks verdict name a culprit.

One snapshot of stacks cannot tell a hang from a rank that is merely behind: in a healthy run one
rank is always a little later into the all-reduce than the others. So ``xl stacks``, the
Monitor's stacks view and the hang capture all ask here first, and a verdict names a culprit only
when the run is stalled: no rank has made progress for the stall threshold, or the hang
diagnosis fired (a ``hang`` event that no rank has recovered from since). Otherwise the verdict
says the ranks are progressing (docs/launch.md, "Hangs").

Progress is what the diagnoser counts (a rank's ``train`` records in metrics.jsonl: ``xl.log``,
parsed Trainer dicts, tqdm bars), with the same threshold per rank: ``XL_STALL_MIN_S`` (30 s), or
``XL_STALL_FACTOR`` (10) times the rank's median step time when that is longer. A rank that logs
nothing still progresses when its Flight Recorder shows a collective begun within the threshold.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xl.figures import number
from xl.launcher.rundir.events import EventKind, newest_events
from xl.launcher.rundir.lastbytes import last_lines
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.metrics import MetricKind, read_rows
from xl.launcher.stacks.model import RankStacks, Verdict
from xl.launcher.stacks.verdict import BUSY_WINDOW_S, mismatch, verdict
from xl.launcher.telemetry.diagnose import Thresholds
from xl.stats import median
from xl.units import ranks_text

# Only the end of the files is read: the newest record of each rank is what counts.
_METRICS_TAIL = 4 << 20
_EVENTS_TAIL = 1 << 20
_STEP_TIMES = 200  # as the diagnoser keeps per rank


@dataclass(frozen=True)
class Progress:
    """``stalled``: True (a culprit may be named), False (progressing), None (nothing tells);
    ``message``: the verdict's message when it is not True; ``due_s``: when it is False, in how
    many seconds the last of the progressing ranks reaches its threshold if it makes no more
    progress (a hang's other ranks stall a step or so after its culprit)."""

    stalled: bool | None
    message: str = ""
    due_s: float | None = None


STALLED = Progress(True)  # what a caller that knows the run is stalled passes


def _records(run_dir: Path) -> dict[int, tuple[float, float]]:
    """rank -> (its newest train record's time, its stall threshold's step-time part)."""
    last: dict[int, float] = {}
    steps: dict[int, tuple[float, float]] = {}
    dts: dict[int, list[float]] = {}
    for rank, t, kind, rec in read_rows(last_lines(RunLayout(run_dir).metrics, _METRICS_TAIL)):
        if kind is not MetricKind.TRAIN:
            continue
        step = number(rec.get("step"))
        last[rank] = max(last.get(rank, t), t)
        if step is not None:
            before = steps.get(rank)
            if before is not None and step > before[0] and t >= before[1]:
                dts.setdefault(rank, []).append((t - before[1]) / (step - before[0]))
            if before is None or step != before[0]:
                steps[rank] = (step, t)
    return {r: (t, median(dts[r][-_STEP_TIMES:]) if dts.get(r) else 0.0) for r, t in last.items()}


def recent_cpu(run_dir: Path, now: float) -> dict[int, float]:
    """rank -> its mean CPU (percent of one core, with its children) since its last progress, over
    the BUSY_WINDOW_S before ``now`` at most, from the sampler's ``sys`` records; ranks with fewer
    than 3 of them there are left out.

    A record's figure is the CPU used since the record before it, so a record counts only when
    that one is no older than the last progress: the first record after a rank's last step
    still holds the step's work, and a rank that went to sleep right after it must not read as
    working (at a stall threshold of a few seconds it would be a third of the mean)."""
    samples: dict[int, list[tuple[float, float]]] = {}
    progressed: dict[int, float] = {}
    for rank, t, kind, rec in read_rows(last_lines(RunLayout(run_dir).metrics, _METRICS_TAIL)):
        if kind is MetricKind.TRAIN:
            progressed[rank] = max(progressed.get(rank, t), t)
        elif (
            kind is MetricKind.SYS
            and (cpu := number(rec.get("cpu_pct"))) is not None
            and t <= now + 1
        ):
            samples.setdefault(rank, []).append((t, cpu))
    out = {}
    for rank, seen in samples.items():
        seen.sort()
        last = progressed.get(rank, float("-inf"))
        since = [
            cpu
            for (before, _), (t, cpu) in zip([(float("-inf"), 0.0), *seen], seen, strict=False)
            if before >= last and t >= now - BUSY_WINDOW_S
        ]
        if len(since) >= 3:
            out[rank] = round(sum(since) / len(since), 1)
    return out


def hang_open(run_dir: Path) -> bool:
    """A ``hang`` event that no ``recovered`` (of a stall) has followed."""
    open_ = False
    for event in newest_events(run_dir, _EVENTS_TAIL):
        if event.kind is EventKind.HANG:
            open_ = True
        elif event.kind is EventKind.RECOVERED and event.of is EventKind.STALLED:
            open_ = False
    return open_


def _collective_times(entries: Sequence[RankStacks]) -> dict[int, float]:
    """rank -> when its newest collective began, for ranks whose Flight Recorder tells."""
    out: dict[int, float] = {}
    for e in entries:
        times = [float(c.t) for c in e.collectives if c.t is not None and c.t > 0]
        if e.rank is not None and times:
            out[e.rank] = max(times)
    return out


def judge(
    run_dir: Path,
    ranks: Sequence[int],
    entries: Sequence[RankStacks] = (),
    *,
    now: float | None = None,
    thresholds: Thresholds | None = None,
) -> Progress:
    """Whether the run of ``run_dir`` is stalled, judged over its live ``ranks`` (run.json's)
    and the stacks ``entries`` just asked (their Flight Recorder times)."""
    now = time.time() if now is None else now
    th = thresholds or Thresholds.from_env()
    if hang_open(run_dir):
        return STALLED
    records = _records(run_dir)
    began = _collective_times(entries)
    idle: dict[int, float] = {}
    limits: dict[int, float] = {}
    for rank in ranks:
        limit = th.stall_min_s
        seen: list[float] = []
        if rank in records:
            t, step_s = records[rank]
            limit = max(limit, th.stall_factor * step_s)
            seen.append(t)
        if rank in began:
            seen.append(began[rank])
        if seen:
            idle[rank], limits[rank] = max(0.0, now - max(seen)), limit
    moving = sorted(r for r in idle if idle[r] <= limits[r])
    if not idle:
        return Progress(
            None,
            "no culprit named: no rank reports progress (xl.log, a Trainer or tqdm line) or a "
            "collective xl can see, so a hang cannot be told from a slow step",
        )
    if not moving:
        return STALLED
    window = max(limits[r] for r in moving)
    due = max(limits[r] - idle[r] for r in moving)
    if len(moving) == len(ranks):
        return Progress(False, f"no hang: every rank progressed in the last {window:.0f} s", due)
    notes = []
    quiet = sorted(r for r in idle if r not in moving)
    if quiet:
        notes.append(f"{ranks_text(quiet)}: none for {min(idle[r] for r in quiet):.0f} s")
    silent = sorted(r for r in ranks if r not in idle)
    if silent:
        notes.append(f"{ranks_text(silent)} report{'' if len(silent) > 1 else 's'} none")
    return Progress(
        False,
        f"no hang: {ranks_text(moving)} progressed in the last {window:.0f} s ({'; '.join(notes)})",
        due,
    )


def judged(entries: Sequence[RankStacks], progress: Progress) -> Verdict:
    """The stacks document's ``verdict``: who the others wait for only when the run is stalled,
    or at once when the collectives recorded can never match (a mismatch: no wait tells more)."""
    found = mismatch(entries)
    if found is not None:
        return found
    if progress.stalled:
        return verdict(entries)
    return Verdict((), progress.message)
