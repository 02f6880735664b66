"""The step clock: where each optimizer step's wall time went, kept with plain arithmetic on the
training thread.

``xl.integrations.torchsteps`` calls it from torch's hooks; each ended step becomes one ``Ended``
row on ``StepClock.ended``, which the client's sender thread turns into ``train`` lines
(``xl.integrations.steplines``). Nothing here imports torch or reads a tensor: the loss stays a
detached tensor until the sender reads it. docs/frameworks.md ("Plain PyTorch") says what each
figure means.

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
from dataclasses import dataclass
from typing import Protocol

from xl.integrations.devclock import DeviceClock, Event, Timed
from xl.integrations.report import batch_size

# A non-leading optimizer that steps this many times while the leader does not takes the lead
# (the leader was replaced, or steps less often than it).
TAKEOVER = 2
# Micro-batch losses kept as tensors before they are summed into one on the training thread
# (an asynchronous tensor add, once per this many backward calls): a loop that never calls an
# optimizer (parameters updated by hand) must not keep every loss it ever had.
FOLD_LOSSES = 64
# On the host's clock, the wait after backward's graph (DDP's buckets) is timed on one backward
# call in this many seconds at most: watching one costs ~20 us of the training thread (a hook on
# the loss's node and a final callback, each a call into Python from inside the autograd engine),
# 2% of a 1 ms step. The calls in between are given the median wait of the watched ones in
# their line (xl.integrations.steplines); a step slower than this is watched every time. On the
# device's clock every call is watched (its events are the figure).
WATCH_EVERY_S = 0.05


class Loss(Protocol):
    """A loss as the clock keeps it: a 0-d tensor (torch is not imported here), read only on the
    sender thread."""

    @property
    def ndim(self) -> int: ...

    def detach(self) -> Loss: ...

    def item(self) -> float: ...

    def __add__(self, other: Loss, /) -> Loss: ...


@dataclass(slots=True)  # not frozen: a frozen one's __init__ costs the training thread 1 us more
class Ended:
    """One optimizer step as it ended on the training thread: its wall time, its number, the
    loss backward ran on (a detached tensor, a list of them, or None), samples (None: not
    counted), its wall time between optimizer steps and the host's split of it (seconds), the
    allocator's peak (MiB, CUDA), and its CUDA events when it was timed on the device."""

    wall: float
    step: int
    loss: Loss | list[Loss] | None
    samples: int | None
    step_s: float
    data_s: float
    compute_s: float
    comm_s: float
    mem_mib: float | None
    timed: Timed | None
    # The wait after backward's graph on the host's clock: its seconds over the backward calls
    # watched (in comm_s already), and how many calls were not watched (counted as compute).
    tail_s: float = 0.0
    watched: int = 0
    unwatched: int = 0


class StepClock:
    """One rank's accounting on the training thread: cheap methods the hooks call, which never
    raise on their own. What is shared with the sender thread: ``ended`` (appends and pops are
    atomic), ``eval_batches`` and ``announced`` (read there)."""

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
        # The first module run at the top with grad enabled.
        self.model: weakref.ref[object] | None = None
        # What backward ran on this step: None, one detached tensor, or a list of them (summed
        # on the sender thread).
        self.loss: Loss | list[Loss] | None = None
        # (GradScaler's output, the loss it scaled): the loss kept is the unscaled one.
        self.scaled: tuple[weakref.ref[object], Loss] | None = None
        self.mark: float | None = None  # when the autograd graph finished (final callbacks)
        self.mark_waits = 0.0  # self.waits then
        # optimizer state
        self.leader: weakref.ref[object] | None = None  # the optimizer whose steps are steps
        self.rival: weakref.ref[object] | None = None
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
        self.dev_mark: Event | None = None  # the event at the end of the autograd graph
        # The backward calls whose wait after the graph was timed (WATCH_EVERY_S): when the last
        # one was, and this step's watched wait, watched calls and calls not watched.
        self.watched_at = float("-inf")
        self.tail = 0.0
        self.watched = self.unwatched = 0
        # Ended steps waiting for the sender (xl.integrations.steplines).
        self.ended: deque[Ended] = deque(maxlen=100_000)
        # DataLoader batches handed out with grad disabled (an eval loop), counted by the hook;
        # a long eval between steps is a rank at work, not a stall (steplines.StepLines).
        self.eval_batches = 0

    # -- regions -------------------------------------------------------------------------------

    def enter(self) -> float:
        """A region begins; returns 0 or more when it is the outermost one, else -1. The clock
        is read only when the region begins the step's work: most regions come after the
        step's batch, and each read is one more call on the training thread."""
        depth = self.depth
        self.depth = depth + 1
        if depth:
            return -1.0
        device = self.device
        if self.work_at is None:
            now = self.clock()
            if self.started is None:
                self.started = now
            self.work_at, self.work_waits = now, self.waits
            if device is not None:
                device.begin(False)
            return now
        if device is not None and device.copying:
            device.region()
        return 0.0

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

    def forward(self, module: object, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
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
        if not self.samples:  # the DataLoader's batch counted already: its count is the one
            self.fwd_samples += batch_size(args) or batch_size(kwargs)

    def backward(self, tensor: Loss) -> None:
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
        elif isinstance(loss, list):
            loss.append(value.detach())
            if len(loss) >= FOLD_LOSSES:
                self.loss = _fold(loss)
        else:
            self.loss = [loss, value.detach()]

    def scale(self, out: object, loss: Loss) -> None:
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
            wait = self.clock() - mark - (self.waits - self.mark_waits)
            self.waited(wait, data=False)
            self.tail += max(0.0, wait)
            self.watched += 1
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

    def opt_post(self, optimizer: object) -> None:
        self.in_opt = max(0, self.in_opt - 1)
        self.depth -= 1
        self.opt_start = -1.0
        if not self.leads(optimizer):
            self.skipped()  # another optimizer's step (a GAN's generator): its losses were its own
            return
        self._end(self.clock())

    def leads(self, optimizer: object) -> bool:
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
            Ended(
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
                self.tail,
                self.watched,
                self.unwatched,
            )
        )
        self.tail, self.watched, self.unwatched = 0.0, 0, 0
        self.data = self.comm = 0.0
        self.samples = self.batches = self.fwd_samples = 0
        self.loss = None
        if not self.announced:
            self.announced = True
            if self.on_first_step is not None:
                self.on_first_step()


def _fold(losses: list[Loss]) -> list[Loss]:
    """``losses`` as one tensor (a list of it), added on the training thread: asynchronous on a
    device, and once per FOLD_LOSSES backward calls. Tensors that cannot be added (devices or
    shapes that differ) keep the last one only."""
    try:
        return [sum(losses[1:], losses[0])]
    except Exception:
        return [losses[-1]]
