"""What the supervisor records: events.jsonl and run.json, and on a node > 0 their copy to node 0.

Events come from the loop and from telemetry's threads (its diagnoses), so appending holds a
lock. run.json is saved whole through ``xl.launcher.rundir.runrecord`` (its one owner), only when
something changed (``dirty``); a failed write leaves the previous file whole and is retried on
the next turn. A full disk must not end the training: each kind of write failure is said once.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xl.launcher.multinode.protocol import FORWARDED_EVENTS, EventMessage, Outgoing
from xl.launcher.rundir import layout
from xl.launcher.rundir import runrecord as run_record
from xl.launcher.rundir.events import (
    Event,
    EventKind,
    WriteLost,
    append_line,
    event_object,
    object_line,
)
from xl.launcher.rundir.outcome import Failure
from xl.launcher.rundir.rows import RankRow
from xl.launcher.rundir.runrecord import RunRecord
from xl.launcher.supervisor.resilience import crash_line

# only a node > 0 has a link, made by the supervisor (not on a one-node run's path)
if TYPE_CHECKING:
    from xl.launcher.multinode.nodelink import NodeLink


# Events held in memory while the disk refuses them: a run's whole event history is rarely more.
_HELD_EVENTS = 10_000
# Space kept in the run dir from the start (.reserve), given back as the run ends: a disk that
# filled mid-run still takes the run's final record and last events. `xl launch` takes it first.
RESERVE_BYTES = layout.RESERVE_BYTES


def hold_reserve(run_dir: Path) -> None:
    """Take RESERVE_BYTES of the run dir's disk now (no file when there is no room even now)."""
    path = run_dir / layout.RESERVE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
    finally:
        os.close(fd)


def release_reserve(run_dir: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(run_dir / layout.RESERVE)


def say(what: str) -> None:
    """One line in supervisor.log (the supervisor's stderr); a full disk loses the line, never
    the supervisor."""
    crash_line(what)


@dataclass(frozen=True)
class WriteFailed:
    """A write the disk refused: the file (relative to the run dir) and why. The parts that write
    files of their own (``LogSink``, ``Escapes``) return these; the loop hands them here."""

    what: str
    error: OSError


class Journal:
    def __init__(self, run_dir: Path, record: RunRecord, link: NodeLink | None = None) -> None:
        self.run_dir = run_dir
        self.record = record
        self.dirty = False  # run.json needs rewriting
        self.link = link  # node > 0: its link to node 0 (it queues what is sent until it starts)
        self._lock = threading.Lock()
        self._write_errors: set[str] = set()
        self._held: list[str] = []  # event lines the disk refused, oldest first
        self.lost: dict[str, int] = {}  # file -> bytes that were never written

    def changed(self) -> None:
        self.dirty = True

    def emit(self, event: Event) -> None:
        """Append one event line; called from telemetry threads too. One the disk refuses waits
        in memory (up to _HELD_EVENTS, then counted as lost) and goes in, in its order, with the
        next event that can be written."""
        obj = event_object(event)
        with self._lock:
            self._held.append(object_line(obj))
            self._write_held()
            if len(self._held) > _HELD_EVENTS:
                cut = self._held.pop(0)
                self.lost[layout.EVENTS] = self.lost.get(layout.EVENTS, 0) + len(cut.encode())
        if event.kind in FORWARDED_EVENTS:
            self.send(EventMessage(EventKind(event.kind), obj))

    def _write_held(self) -> None:
        while self._held:
            try:
                append_line(self.run_dir, self._held[0])
            except OSError as exc:
                self.write_failed(layout.EVENTS, exc)
                return
            self._held.pop(0)

    def flush_held(self) -> None:
        """The events the disk refused, now (the run's end, once space was made)."""
        with self._lock:
            self._write_held()
            lost = sum(len(line.encode()) for line in self._held)
            if lost:
                self.lost[layout.EVENTS] = self.lost.get(layout.EVENTS, 0) + lost
                self._held.clear()

    def at_end(self, metrics_lost: int) -> None:
        """The run's end: the space held from the start takes the last events and the final
        record, whatever filled the disk meanwhile; then what was never written is counted, in
        run.json (``write_lost``, bytes by file) and a ``write_lost`` event."""
        release_reserve(self.run_dir)
        self.flush_held()
        if metrics_lost:
            self.record.update(metrics_bytes_lost=metrics_lost)
            self.lost[layout.METRICS] = metrics_lost
        for rank, report in run_record.read_rank_reports(self.run_dir).items():
            if report.log_bytes_lost:
                self.lost[f"{layout.LOGS}/{layout.rank_log_name(rank)}"] = report.log_bytes_lost
        lost = {name: n for name, n in sorted(self.lost.items()) if n}
        if not lost:
            return
        self.record.update(write_lost=lost)
        listed = ", ".join(f"{name} {n} bytes" for name, n in lost.items())
        self.emit(WriteLost(lost, f"the disk refused writes: never written: {listed}"))

    def send(self, msg: Outgoing) -> None:
        """To node 0, when this is a node > 0 of a multi-node run (else nothing)."""
        if self.link is not None:
            self.link.send(msg)

    def send_log(self, rank: int, data: bytes) -> None:
        if self.link is not None:
            self.link.send_log(rank, data)

    def save(self, ranks: Sequence[RankRow], failure: Failure | None) -> None:
        """run.json with these rows and this failure, written as their JSON."""
        self.dirty = False
        self.record.update(ranks=list(ranks), failure=failure)
        try:
            run_record.save(self.run_dir, self.record)
        except OSError as exc:
            self.dirty = True  # the previous run.json stays whole; retried next turn
            self.write_failed(layout.RUN, exc)

    def refused(self, failures: Iterable[WriteFailed]) -> None:
        """Writes the disk refused elsewhere: each kind said once, as this journal's own are."""
        for failure in failures:
            self.write_failed(failure.what, failure.error)

    def write_failed(self, what: str, exc: OSError) -> None:
        if what not in self._write_errors:
            self._write_errors.add(what)
            say(f"cannot write {what}: {exc}")
