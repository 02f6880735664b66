"""Plain PyTorch, with no code change under ``xl launch``: every rank's optimizer steps, its loss,
samples and where each step's time went (``instrument``, run by the rank entry when ``torch``
finishes loading; docs/frameworks.md, "Plain PyTorch").

The patches, each a Python call around what torch does anyway (no device sync, no ``.item()`` on
the training thread, no graph change):

- torch's global optimizer step hooks: a step is one ``optimizer.step()`` of the leading
  optimizer (``StepClock.leads``); its end ends the step's compute.
- ``torch.autograd.backward`` (``Tensor.backward`` calls it): the loss, and a
  hook on the loss that queues an autograd final callback. Final callbacks run in order, so it
  runs before DDP's reducer finalizes; from it to backward's return is the wait for the buckets.
- ``GradScaler.scale``: the loss it scaled, so the loss kept is the unscaled one.
- ``_BaseDataLoaderIter.__next__``: the wait for each batch and its size (grad enabled only, so
  an eval loop under ``no_grad`` neither counts samples nor data time).
- ``nn.Module.__call__``: a top-level forward with grad enabled may begin the step's compute;
  nested calls go straight through after one attribute check.
- ``Work.wait``: blocking collectives and ``.wait()`` on async ones are communication.
- On CUDA, the allocator's peak (host-side counters, no sync), reset at each step, and once a
  loss is a CUDA tensor, CUDA events at the same boundaries (``xl.integrations.devclock``): the
  split on the device's clock, read by the sender thread once done.

Everything is read by the client's sender thread (``xl.integrations.steplines``), one line per
slot of a quarter-second wall-clock grid at most.
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from xl import client
from xl.integrations.devclock import DeviceClock
from xl.integrations.report import batch_size
from xl.integrations.stepclock import WATCH_EVERY_S, StepClock
from xl.integrations.steplines import HOLD_S, LINE_EVERY_S, StepLines

_clock: StepClock | None = None


def clock() -> StepClock | None:
    """This process's step clock, once torch was instrumented (tests read it)."""
    return _clock


def instrument(torch: ModuleType) -> None:
    """Hook ``torch`` (just imported) so this rank reports its steps; once per process."""
    global _clock
    if _clock is not None or getattr(torch, "_xl_steps", False):
        return
    if not client.active():
        return  # nobody to send to
    steps = StepClock()
    steps.on_first_step = client.announce
    hook(torch, steps)
    torch.__dict__["_xl_steps"] = True  # the module's own attribute: instrumented once
    _clock = steps
    client.attach_steps(StepLines(steps).collect, LINE_EVERY_S, HOLD_S)


def hook(torch: ModuleType, steps: StepClock) -> Callable[[], None]:
    """Put the patches in place for ``steps``; returns what takes them out again (tests)."""
    undo = [_patch_optimizer(torch, steps)]  # without the steps there is nothing: may raise
    for patch in (_patch_backward, _patch_scaler, _patch_dataloader, _patch_module, _patch_wait):
        try:
            undo.append(patch(torch, steps))
        except Exception:  # a torch we do not know: that part of the split stays empty
            pass
    steps.memory = _cuda_peak(torch)
    if not _without_gpu(torch) and getattr(torch.cuda, "Event", None) is not None:
        # used once a loss is a CUDA tensor
        steps.cuda_clock = DeviceClock(torch.cuda)

    def unhook() -> None:
        for one in reversed(undo):
            one()

    return unhook


def _restore(owner: Any, name: str, original: Any) -> Callable[[], None]:
    return lambda: setattr(owner, name, original)


# The wrappers below run on every step (a nested module call on every call): each binds what it
# touches once, as closure variables, and asks "the training thread?" as one comparison of
# ``threading.get_ident()`` with the clock's thread id rather than through a method call.


def _patch_optimizer(torch: Any, steps: StepClock) -> Callable[[], None]:
    # torch.optim deletes its ``optimizer`` attribute; the module itself is loaded.
    optim = importlib.import_module("torch.optim.optimizer")
    get_ident, tid = threading.get_ident, steps.tid
    opt_pre, opt_post = steps.opt_pre, steps.opt_post

    def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        if get_ident() == tid:
            opt_pre()

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        if get_ident() == tid:
            opt_post(optimizer)

    handles = (
        optim.register_optimizer_step_pre_hook(pre),
        optim.register_optimizer_step_post_hook(post),
    )

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return remove


def _patch_backward(torch: Any, steps: StepClock) -> Callable[[], None]:
    autograd = torch.autograd
    original = autograd.backward
    queue_callback = torch.autograd.Variable._execution_engine.queue_callback
    get_ident, tid = threading.get_ident, steps.tid
    now = steps.clock
    graph_done, on_backward = steps.graph_done, steps.backward
    enter, backward_done = steps.enter, steps.backward_done
    dist: Any = getattr(torch, "distributed", None)
    initialized = dist.is_initialized if dist is not None and dist.is_available() else None

    def at_root(*grads: Any) -> None:
        # Runs when the loss's own node is about to run, first in the pass: the callback queued
        # now runs before the ones DDP and FSDP queue later in the same pass.
        try:
            queue_callback(graph_done)
        except Exception:
            pass

    def watch_root(root: Any) -> Any:
        # A pre-hook on the loss's node (~3 us to add and remove) rather than a hook on the loss
        # tensor (torch builds the tensor's hook dict in Python); the same moment.
        node = root.grad_fn
        try:
            return node.register_prehook(at_root)
        except Exception:  # a node type without pre-hooks
            try:
                return root.register_hook(at_root)
            except Exception:
                return None

    @functools.wraps(original)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if (steps.depth and steps.in_opt == 0) or get_ident() != tid:
            return original(tensors, *args, **kwargs)  # inside a forward (checkpointing) etc.
        if isinstance(tensors, (tuple, list)):
            root = tensors[0] if tensors else None
        else:
            root = tensors
        watch = None
        if root is not None:
            on_backward(root)
            # Only a process group's final callbacks (DDP's reducer, FSDP) wait after the graph:
            # without one, no hook. On the host's clock one call in WATCH_EVERY_S is watched, and
            # the calls in between (most of them) are told apart first, by the clock alone.
            if initialized is not None and initialized():
                at = now()
                if steps.device is None and at - steps.watched_at < WATCH_EVERY_S:
                    steps.unwatched += 1
                elif getattr(root, "requires_grad", False) and root.grad_fn is not None:
                    steps.watched_at = at
                    watch = watch_root(root)
        enter()
        steps.mark = None
        try:
            return original(tensors, *args, **kwargs)
        finally:
            if watch is not None:
                backward_done()
                watch.remove()
            steps.depth -= 1  # the region's end (StepClock.leave), without a call

    autograd.backward = backward
    return _restore(autograd, "backward", original)


def _patch_scaler(torch: Any, steps: StepClock) -> Callable[[], None]:
    cls = importlib.import_module("torch.amp.grad_scaler").GradScaler
    original = cls.scale
    original_step = cls.step
    get_ident, tid = threading.get_ident, steps.tid

    @functools.wraps(original)
    def scale(self: Any, outputs: Any) -> Any:
        out = original(self, outputs)
        if out is not outputs:  # a disabled scaler hands the loss back as it was
            steps.scale(out, outputs)
        return out

    @functools.wraps(original_step)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = steps.step
        try:
            return original_step(self, *args, **kwargs)
        finally:
            if steps.step == before and get_ident() == tid:
                steps.skipped()  # inf or NaN gradients: no step, and its loss is not the next's

    cls.scale, cls.step = scale, step

    def undo() -> None:
        cls.scale, cls.step = original, original_step

    return undo


def _patch_dataloader(torch: Any, steps: StepClock) -> Callable[[], None]:
    cls = importlib.import_module("torch.utils.data.dataloader")._BaseDataLoaderIter
    original = cls.__next__
    grad_enabled = torch.is_grad_enabled
    now = steps.clock
    get_ident, tid = threading.get_ident, steps.tid
    fetched, waited = steps.fetched, steps.waited

    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        if get_ident() != tid:
            return original(self)
        if not grad_enabled():  # an eval loop: no samples, no data time, but a sign of life
            batch = original(self)
            steps.eval_batches += 1
            return batch
        start = now()
        batch = None
        try:
            batch = original(self)
            return batch
        finally:
            seconds = now() - start
            if batch is not None:
                fetched(seconds, batch_size(batch))
            else:  # the epoch's end (StopIteration): what follows it (an eval) is not a step's work
                waited(seconds, data=True)

    cls.__next__ = __next__
    return _restore(cls, "__next__", original)


def _patch_module(torch: Any, steps: StepClock) -> Callable[[], None]:
    cls = torch.nn.Module
    original = cls.__call__
    grad_enabled = torch.is_grad_enabled
    compiling = torch.compiler.is_compiling
    get_ident, tid = threading.get_ident, steps.tid
    enter, forward = steps.enter, steps.forward
    # torch's own __call__ (``_wrapped_call_impl``) only picks the module's compiled call or its
    # ``_call_impl``: where it is the one we know, nested calls do that here, in this frame, so
    # that every layer of the model costs no second Python frame.
    direct = original is getattr(cls, "_wrapped_call_impl", None) and hasattr(cls, "_call_impl")

    @functools.wraps(original)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Nested calls (every layer of the model) stop at the first test.
        if steps.depth or get_ident() != tid or compiling() or not grad_enabled():
            if direct:
                compiled = self._compiled_call_impl
                if compiled is not None:
                    return compiled(*args, **kwargs)
                return self._call_impl(*args, **kwargs)
            return original(self, *args, **kwargs)
        enter()
        try:
            forward(self, args, kwargs)
            return original(self, *args, **kwargs)
        finally:
            steps.depth -= 1  # the region's end (StepClock.leave), without a call

    cls.__call__ = __call__
    return _restore(cls, "__call__", original)


def _patch_wait(torch: Any, steps: StepClock) -> Callable[[], None]:
    cls = torch._C._distributed_c10d.Work  # a torch built without distributed: no comm waits
    original = cls.wait
    now = steps.clock
    get_ident, tid = threading.get_ident, steps.tid
    waited = steps.waited

    @functools.wraps(original)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        if get_ident() != tid:
            return original(self, *args, **kwargs)
        device = steps.device
        before = device.record() if device is not None else None
        start = now()
        try:
            return original(self, *args, **kwargs)
        finally:
            waited(now() - start, data=False)
            if device is not None:
                device.waited(before)  # on NCCL the host returns at once: the stream waits

    cls.wait = wait
    return _restore(cls, "wait", original)


def _without_gpu(torch: Any) -> bool:
    """A torch built for neither CUDA nor ROCm: no tensor of it is ever on a GPU, so nothing of
    the device's need be asked on its steps."""
    version = getattr(torch, "version", None)
    return (
        version is not None
        and not getattr(version, "cuda", None)
        and not getattr(version, "hip", None)
    )


def _cuda_peak(torch: Any) -> Any:
    if _without_gpu(torch):
        return None  # no allocator peak, and no call on every step
    cuda = torch.cuda
    mib = 1024.0 * 1024.0

    def peak() -> float | None:
        # Host-side allocator counters: no sync. Nothing before the script uses CUDA.
        if not cuda.is_initialized():
            return None
        value = cuda.max_memory_allocated() / mib
        cuda.reset_peak_memory_stats()
        return value

    return peak
