"""Rank output lines to train records, on a thread of their own (issue 25, point 11).

The supervisor's loop reads the ranks' logs and hands each line here: a linear test, and a put
into a bounded queue. Parsing (``logparse``) runs on this module's thread, so no line, however
long or hostile, holds the loop that watches the ranks; when the queue is full, lines are counted
and skipped (their bytes are in the logs all the same).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

from xl.launcher.telemetry.logparse import parse_line, worth_parsing

QUEUE_LINES = 4096


class LogFeed:
    """``handle(rank, found)`` gets what ``parse_line`` found in a line, on the feed's thread."""

    def __init__(self, handle: Callable[[int, dict[str, Any]], None]) -> None:
        self._handle = handle
        self._lines: queue.Queue[tuple[int, str] | None] = queue.Queue(QUEUE_LINES)
        self._thread: threading.Thread | None = None
        self.skipped = 0  # lines not parsed: the queue was full, or the parse failed

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="xl-logparse", daemon=True)
        self._thread.start()

    def put(self, rank: int, line: str) -> None:
        """Queue one line (any thread; never waits)."""
        if self._thread is None or not worth_parsing(line):
            return
        try:
            self._lines.put_nowait((rank, line))
        except queue.Full:
            self.skipped += 1

    def wants(self, text: str) -> bool:
        """Whether a line of ``text``, one line or many, may be put to some use: the feed runs
        and ``worth_parsing`` holds for the text (it tests for substrings, so it holds for a text
        whenever it holds for one of its lines)."""
        return self._thread is not None and worth_parsing(text)

    def stop(self, timeout: float = 10.0) -> None:
        """Parse every line queued so far, then end the thread."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        with contextlib.suppress(queue.Full):
            self._lines.put(None, timeout=timeout)
        thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._lines.get()
            if item is None:
                return
            rank, line = item
            try:
                found = parse_line(line)
                if found is not None:
                    self._handle(rank, found)
            except Exception:  # a parser bug must not end the parsing of every later line
                self.skipped += 1
