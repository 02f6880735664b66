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
- ``compute_s``: time inside a region (a top-level module forward with grad enabled, backward,
  ``optimizer.step``) less the waits inside it.
- ``other_s``: the rest, so that the four add up to ``step_s``.

Regions nest (a forward inside LBFGS's closure, inside ``optimizer.step``): only the outermost
one is timed. A region still open when a step ends is cut there, so no time counts twice.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from xl.integrations.report import batch_size

# A non-leading optimizer that steps this many times while the leader does not takes the lead
# (the leader was replaced, or steps less often than it).
TAKEOVER = 2
# How old a step must be before the sender reports it (see collect).
HOLD_S = 0.05
# How often a rank between steps that evaluates (DataLoader batches under no_grad) says it is alive.
EVAL_EVERY_S = 1.0
# The steps' line goes at most this often (the last steps go at once when the rank flushes or
# ends). Every line costs the rank's sender thread a wake-up with the GIL, a frame and a system
# call, and the collector a record, on cores the ranks themselves keep busy: at ten lines a second
# that was of the size of the hooks' own cost per step. The Monitor reads once a second, and the
# stall and straggler rules judge windows of seconds.
LINE_EVERY_S = 0.2


class StepClock:
    """One rank's accounting. Training-thread methods are cheap and never raise on their own."""

    def __init__(
        self, clock: Callable[[], float] = time.perf_counter, wall: Callable[[], float] = time.time
    ) -> None:
        self.clock = clock
        self.wall = wall
        self.tid = threading.main_thread().ident
        self.depth = 0  # regions open on the training thread
        self.open_start = 0.0  # when the outermost open region began (or was last cut)
        self.open_waits = 0.0  # self.waits then
        self.waits = 0.0  # data + comm waited so far, ever (to take out of regions)
        self.started: float | None = None  # the first step's start: the first thing seen
        self.last_end: float | None = None
        self.data = self.comm = self.compute = 0.0
        self.samples = 0  # from the DataLoader, this step
        self.batches = 0
        self.fwd_samples = 0  # fallback: the model's top-level forward inputs, this step
        self.model: Any = None  # weakref to the first module run at the top with grad enabled
        self.loss: Any = None  # detached tensor backward last ran on, this step
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
        # Ended steps waiting for the sender: (wall, step, loss, samples, step_s, data, compute,
        # comm, mem). Appends and pops are atomic; nothing else is shared between the threads.
        self.ended: deque[tuple[Any, ...]] = deque(maxlen=100_000)
        # DataLoader batches handed out with grad disabled (an eval loop), counted by the hook;
        # a long eval between steps is a rank at work, not a stall (see _evaluating).
        self.eval_batches = 0
        self.eval_told = 0
        self.eval_told_at = 0.0
        self.line_at = 0.0  # wall time of the last steps' line (LINE_EVERY_S)

    # -- regions -------------------------------------------------------------------------------

    def enter(self) -> float:
        """A region begins; returns its start when it is the outermost one, else -1."""
        depth = self.depth
        self.depth = depth + 1
        if depth:
            return -1.0
        now = self.clock()
        if self.started is None:
            self.started = now
        self.open_start, self.open_waits = now, self.waits
        return now

    def leave(self, start: float) -> None:
        self.depth -= 1
        if start >= 0.0:
            self.compute += self.clock() - self.open_start - (self.waits - self.open_waits)

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
        if self.started is None:
            self.started = self.clock() - seconds
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
        """backward() begins on ``tensor``: the step's loss is the last one before the step, or
        the first one inside it (LBFGS's closure)."""
        if getattr(tensor, "ndim", None) != 0:
            return
        scaled = self.scaled
        if scaled is not None and scaled[0]() is tensor:
            value = scaled[1]  # GradScaler's input: the loss before the scale
            self.scaled = None
        else:
            value = tensor
        if self.in_opt and self.loss is not None:
            return
        self.loss = value.detach()

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

    def backward_done(self) -> None:
        mark = self.mark
        if mark is not None:
            self.mark = None
            # A Work.wait() in a later final callback (FSDP2's reduce-scatter) counted already.
            self.waited(self.clock() - mark - (self.waits - self.mark_waits), data=False)

    # -- optimizer steps -------------------------------------------------------------------------

    def opt_pre(self) -> None:
        if self.in_opt and self.opt_start >= 0.0:
            # The previous optimizer.step raised and its post hook never ran: forget its region.
            self.depth, self.in_opt = self.opt_depth, 0
        self.opt_depth = self.depth
        self.in_opt += 1
        self.opt_start = self.enter()

    def opt_post(self, optimizer: Any) -> None:
        self.in_opt = max(0, self.in_opt - 1)
        if not self.leads(optimizer):
            self.leave(self.opt_start)
            self.opt_start = -1.0
            return
        now = self.clock()
        self._cut(now)
        self.depth -= 1
        self.opt_start = -1.0
        self._end(now)

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

    def _cut(self, now: float) -> None:
        # The open regions' time so far belongs to the step that ends now.
        if self.depth:
            self.compute += now - self.open_start - (self.waits - self.open_waits)
            self.open_start, self.open_waits = now, self.waits

    def _end(self, now: float) -> None:
        start = self.last_end if self.last_end is not None else self.started
        step_s = now - start if start is not None else 0.0
        self.last_end = now
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
                self.compute,
                self.comm,
                mem,
            )
        )
        self.data = self.comm = self.compute = 0.0
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
        None. Keys in ``given`` (the rank gives them itself) are left out. Unless ``final``, a
        step younger than HOLD_S waits for the next call: a script's ``xl.log(step=...)`` right
        after ``optimizer.step()`` reaches the sender first, so its keys are known to be its own."""
        now = self.wall()
        if not final and now - self.line_at < LINE_EVERY_S:  # the sender may ask more often
            return None
        ended = self.ended
        newest = now - HOLD_S
        # One pass over the steps, in locals: this runs on the sender thread, which holds the
        # GIL meanwhile (the training thread waits for it), at most five times a second.
        n = 0
        step_s = data = compute = comm = 0.0
        samples = 0
        counted = False
        loss: Any = None
        mem: float | None = None
        last: tuple[Any, ...] | None = None
        popleft = ended.popleft
        while ended:
            try:
                row = ended[0]
            except IndexError:
                break
            if not final and row[0] > newest:
                break
            popleft()
            last = row
            n += 1
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
        if last is None:
            return self._evaluating()
        other = max(0.0, step_s - data - compute - comm)
        out: dict[str, Any] = {}
        if "step" not in given:
            out["step"] = last[1]
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
        if mem is not None and "mem_peak_mib" not in given:
            out["mem_peak_mib"] = round(mem, 1)
        self.line_at = now
        return (last[0], out) if out else None

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
