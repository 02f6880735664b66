"""Telemetry's events as the tests read them: each as the object its events.jsonl line holds.

Telemetry hands its events on as values (xl.launcher.rundir.events); what a person sees is the
line each becomes. ``Lines`` is an ``emit`` that keeps that line's object, so a test asserts on
exactly what the file would hold.
"""

from __future__ import annotations

import json
import time
from typing import Any

from xl.launcher.rundir.events import Diagnosis, Event, EventKind, event_line


class Lines(list[dict[str, Any]]):
    """An ``emit``: each event sent, as its line's object (decoded), in the order sent."""

    def __call__(self, event: Event) -> None:
        self.append(json.loads(event_line(event)))


def stall(rank: int, message: str, t: float | None = None, **fields: Any) -> Diagnosis:
    """A ``stalled`` diagnosis as the diagnoser sends it (``fields``: idle_s, step, ...)."""
    when = time.time() if t is None else t
    return Diagnosis(EventKind.STALLED, rank, message, dict(fields), t=when)
