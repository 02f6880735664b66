"""``xl.watch(model)``: time each rank's wait at DDP's gradient all-reduce, to name stragglers.

For each bucket: from the moment it is ready on this rank to the moment its all-reduce is done.
A slow rank arrives last and waits least; the others wait for it. While buckets are in flight
the oldest one's age is reported too, so a hung rank's peers show a growing wait.
"""

from __future__ import annotations

import threading
import time
from collections import deque


class CommWatch:
    """The comm-hook's measurements, read by the sender thread once a second."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # (time, the step's total wait) per step, appended by the hook on the last bucket.
        self.waits: deque[tuple[float, float]] = deque(maxlen=100_000)
        self.watching = False
        # Buckets handed to the all-reduce and not done yet, and since when (perf_counter) the
        # oldest of them waits.
        self.pending_count = 0
        self.pending_since: float | None = None

    def reset(self) -> None:
        """Forget the parent's measurements in a forked child (the same deque: a hook already
        registered keeps appending to it)."""
        self.waits.clear()
        self.watching = False
        self.pending_count, self.pending_since = 0, None

    def summary(self) -> dict[str, float]:
        """The comm fields of the next ``sys`` line; the step waits reported are consumed."""
        out: dict[str, float] = {}
        waits = self.waits
        if waits:
            steps = []
            while waits:
                try:
                    steps.append(waits.popleft()[1])
                except IndexError:
                    break
            out["comm_wait_s"] = round(sum(steps) / len(steps), 6)
            out["comm_wait_max_s"] = round(max(steps), 6)
            out["comm_steps"] = len(steps)
        if self.watching:
            since = self.pending_since
            out["comm_pending_s"] = round(time.perf_counter() - since, 3) if since else 0.0
        return out

    def attach(self, model: object, process_group: object = None) -> None:
        """Register the timing all-reduce as ``model``'s comm hook; on any failure (e.g. a hook
        is already registered) training goes on unwatched."""
        try:
            import torch.distributed as dist  # noqa: PLC0415 - torch is never imported at module level; a DDP model means the script loaded it
        except Exception:
            return
        waits = self.waits
        clock = time.perf_counter
        step_total = [0.0]
        lock = self.lock
        watch = self

        # What DDP's default hook does (average the bucket over the group), with one callback
        # instead of the default hook's two, since it runs once per bucket on every step.
        # No annotations: DDP inspects the hook's signature and rejects foreign ones.
        def timed_allreduce(state, bucket):  # type: ignore[no-untyped-def]
            ready = clock()
            last = bucket.is_last()
            with lock:
                if watch.pending_count == 0:
                    watch.pending_since = ready
                watch.pending_count += 1
            group = state if state is not None else dist.group.WORLD
            tensor = bucket.buffer()
            tensor.div_(dist.get_world_size(group))
            fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

            def done(f):  # type: ignore[no-untyped-def]
                end = clock()
                with lock:
                    watch.pending_count -= 1
                    if watch.pending_count <= 0:
                        watch.pending_count, watch.pending_since = 0, None
                step_total[0] += end - ready
                if last:
                    waits.append((time.time(), step_total[0]))
                    step_total[0] = 0.0
                f.value()  # re-raises a failed all-reduce into DDP, as the default hook would
                return tensor

            return fut.then(done)

        try:  # DistributedDataParallel's (torch is not imported here: read by name)
            getattr(model, "register_comm_hook")(process_group, timed_allreduce)  # noqa: B009
        except Exception:
            return
        self.watching = True
