"""What the supervisor records: events.jsonl and run.json, and on a node > 0 their copy to node 0.

Events come from the loop and from telemetry's threads (its diagnoses), so appending holds a
lock. run.json is saved whole through ``xl.launcher.rundir.record`` (its one owner), only when
something changed (``dirty``); a failed write leaves the previous file whole and is retried on
the next turn. A full disk must not end the training: each kind of write failure is said once.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xl.launcher.multinode.protocol import FORWARDED_EVENTS
from xl.launcher.rundir import layout
from xl.launcher.rundir import record as run_record
from xl.launcher.rundir.events import append_event
from xl.launcher.rundir.record import RunRecord
from xl.launcher.supervisor.guard import crash_line

if TYPE_CHECKING:  # only a node > 0 has a link, made by the supervisor (not on a one-node run's path)
    from xl.launcher.multinode.nodelink import NodeLink


def say(what: str) -> None:
    """One line in supervisor.log (the supervisor's stderr); a full disk loses the line, never
    the supervisor."""
    crash_line(what)


class Journal:
    def __init__(self, run_dir: Path, record: RunRecord) -> None:
        self.run_dir = run_dir
        self.record = record
        self.dirty = False  # run.json needs rewriting
        self.link: NodeLink | None = None  # node > 0: its link to node 0
        self._lock = threading.Lock()
        self._write_errors: set[str] = set()

    def changed(self) -> None:
        self.dirty = True

    def emit(self, event: dict[str, Any]) -> None:
        """Append one event line; called from telemetry threads too."""
        try:
            with self._lock:
                append_event(self.run_dir, event)
        except OSError as exc:
            self.write_failed(layout.EVENTS, exc)
        if event.get("kind") in FORWARDED_EVENTS:
            self.send({"type": "event", "event": event})

    def send(self, msg: dict[str, Any]) -> None:
        """To node 0, when this is a node > 0 of a multi-node run (else nothing)."""
        if self.link is not None:
            self.link.send(msg)

    def send_log(self, rank: int, data: bytes) -> None:
        if self.link is not None:
            self.link.send_log(rank, data)

    def save(self, ranks: list[dict[str, Any]], failure: dict[str, Any] | None) -> None:
        self.dirty = False
        self.record.update(ranks=ranks, failure=failure)
        try:
            run_record.save(self.run_dir, self.record)
        except OSError as exc:
            self.dirty = True  # the previous run.json stays whole; retried next turn
            self.write_failed(layout.RUN, exc)

    def write_failed(self, what: str, exc: OSError) -> None:
        if what not in self._write_errors:
            self._write_errors.add(what)
            say(f"cannot write {what}: {exc}")
