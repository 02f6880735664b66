"""Plain PyTorch, with no code change under ``xl launch``: every rank's optimizer steps, its loss,
samples and where each step's time went (``instrument``, run by the rank entry when ``torch``
finishes loading; docs/frameworks.md, "Plain PyTorch").

The patches, each a Python call around what torch does anyway (no device sync, no ``.item()`` on
the training thread, no graph change):

- torch's global optimizer step hooks: a step is one ``optimizer.step()`` of the leading
  optimizer (``StepClock.leads``); the time inside any ``optimizer.step`` is compute.
- ``torch.autograd.backward`` (``Tensor.backward`` calls it): the loss, backward's time, and a
  hook on the loss that queues an autograd final callback. Final callbacks run in order, so it
  runs before DDP's reducer finalizes; from it to backward's return is the wait for the buckets.
- ``GradScaler.scale``: the loss it scaled, so the loss kept is the unscaled one.
- ``_BaseDataLoaderIter.__next__``: the wait for each batch and its size (grad enabled only, so
  an eval loop under ``no_grad`` neither counts samples nor data time).
- ``nn.Module.__call__``: a top-level forward with grad enabled is compute; nested calls go
  straight through after one attribute check.
- ``Work.wait``: blocking collectives and ``.wait()`` on async ones are communication.
- On CUDA, the allocator's peak (host-side counters, no sync), reset at each step.

Everything is read by the client's sender thread (``StepClock.collect``) ten times a second.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from xl import client
from xl.integrations.report import batch_size
from xl.integrations.stepclock import StepClock

_clock: StepClock | None = None


def clock() -> StepClock | None:
    """This process's step clock, once torch was instrumented (tests read it)."""
    return _clock


def instrument(torch: Any) -> None:
    """Hook ``torch`` (just imported) so this rank reports its steps; once per process."""
    global _clock
    if _clock is not None or getattr(torch, "_xl_steps", False):
        return
    if not client.active():
        return  # nobody to send to
    steps = StepClock()
    steps.on_first_step = client.announce
    hook(torch, steps)
    torch._xl_steps = True
    _clock = steps
    client.attach_steps(steps.collect)


def hook(torch: Any, steps: StepClock) -> Callable[[], None]:
    """Put the patches in place for ``steps``; returns what takes them out again (tests)."""
    undo = [_patch_optimizer(torch, steps)]  # without the steps there is nothing: may raise
    for patch in (_patch_backward, _patch_scaler, _patch_dataloader, _patch_module, _patch_wait):
        try:
            undo.append(patch(torch, steps))
        except Exception:  # a torch we do not know: that part of the split stays empty
            pass
    steps.memory = _cuda_peak(torch)

    def unhook() -> None:
        for one in reversed(undo):
            one()

    return unhook


def _restore(owner: Any, name: str, original: Any) -> Callable[[], None]:
    return lambda: setattr(owner, name, original)


def _patch_optimizer(torch: Any, steps: StepClock) -> Callable[[], None]:
    # torch.optim deletes its ``optimizer`` attribute; the module itself is loaded.
    optim = importlib.import_module("torch.optim.optimizer")
    on_thread = steps.on_thread

    def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        if on_thread():
            steps.opt_pre()

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        if on_thread():
            steps.opt_post(optimizer)

    handles = (optim.register_optimizer_step_pre_hook(pre), optim.register_optimizer_step_post_hook(post))

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return remove


def _patch_backward(torch: Any, steps: StepClock) -> Callable[[], None]:
    autograd = torch.autograd
    original = autograd.backward
    engine = torch.autograd.Variable._execution_engine
    on_thread = steps.on_thread
    graph_done = steps.graph_done
    dist: Any = getattr(torch, "distributed", None)
    initialized = dist.is_initialized if dist is not None and dist.is_available() else None

    def distributed() -> bool:
        return initialized is not None and initialized()

    def at_root(grad: Any) -> None:
        # Runs when the loss's own gradient is made, first in the pass: the callback queued now
        # runs before the ones DDP and FSDP queue later in the same pass.
        try:
            engine.queue_callback(graph_done)
        except Exception:
            pass

    @functools.wraps(original)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if (steps.depth and steps.in_opt == 0) or not on_thread():
            return original(tensors, *args, **kwargs)  # inside a forward (checkpointing) etc.
        root = tensors if not isinstance(tensors, (tuple, list)) else (tensors[0] if tensors else None)
        watch = None
        if root is not None:
            steps.backward(root)
            # Only a process group's final callbacks (DDP's reducer, FSDP) wait after the graph:
            # without one, no hook (a few us a backward).
            if distributed() and getattr(root, "requires_grad", False) and root.grad_fn is not None:
                try:
                    watch = root.register_hook(at_root)
                except Exception:
                    watch = None
        start = steps.enter()
        steps.mark = None
        try:
            return original(tensors, *args, **kwargs)
        finally:
            if watch is not None:
                steps.backward_done()
                watch.remove()
            steps.leave(start)

    autograd.backward = backward
    return _restore(autograd, "backward", original)


def _patch_scaler(torch: Any, steps: StepClock) -> Callable[[], None]:
    cls = importlib.import_module("torch.amp.grad_scaler").GradScaler
    original = cls.scale

    @functools.wraps(original)
    def scale(self: Any, outputs: Any) -> Any:
        out = original(self, outputs)
        if out is not outputs:  # a disabled scaler hands the loss back as it was
            steps.scale(out, outputs)
        return out

    cls.scale = scale
    return _restore(cls, "scale", original)


def _patch_dataloader(torch: Any, steps: StepClock) -> Callable[[], None]:
    cls = importlib.import_module("torch.utils.data.dataloader")._BaseDataLoaderIter
    original = cls.__next__
    grad_enabled = torch.is_grad_enabled
    now = steps.clock
    on_thread = steps.on_thread

    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        if not grad_enabled() or not on_thread():
            return original(self)
        start = now()
        batch = None
        try:
            batch = original(self)
            return batch
        finally:
            seconds = now() - start
            steps.fetched(seconds, batch_size(batch) if batch is not None else 0)

    cls.__next__ = __next__
    return _restore(cls, "__next__", original)


def _patch_module(torch: Any, steps: StepClock) -> Callable[[], None]:
    cls = torch.nn.Module
    original = cls.__call__
    grad_enabled = torch.is_grad_enabled
    compiling = torch.compiler.is_compiling
    on_thread = steps.on_thread

    @functools.wraps(original)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if steps.depth or compiling() or not grad_enabled() or not on_thread():
            return original(self, *args, **kwargs)
        start = steps.enter()
        try:
            steps.forward(self, lambda: batch_size(args) or batch_size(kwargs))
            return original(self, *args, **kwargs)
        finally:
            steps.leave(start)

    cls.__call__ = __call__
    return _restore(cls, "__call__", original)


def _patch_wait(torch: Any, steps: StepClock) -> Callable[[], None]:
    cls = torch._C._distributed_c10d.Work  # a torch built without distributed: no comm waits
    original = cls.wait
    now = steps.clock
    on_thread = steps.on_thread
    waited = steps.waited

    @functools.wraps(original)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not on_thread():
            return original(self, *args, **kwargs)
        start = now()
        try:
            return original(self, *args, **kwargs)
        finally:
            waited(now() - start, data=False)

    cls.wait = wait
    return _restore(cls, "wait", original)


def _cuda_peak(torch: Any) -> Any:
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
