"""The step split on the GPU's own clock: CUDA events at the phase boundaries the step clock
already sees, read on the sender thread once they are done.

A CUDA kernel returns to Python at once and ``Work.wait()`` on an NCCL collective only makes
the compute stream wait, so host time says where the host waited, not where the device spent
its time. Once a rank's loss is a CUDA tensor, ``xl.integrations.stepclock`` has this clock
record a ``torch.cuda.Event(enable_timing=True)`` on the current stream at each boundary:

- the step's first piece of work (the batch handed over, else its first top-level region);
- the first top-level region after a batch was handed over (what lies between the two is the
  batch's copy to the device);
- before and after each wait on communication: the tail of backward after the autograd graph
  (DDP's reducer makes the stream wait for its last buckets) and ``Work.wait()``;
- the end of the optimizer step.

Recording an event only enqueues it; nothing here synchronizes, and ``query`` and
``elapsed_time`` run only on the sender thread (``Timed.read``), for a step whose events are all
done. A step whose events are not done yet is reported later, never waited for. Events come
from a pool and go back to it once read. docs/frameworks.md ("On CUDA") says what each figure
is on this clock.
"""

from __future__ import annotations

from collections import deque
from types import ModuleType
from typing import Protocol

# Events in flight at most (about six a step): a device that many steps behind, or a sender that
# cannot keep up, leaves the steps after it on the host's clock rather than growing the pool.
MAX_EVENTS = 4096


class Event(Protocol):
    """A ``torch.cuda.Event(enable_timing=True)`` as this clock uses it."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end: Event) -> float: ...


class DeviceClock:
    """One rank's CUDA events: recorded on the training thread, read on the sender thread."""

    def __init__(self, cuda: ModuleType) -> None:
        self.cuda = cuda  # torch.cuda (tests: tests/support/fakecudaevents.py)
        self.free: deque[Event] = deque()  # events read and done with: appends, pops are atomic
        self.dropped: deque[Timed] = deque()  # steps sent on the host's clock, events in flight
        self.made = 0
        self.start: Event | None = None  # this step's first piece of work
        self.copy_end: Event | None = None  # the first region after the batch: its copy ends there
        self.copying = False
        self.pairs: list[tuple[Event, Event]] = []  # (before, after) each wait on communication
        self.lost = False  # an event could not be had this step: the step stays on the host

    def record(self) -> Event | None:
        """An event recorded now on the current stream (None when the pool is spent)."""
        free = self.free
        event: Event
        try:
            event = free.pop()
        except IndexError:
            if self.made >= MAX_EVENTS:
                self.lost = True
                return None
            self.made += 1
            event = self.cuda.Event(enable_timing=True)
        event.record()
        return event

    def begin(self, batch: bool) -> None:
        """The step's first piece of work: a batch handed over (``batch``) or a region."""
        self.start = self.record()
        self.copying = batch

    def region(self) -> None:
        """A top-level region begins after the batch was handed over: its copy is done."""
        self.copying = False
        self.copy_end = self.record()

    def waited(self, before: Event | None) -> None:
        """A wait on communication that began at ``before`` (an event of ``record``) ends now."""
        if before is not None:
            after = self.record()
            if after is not None:  # else the pool is spent: the step stays on the host's clock
                self.pairs.append((before, after))

    def end(self) -> Timed | None:
        """The optimizer step ended: this step's events, to be read once done (None when the
        step could not be timed on the device: it began before the clock did, or the pool was
        spent)."""
        last = self.record()
        start, copy_end, pairs, lost = self.start, self.copy_end, self.pairs, self.lost
        self.start = self.copy_end = None
        self.copying = self.lost = False
        self.pairs = []
        if lost or start is None or last is None:
            return None
        return Timed(self, start, copy_end, pairs, last)


class Timed:
    """One step's events; ``read`` on the sender thread."""

    __slots__ = ("clock", "copy_end", "end", "pairs", "start")

    def __init__(
        self,
        clock: DeviceClock,
        start: Event,
        copy_end: Event | None,
        pairs: list[tuple[Event, Event]],
        end: Event,
    ) -> None:
        self.clock, self.start, self.copy_end = clock, start, copy_end
        self.pairs, self.end = pairs, end

    def events(self) -> list[Event]:
        events = [self.start, self.end]
        if self.copy_end is not None:
            events.append(self.copy_end)
        for before, after in self.pairs:
            events += (before, after)
        return events

    def done(self) -> bool:
        return all(event.query() for event in self.events())

    def drop(self) -> None:
        """The step went out on the host's clock before its events were done: they go back to
        the pool once they are (``read`` of a later step looks)."""
        self.clock.dropped.append(self)

    def read(self) -> tuple[float, float, float] | None:
        """(the batch's copy, compute, communication) in seconds on the device, once every event
        of the step is done; None before (ask again later). The events go back to the pool."""
        dropped = self.clock.dropped
        for _ in range(len(dropped)):
            late = dropped.popleft()
            if late.done():
                self.clock.free.extend(late.events())
            else:
                dropped.append(late)
        if not self.done():
            return None
        start = self.start
        span = start.elapsed_time(self.end)
        copy = start.elapsed_time(self.copy_end) if self.copy_end is not None else 0.0
        comm = sum(before.elapsed_time(after) for before, after in self.pairs)
        self.clock.free.extend(self.events())
        copy = max(0.0, copy)
        comm = max(0.0, comm)
        return copy / 1000.0, max(0.0, span - copy - comm) / 1000.0, comm / 1000.0


def fit(step_s: float, data: float, compute: float, comm: float) -> tuple[float, float, float]:
    """Device figures held to the step's wall time: a device that runs behind the host can
    give a step more device time than the host took between its optimizer steps; compute gives
    way first, then data and communication alike, so the parts never exceed ``step_s``."""
    if data + compute + comm <= step_s:
        return data, compute, comm
    compute = max(0.0, step_s - data - comm)
    if data + comm > step_s > 0:
        scale = step_s / (data + comm)
        data, comm = data * scale, comm * scale
    elif step_s <= 0:
        data = comm = 0.0
    return data, compute, comm
