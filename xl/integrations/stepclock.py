"""The step clock: where each optimizer step's wall time went, kept with plain arithmetic.

``xl.integrations.torchsteps`` calls it from torch's hooks on the training thread; the client's
sender thread calls ``collect`` up to ten times a second and gets, at most every LINE_EVERY_S,
one ``train`` line's scalars for the steps that ended since. Nothing here imports torch or reads
a tensor: the loss stays a detached tensor until the sender reads it. docs/frameworks.md ("Plain
PyTorch") says what each key means.

The split of a step (end of the previous step to the end of this one):

- ``data_s``: time in the DataLoader iterator's ``__next__`` (batches fetched with grad enabled).
- ``comm_s``: time waiting on communication: the tail of backward after the autograd graph is
  done (DDP's reducer waiting for its buckets) and ``Work.wait()`` (blocking collectives).
- ``other_s``: from the end of the previous step to the step's first piece of work (its first
  batch request, else its first top-level forward, backward or optimizer step), less the waits
  in between: the script's logging and checkpoints after its optimizer step.
- ``compute_s``: the rest, from that first piece of work to the end of the optimizer step less
  the waits inside it, so that tensor math between forward and backward outside any module (a
  custom loss, a metric) is compute.

Regions (a top-level module forward with grad enabled, backward, ``optimizer.step``) nest (a
forward inside LBFGS's closure, inside ``optimizer.step``): the depth tells a nested call from
an outermost one, and the outermost one's start may be the step's first piece of work.

A step's loss is the sum of the losses backward ran on since the previous optimizer step (with
``loss / n`` per micro-batch, their mean); the tensors are summed on the sender thread.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from xl.integrations.devclock import DeviceClock, fit
from xl.integrations.report import batch_size

# A non-leading optimizer that steps this many times while the leader does not takes the lead
# (the leader was replaced, or steps less often than it).
TAKEOVER = 2
# How old a step must be before the sender reports it (see collect).
HOLD_S = 0.05
# How often a rank between steps that evaluates (DataLoader batches under no_grad) says it is alive.
EVAL_EVERY_S = 1.0
# The steps' line covers the steps that ended in one slot of a wall-clock grid this wide (the
# last steps go at once when the rank flushes or ends). Every line costs the rank's sender thread
# a wake-up with the GIL, a frame and a system call, and the collector a record, on cores the
# ranks themselves keep busy: at ten lines a second that was of the size of the hooks' own cost
# per step. The Monitor reads once a second, and the stall and straggler rules judge windows of
# seconds. The grid is the same for every rank (wall time), so ranks that step together cut their
# lines after the same step and average their rates over the same steps; the sender wakes just
# after each slot is HOLD_S old (xl.client.attach_steps), so their lines arrive together too.
LINE_EVERY_S = 0.25
# Micro-batch losses kept as tensors before they are summed into one on the training thread
# (an asynchronous tensor add, once per this many backward calls): a loop that never calls an
# optimizer (parameters updated by hand) must not keep every loss it ever had.
FOLD_LOSSES = 64


class StepClock:
    """One rank's accounting. Training-thread methods are cheap and never raise on their own."""

    def __init__(
        self, clock: Callable[[], float] = time.perf_counter, wall: Callable[[], float] = time.time
    ) -> None:
        self.clock = clock
        self.wall = wall
        self.tid = threading.main_thread().ident
        self.depth = 0  # regions open on the training thread
        self.waits = 0.0  # data + comm waited so far, ever (to take out of other and compute)
        self.started: float | None = None  # the first step's start: the first thing seen
        self.last_end: float | None = None
        self.end_waits = 0.0  # self.waits at the last step's end
        self.work_at: float | None = None  # this step's first piece of work (other ends there)
        self.work_waits = 0.0  # self.waits then
        self.data = self.comm = 0.0
        self.samples = 0  # from the DataLoader, this step
        self.batches = 0
        self.fwd_samples = 0  # fallback: the model's top-level forward inputs, this step
        self.model: Any = None  # weakref to the first module run at the top with grad enabled
        # What backward ran on this step: None, one detached tensor, or a list of them (summed
        # on the sender thread).
        self.loss: Any = None
        self.scaled: tuple[Any, Any] | None = None  # (weakref to GradScaler output, unscaled loss)
        self.mark: float | None = None  # when the autograd graph finished (final callbacks)
        self.mark_waits = 0.0  # self.waits then
        # optimizer state
        self.leader: Any = None  # weakref to the optimizer whose steps are steps
        self.rival: Any = None
        self.rival_steps = 0
        self.in_opt = 0  # optimizer.step regions open
        self.opt_start = -1.0
        self.opt_depth = 0
        self.step = 0
        self.announced = False
        self.on_first_step: Callable[[], None] | None = None
        self.memory: Callable[[], float | None] | None = None  # peak MiB this step (CUDA), reset
        # The device's clock (xl.integrations.devclock): the one torch offers, and the one in use
        # once a loss was a CUDA tensor (from the step after it: a step is on one clock).
        self.cuda_clock: DeviceClock | None = None
        self.device: DeviceClock | None = None
        self.wants_device = False
        self.dev_mark: Any = None  # the event at the end of the autograd graph
        # Ended steps waiting for the sender: (wall, step, loss, samples, step_s, data, compute,
        # comm, mem, device events or None). Appends and pops are atomic; nothing else is shared
        # between the threads.
        self.ended: deque[tuple[Any, ...]] = deque(maxlen=100_000)
        # DataLoader batches handed out with grad disabled (an eval loop), counted by the hook;
        # a long eval between steps is a rank at work, not a stall (see _evaluating).
        self.eval_batches = 0
        self.eval_told = 0
        self.eval_told_at = 0.0
        self.line_cut = 0.0  # the grid point the last steps' line was cut at (LINE_EVERY_S)

    # -- regions -------------------------------------------------------------------------------

    def enter(self) -> float:
        """A region begins; returns its start when it is the outermost one, else -1."""
        depth = self.depth
        self.depth = depth + 1
        if depth:
            return -1.0
        now = self.clock()
        device = self.device
        if self.work_at is None:
            if self.started is None:
                self.started = now
            self.work_at, self.work_waits = now, self.waits
            if device is not None:
                device.begin(False)
        elif device is not None and device.copying:
            device.region()
        return now

    def leave(self, start: float) -> None:
        self.depth -= 1

    def waited(self, seconds: float, *, data: bool) -> None:
        if seconds <= 0.0:
            return
        if data:
            self.data += seconds
        else:
            self.comm += seconds
        self.waits += seconds

    # -- what the hooks report -------------------------------------------------------------------

    def fetched(self, seconds: float, samples: int) -> None:
        """A DataLoader batch of ``samples`` that took ``seconds`` to come."""
        if self.work_at is None:  # the batch was asked for: the step's work begins
            at = self.clock() - seconds
            if self.started is None:
                self.started = at
            self.work_at, self.work_waits = at, self.waits
            if self.device is not None:
                self.device.begin(True)
        self.waited(seconds, data=True)
        self.samples += samples
        self.batches += 1

    def forward(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A top-level forward with grad enabled (``module(*args, **kwargs)``): the model's batch
        size counts as samples when the step fetched no DataLoader batch (tensors made in the
        loop)."""
        model = self.model
        if model is None:
            try:
                self.model = weakref.ref(module)
            except TypeError:
                return
        elif model() is not module:
            return
        self.fwd_samples += batch_size(args) or batch_size(kwargs)

    def backward(self, tensor: Any) -> None:
        """backward() begins on ``tensor``: the step's loss is the sum of those before the step
        (its micro-batches), or the first one inside it (LBFGS's closure)."""
        if getattr(tensor, "ndim", None) != 0:
            return
        scaled = self.scaled
        if scaled is not None and scaled[0]() is tensor:
            value = scaled[1]  # GradScaler's input: the loss before the scale
            self.scaled = None
        else:
            value = tensor
        if self.device is None and self.cuda_clock is not None and getattr(value, "is_cuda", False):
            self.wants_device = True
        loss = self.loss
        if loss is None:
            self.loss = value.detach()
        elif self.in_opt:
            return
        elif type(loss) is list:
            loss.append(value.detach())
            if len(loss) >= FOLD_LOSSES:
                self.loss = _fold(loss)
        else:
            self.loss = [loss, value.detach()]

    def scale(self, out: Any, loss: Any) -> None:
        if getattr(loss, "ndim", None) == 0:
            try:
                self.scaled = (weakref.ref(out), loss)
            except TypeError:
                self.scaled = None

    def graph_done(self) -> None:
        """An autograd final callback queued first: the graph ran; what follows is the wait for
        DDP's buckets (the reducer's callback) and other final callbacks."""
        self.mark_waits = self.waits
        self.mark = self.clock()
        if self.device is not None:
            self.dev_mark = self.device.record()

    def backward_done(self) -> None:
        mark = self.mark
        if mark is not None:
            self.mark = None
            # A Work.wait() in a later final callback (FSDP2's reduce-scatter) counted already.
            self.waited(self.clock() - mark - (self.waits - self.mark_waits), data=False)
            if self.device is not None:
                self.device.waited(self.dev_mark)
                self.dev_mark = None

    # -- optimizer steps -------------------------------------------------------------------------

    def opt_pre(self) -> None:
        if self.in_opt and self.opt_start >= 0.0:
            # The previous optimizer.step raised and its post hook never ran: forget its region.
            self.depth, self.in_opt = self.opt_depth, 0
        self.opt_depth = self.depth
        self.in_opt += 1
        self.opt_start = self.enter()

    def skipped(self) -> None:
        """GradScaler skipped an optimizer step (or stepped another optimizer): the losses so
        far are no step's."""
        if not self.in_opt:
            self.loss = None

    def opt_post(self, optimizer: Any) -> None:
        self.in_opt = max(0, self.in_opt - 1)
        self.depth -= 1
        self.opt_start = -1.0
        if not self.leads(optimizer):
            self.skipped()  # another optimizer's step (a GAN's generator): its losses were its own
            return
        self._end(self.clock())

    def leads(self, optimizer: Any) -> bool:
        leader = self.leader
        current = leader() if leader is not None else None
        if current is optimizer:
            self.rival, self.rival_steps = None, 0
            return True
        if current is not None:
            rival = self.rival() if self.rival is not None else None
            if rival is optimizer:
                self.rival_steps += 1
            else:
                self.rival, self.rival_steps = weakref.ref(optimizer), 1
            if self.rival_steps < TAKEOVER:
                return False
        self.leader = weakref.ref(optimizer)
        self.rival, self.rival_steps = None, 0
        return True

    def _end(self, now: float) -> None:
        start = self.last_end if self.last_end is not None else self.started
        if start is None:
            start = now
        step_s = now - start
        work_at = self.work_at if self.work_at is not None else now
        other = max(0.0, work_at - start - (self.work_waits - self.end_waits))
        compute = max(0.0, step_s - other - self.data - self.comm)
        self.last_end, self.end_waits, self.work_at = now, self.waits, None
        timed = self.device.end() if self.device is not None else None
        if self.wants_device:
            self.device, self.wants_device = self.cuda_clock, False
        self.step += 1
        if self.batches and self.samples:
            samples: int | None = self.samples
        else:
            samples = self.fwd_samples or None
        mem = None
        if self.memory is not None:
            try:
                mem = self.memory()
            except Exception:
                self.memory = None
        self.ended.append(
            (
                self.wall(),
                self.step,
                self.loss,
                samples,
                step_s,
                self.data,
                compute,
                self.comm,
                mem,
                timed,
            )
        )
        self.data = self.comm = 0.0
        self.samples = self.batches = self.fwd_samples = 0
        self.loss = None
        if not self.announced:
            self.announced = True
            if self.on_first_step is not None:
                self.on_first_step()

    # -- the sender thread -----------------------------------------------------------------------

    def collect(
        self, given: set[str] | frozenset[str] = frozenset(), final: bool = True
    ) -> tuple[float, dict[str, Any]] | None:
        """The steps ended since the last call as one line's scalars (time of its last step), or
        None. Keys in ``given`` (the rank gives them itself) are left out. Unless ``final``, the
        line holds the steps that ended before the latest point of the LINE_EVERY_S grid that is
        HOLD_S old, and comes once per grid point: a script's ``xl.log(step=...)`` right after
        ``optimizer.step()`` reaches the sender first, so its keys are known to be its own."""
        ended = self.ended
        if final:
            newest = self.wall()
        else:
            newest = (self.wall() - HOLD_S) // LINE_EVERY_S * LINE_EVERY_S
            if newest <= self.line_cut:  # the sender may ask more often
                return None if ended else self._evaluating()
            self.line_cut = newest
        rows = _take(ended, newest, final)
        if not rows:
            return self._evaluating()
        line = _line(rows, given)
        return (rows[-1][0], line) if line else None

    def _evaluating(self) -> tuple[float, dict[str, Any]] | None:
        """No step ended since the last call. Once training began, when DataLoader batches were
        handed out under no_grad meanwhile (an eval loop) and EVAL_EVERY_S passed since the last
        such line: a line with ``eval_batches`` (how many so far) and no ``step``, which tells the
        stall rule the rank is alive. Before the first step, nothing: the rank is not training."""
        count = self.eval_batches
        if not self.announced:
            self.eval_told = count  # what came before training is not this sign of life
            return None
        if count == self.eval_told:
            return None
        now = self.wall()
        if now - self.eval_told_at < EVAL_EVERY_S:
            return None
        self.eval_told, self.eval_told_at = count, now
        return now, {"eval_batches": count}


def _fold(losses: list[Any]) -> list[Any]:
    """``losses`` as one tensor (a list of it), added on the training thread: asynchronous on a
    device, and once per FOLD_LOSSES backward calls. Tensors that cannot be added (devices or
    shapes that differ) keep the last one only."""
    try:
        return [sum(losses[1:], losses[0])]
    except Exception:
        return [losses[-1]]


def _summed(losses: list[Any]) -> float | None:
    """The sum of the losses' values, read on the sender thread (``.item()`` waits for the
    device there, never on the training thread); None when one cannot be read."""
    total = 0.0
    try:
        for loss in losses:
            total += float(loss.item())
    except Exception:
        return None
    return total


def _take(ended: deque[tuple[Any, ...]], newest: float, final: bool) -> list[tuple[Any, ...]]:
    """The ended steps up to wall time ``newest``, oldest first, taken off ``ended``. A step
    timed on the device gets its device figures once its events are done; until then it and
    the steps after it wait for a later call, unless ``final`` (the rank flushes or ends, maybe
    on the training thread, which never waits for the device): then its host figures."""
    rows = []
    while ended:
        try:
            row = ended[0]
        except IndexError:
            break
        if row[0] > newest:
            break
        timed = row[9]
        if timed is not None:
            try:
                got = timed.read()
            except Exception:  # events CUDA cannot compare (the script changed device): the host's
                got = False
            if got:
                copy, compute, comm = got
                data, compute, comm = fit(row[4], row[5] + copy, compute, comm)
                row = (*row[:5], data, compute, comm, row[8], True)
            elif got is None and not final:
                break
            else:
                if got is None:
                    timed.drop()
                row = (*row[:9], None)
        ended.popleft()
        rows.append(row)
    return rows


def _line(rows: list[tuple[Any, ...]], given: set[str] | frozenset[str]) -> dict[str, Any]:
    """One train line's scalars for ``rows`` (StepClock.ended's), less the keys in ``given``.
    This runs on the sender thread, which holds the GIL meanwhile (the training thread waits
    for it), a few times a second: one pass, in locals."""
    step_s = data = compute = comm = 0.0
    samples = 0
    counted = False
    loss: Any = None
    mem: float | None = None
    on_device = 0
    for row in rows:
        step_s += row[4]
        data += row[5]
        compute += row[6]
        comm += row[7]
        if row[2] is not None:
            loss = row[2]  # the last step's; if it ran no backward of its own, the latest
        if row[3] is not None:
            samples += row[3]
            counted = True
        if row[8] is not None and (mem is None or row[8] > mem):
            mem = row[8]
        if row[9]:
            on_device += 1
    n = len(rows)
    other = max(0.0, step_s - data - compute - comm)
    out: dict[str, Any] = {}
    if "step" not in given:
        out["step"] = rows[-1][1]
    if type(loss) is list:
        loss = _summed(loss)
    if loss is not None and "loss" not in given:
        out["loss"] = loss
    if counted and "samples" not in given:
        out["samples"] = samples
        if step_s > 0:
            out["samples_per_s"] = round(samples / step_s, 3)
    if "step_s" not in given:  # the script times its steps itself: its split is the one
        if n > 1:
            out["steps"] = n
        out["step_s"] = round(step_s / n, 6)
        out["data_s"] = round(data / n, 6)
        out["compute_s"] = round(compute / n, 6)
        out["comm_s"] = round(comm / n, 6)
        out["other_s"] = round(other / n, 6)
        if on_device * 2 > n:  # the line's steps timed on the device, most of them
            out["clock"] = "cuda"
    if mem is not None and "mem_peak_mib" not in given:
        out["mem_peak_mib"] = round(mem, 1)
    return out
