"""Errors a telemetry thread carries on after, said in supervisor.log (the supervisor's stderr).

Sampling and hang captures must never take the supervisor down, so they catch what they hit.
Caught in silence, an error that repeats every second would switch off stall detection, or leave a
hang never named, with no trace of why. Each distinct error is said once, a bounded number.
"""

from __future__ import annotations

import contextlib
import os


class ThreadErrors:
    """The errors one thread caught and carries on after: ``say`` writes each distinct one to
    stderr once, ``limit`` of them at most."""

    def __init__(self, limit: int = 16) -> None:
        self._said: set[str] = set()
        self._limit = limit

    def say(self, what: str, exc: BaseException) -> None:
        line = f"xl: {what}: {exc!r}"
        if line in self._said or len(self._said) >= self._limit:
            return
        self._said.add(line)
        with contextlib.suppress(OSError):  # a full disk loses the line, never the thread
            os.write(2, line.encode("utf-8", "replace")[:1000] + b"\n")
