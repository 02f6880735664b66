"""A fake of the CUDA event and stream API xl's device clock uses (``torch.cuda.Event``), on a
fake host clock, whose events complete later than they are recorded, as a GPU's do.

    dev = FakeCuda(clock)             # clock: the host's time (the step clock's fake)
    dev.launch(0.040)                 # the host enqueues 40 ms of kernels on the stream
    dev.stream_wait(until)            # the stream waits for a collective done at ``until``
    event = dev.Event(enable_timing=True); event.record()   # done when the stream gets there

The stream runs its work in order from when it is enqueued: an event recorded now is done at
the time the stream has finished what was enqueued before it (or now, on an idle stream).
``query`` says whether the host clock has reached that; ``elapsed_time`` raises, as CUDA's does,
on an event that is not done. Every call is counted by the name of the thread that made it
(``calls``), so a test can prove that the training thread never waits for the device.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any


class FakeCuda:
    """The ``torch.cuda`` namespace as far as the device clock and the allocator peak go."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.queued_until = 0.0  # when the stream will have run everything enqueued so far
        self.calls: Counter[tuple[str, str]] = Counter()
        self.made = 0

    def _count(self, call: str) -> None:
        self.calls[(threading.current_thread().name, call)] += 1

    # -- what the test's "training" does -------------------------------------------------------

    def launch(self, seconds: float) -> None:
        self.queued_until = max(self.queued_until, self.clock()) + seconds

    def stream_wait(self, until: float) -> None:
        """The stream waits (NCCL's Work.wait, DDP's last bucket) for work done at ``until``."""
        self.queued_until = max(self.queued_until, self.clock(), until)

    # -- torch.cuda ----------------------------------------------------------------------------

    def Event(self, enable_timing: bool = False) -> FakeEvent:
        self._count("Event")
        self.made += 1
        return FakeEvent(self, enable_timing)

    def synchronize(self, device: Any = None) -> None:
        self._count("synchronize")

    def is_initialized(self) -> bool:
        return True


class FakeEvent:
    def __init__(self, cuda: FakeCuda, timing: bool) -> None:
        self.cuda = cuda
        self.timing = timing
        self.at: float | None = None  # when the stream reaches it (host time)

    def record(self, stream: Any = None) -> None:
        self.cuda._count("event.record")
        cuda = self.cuda
        self.at = max(cuda.queued_until, cuda.clock())

    def query(self) -> bool:
        self.cuda._count("event.query")
        return self.at is not None and self.cuda.clock() >= self.at

    def _done(self) -> bool:
        return self.at is not None and self.cuda.clock() >= self.at

    def elapsed_time(self, end: FakeEvent) -> float:
        self.cuda._count("event.elapsed_time")
        if not self.timing or not end.timing:
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if not (self._done() and end._done()):
            raise RuntimeError("CUDA error: device not ready")
        assert self.at is not None and end.at is not None
        return (end.at - self.at) * 1000.0

    def synchronize(self) -> None:
        self.cuda._count("event.synchronize")
