"""The steps' ``train`` lines, made on the client's sender thread from the steps the training
thread's clock recorded (``xl.integrations.stepclock``: its ``ended`` rows).

The sender calls ``StepLines.collect`` at each wake-up; it gets, at most once per slot of the
LINE_EVERY_S wall-clock grid, one line's scalars for the steps that ended since: a ``StepRow``
(the steps' figures, averaged) written out as the dict the wire's line is made of. A step timed
on the device (``xl.integrations.devclock``) gets its device figures here, once its events are
done. docs/frameworks.md ("Plain PyTorch") says what each key means.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, replace

from xl.integrations.devclock import fit
from xl.integrations.stepclock import Ended, Loss, StepClock

# How old a step must be before the sender reports it (see collect).
HOLD_S = 0.05
# How often a rank between steps that evaluates (DataLoader batches under no_grad) says it is alive.
EVAL_EVERY_S = 1.0
# The steps' line covers the steps that ended in one slot of a wall-clock grid this wide (the
# last steps go at once when the rank flushes or ends). Every line costs the rank's sender thread
# a wake-up with the GIL, a frame and a system call, and the collector a record, on cores the
# ranks themselves keep busy: at ten lines a second that is of the size of the hooks' own cost
# per step. The Monitor reads once a second, and the stall and straggler rules judge windows of
# seconds. The grid is the same for every rank (wall time), so ranks that step together cut their
# lines after the same step and average their rates over the same steps; the sender wakes just
# after each slot is HOLD_S old (xl.client.attach_steps), so their lines arrive together too.
LINE_EVERY_S = 0.25

# One line's scalars, as the wire's train line takes them (xl.client.metricline.train_line).
Scalars = dict[str, float | int | str]


@dataclass(frozen=True, slots=True)
class StepRow:
    """The steps of one line: the last one's number and wall time, their loss (the last step's
    that ran a backward) and samples (None: not counted) and their rate over the steps' own
    time, and per step on average the wall time
    between optimizer steps and its split (seconds); ``on_device``: most of them were timed on
    the device; the allocator's highest peak (MiB)."""

    t: float
    step: int
    steps: int
    loss: float | None
    samples: int | None
    samples_per_s: float | None
    step_s: float
    data_s: float
    compute_s: float
    comm_s: float
    other_s: float
    on_device: bool
    mem_peak_mib: float | None

    def scalars(self, given: Collection[str]) -> Scalars:
        """The line's scalars less the keys in ``given`` (the rank gives them itself)."""
        out: Scalars = {}
        if "step" not in given:
            out["step"] = self.step
        if self.loss is not None and "loss" not in given:
            out["loss"] = self.loss
        if self.samples is not None and "samples" not in given:
            out["samples"] = self.samples
            if self.samples_per_s is not None:
                out["samples_per_s"] = round(self.samples_per_s, 3)
        if "step_s" not in given:  # the script times its steps itself: its split is the one
            if self.steps > 1:
                out["steps"] = self.steps
            out["step_s"] = round(self.step_s, 6)
            out["data_s"] = round(self.data_s, 6)
            out["compute_s"] = round(self.compute_s, 6)
            out["comm_s"] = round(self.comm_s, 6)
            out["other_s"] = round(self.other_s, 6)
            if self.on_device:
                out["clock"] = "cuda"
        if self.mem_peak_mib is not None and "mem_peak_mib" not in given:
            out["mem_peak_mib"] = round(self.mem_peak_mib, 1)
        return out


class StepLines:
    """Turns one clock's ended steps into lines; runs on the sender thread only."""

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock
        self.line_cut = 0.0  # the grid point the last steps' line was cut at (LINE_EVERY_S)
        self.eval_told = 0
        self.eval_told_at = 0.0
        # The median wait after backward's graph of the watched backward calls (stepclock's
        # WATCH_EVERY_S), the latest line's that had one: what the calls not watched are given.
        # The median: one watched call preempted on a busy machine must not make every other
        # call of its line wait as long.
        self.tail_per_call: float | None = None

    def collect(
        self, given: Collection[str] = frozenset(), final: bool = True
    ) -> tuple[float, Scalars] | None:
        """The steps ended since the last call as one line's scalars (time of its last step), or
        None. Keys in ``given`` (the rank gives them itself) are left out. Unless ``final``, the
        line holds the steps that ended before the latest point of the LINE_EVERY_S grid that is
        HOLD_S old, and comes once per grid point: a script's ``xl.log(step=...)`` right after
        ``optimizer.step()`` reaches the sender first, so its keys are known to be its own."""
        ended = self.clock.ended
        wall = self.clock.wall
        if final:
            newest = wall()
        else:
            newest = (wall() - HOLD_S) // LINE_EVERY_S * LINE_EVERY_S
            if newest <= self.line_cut:  # the sender may ask more often
                return None if ended else self._evaluating()
            self.line_cut = newest
        rows = _take(ended, newest, final)
        if not rows:
            return self._evaluating()
        watched = [row.tail_s / row.watched for row, timed in rows if not timed and row.watched]
        if watched:
            self.tail_per_call = _median(watched)
        line = row_of(rows, self.tail_per_call).scalars(given)
        return (rows[-1][0].wall, line) if line else None

    def _evaluating(self) -> tuple[float, Scalars] | None:
        """No step ended since the last call. Once training began, when DataLoader batches were
        handed out under no_grad meanwhile (an eval loop) and EVAL_EVERY_S passed since the last
        such line: a line with ``eval_batches`` (how many so far) and no ``step``, which tells the
        stall rule the rank is alive. Before the first step, nothing: the rank is not training."""
        count = self.clock.eval_batches
        if not self.clock.announced:
            self.eval_told = count  # what came before training is not this sign of life
            return None
        if count == self.eval_told:
            return None
        now = self.clock.wall()
        if now - self.eval_told_at < EVAL_EVERY_S:
            return None
        self.eval_told, self.eval_told_at = count, now
        return now, {"eval_batches": count}


def row_of(rows: list[tuple[Ended, bool]], tail_per_call: float | None = None) -> StepRow:
    """One line's row for ``rows`` (each step and whether it was timed on the device). A backward
    call whose wait after the graph was not watched (on the host's clock) is given
    ``tail_per_call`` of it as communication rather than compute. This runs on the sender thread,
    which holds the GIL meanwhile (the training thread waits for it), a few times a second: one
    pass, in locals."""
    step_s = data = compute = comm = 0.0
    unwatched = 0
    samples = 0
    counted = False
    loss: Loss | list[Loss] | None = None
    mem: float | None = None
    on_device = 0
    for row, timed in rows:
        step_s += row.step_s
        data += row.data_s
        compute += row.compute_s
        comm += row.comm_s
        if row.loss is not None:
            loss = row.loss  # the last step's; if it ran no backward of its own, the latest
        if row.samples is not None:
            samples += row.samples
            counted = True
        if row.mem_mib is not None and (mem is None or row.mem_mib > mem):
            mem = row.mem_mib
        if timed:
            on_device += 1
        else:
            unwatched += row.unwatched
    if unwatched and tail_per_call:
        moved = min(tail_per_call * unwatched, compute)
        compute -= moved
        comm += moved
    n = len(rows)
    return StepRow(
        t=rows[-1][0].wall,
        step=rows[-1][0].step,
        steps=n,
        loss=_summed(loss) if isinstance(loss, list) else _value(loss),
        samples=samples if counted else None,
        samples_per_s=samples / step_s if counted and step_s > 0 else None,
        step_s=step_s / n,
        data_s=data / n,
        compute_s=compute / n,
        comm_s=comm / n,
        other_s=max(0.0, step_s - data - compute - comm) / n,
        on_device=on_device * 2 > n,
        mem_peak_mib=mem,
    )


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _value(loss: Loss | list[Loss] | None) -> float | None:
    """One loss's value as the tensor holds it (read on the sender thread); None when it
    cannot be read."""
    if loss is None or isinstance(loss, list):
        return None
    try:
        value = loss.item()
    except Exception:
        return None
    return value if isinstance(value, (int, float)) else None


def _summed(losses: list[Loss]) -> float | None:
    """The sum of the losses' values, read on the sender thread (``.item()`` waits for the
    device there, never on the training thread); None when one cannot be read."""
    total = 0.0
    try:
        for loss in losses:
            total += float(loss.item())
    except Exception:
        return None
    return total


def _take(ended: deque[Ended], newest: float, final: bool) -> list[tuple[Ended, bool]]:
    """The ended steps up to wall time ``newest``, oldest first, taken off ``ended``, each with
    whether its figures are the device's. A step timed on the device gets its device figures
    once its events are done; until then it and the steps after it wait for a later call,
    unless ``final`` (the rank flushes or ends, maybe on the training thread, which never waits
    for the device): then its host figures."""
    rows: list[tuple[Ended, bool]] = []
    while ended:
        try:
            row = ended[0]
        except IndexError:
            break
        if row.wall > newest:
            break
        timed = row.timed
        on_device = False
        if timed is not None:
            broken = False
            try:
                got = timed.read()
            except Exception:  # events CUDA cannot compare (the script changed device): the host's
                got, broken = None, True
            if got is not None:
                copy, compute, comm = got
                data, compute, comm = fit(row.step_s, row.data_s + copy, compute, comm)
                row = replace(row, data_s=data, compute_s=compute, comm_s=comm, timed=None)
                on_device = True
            elif not broken and not final:
                break
            elif not broken:
                timed.drop()
        ended.popleft()
        rows.append((row, on_device))
    return rows
