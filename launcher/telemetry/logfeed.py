"""Rank output lines to train records: parsed on a thread of their own, and let through as steps
only where they are the rank's steps.

The supervisor's loop reads the ranks' logs and hands each line here: a linear test, and a put
into a bounded queue. Parsing (``logparse``) runs on this module's thread, so no line, however
long or hostile, holds the loop that watches the ranks; when the queue is full, lines are counted
and skipped (their bytes are in the logs all the same).

Which records are steps (``OutputSteps``): the log parser finds tqdm bars and log dicts in what
a rank prints, and not all of them are training. Where the rank reports its own steps (it announced
itself: ``"train": true`` in its frame header, sent at its first optimizer step under xl launch,
or by xl.log and the framework integrations), nothing it prints is a step: its own records say
more. Before that, under instrumentation (xl launch without ``--no-instrument``), a rank that will
announce has not taken its first optimizer step yet, so what it prints is not training: datasets'
``Map 320/320``, transformers' ``Loading weights 41/41``. Those records are held, per rank, and
dropped once it announces. A rank that has not announced ``XL_PRINTED_HOLD_S`` (60 s) after its
first such record (a script with no optimizer: inference, evaluation, or one that steps no torch
optimizer) gets them: the held records are written with their own times, and what it prints from
then on as it comes. With ``--no-instrument`` nothing is held: the bars are the only steps there
are.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import deque
from collections.abc import Callable

from xl import wire
from xl.launcher.telemetry.logparse import Found, parse_line, worth_parsing

QUEUE_LINES = 4096
# A train record made from a line, as metrics.jsonl holds it: written, never read back here.
Record = dict[str, object]


class LogFeed:
    """``handle(rank, found)`` gets what ``parse_line`` found in a line, on the feed's thread."""

    def __init__(self, handle: Callable[[int, Found], None]) -> None:
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


HOLD_S = 60.0
_HELD = 512  # per rank, the newest kept: what comes before them is not training anyway


class OutputSteps:
    """The steps read from the ranks' output: held back, let through or dropped, per rank.
    ``take(rank, rec, now)``: the records to store now for one record parsed from a rank's
    output (none, the record, or the held ones and it); ``announced(rank)``: the rank reports its
    own steps from now on. Any thread."""

    def __init__(self, *, instrumented: bool, hold_s: float = HOLD_S) -> None:
        self.instrumented = instrumented
        self.hold_s = hold_s
        self._lock = threading.Lock()
        self._own: set[int] = set()  # ranks that report their own steps
        self._held: dict[int, deque[Record]] = {}
        self._since: dict[int, float] = {}  # when a rank's first held record was printed
        self._free: set[int] = set()  # ranks whose printed steps are theirs (the hold ran out)
        self.dropped = 0  # records held and then dropped: printed before the rank's first step
        self._bar_step: dict[int, int] = {}  # each rank's last bar step stored or held

    def found(self, rank: int, found: Found, now: float) -> list[Record]:
        """What the log parser found in a line of ``rank``'s output (logparse.parse_line) as its
        train record, through ``take``: a Trainer's summary is none, a bar one per new step (not
        one per redraw)."""
        if found.pop("summary", False):
            return []
        if "loss" not in found and "lr" not in found:
            step = found.get("step")  # an int where the parser found one (logparse)
            with self._lock:
                if isinstance(step, int) and self._bar_step.get(rank) == step:
                    return []
                if isinstance(step, int):
                    self._bar_step[rank] = step
        t = round(now, 3)
        rec: Record = {"t": t, "rank": rank, "kind": "train"}
        for key, value in found.items():
            rec.setdefault(key if key not in wire.RESERVED else f"user_{key}", value)
        rec["source"] = "log"
        return self.take(rank, rec, t)

    def announced(self, rank: int) -> None:
        with self._lock:
            if rank in self._own:
                return
            self._own.add(rank)
            self.dropped += len(self._held.pop(rank, ()))
            self._since.pop(rank, None)

    def take(self, rank: int, rec: Record, now: float) -> list[Record]:
        with self._lock:
            if rank in self._own:
                return []
            if not self.instrumented or rank in self._free:
                return [rec]
            held = self._held.get(rank)
            if held is None:
                held = self._held[rank] = deque(maxlen=_HELD)
                self._since[rank] = now
            held.append(rec)
            if now - self._since[rank] < self.hold_s:
                return []
            return self._release(rank)

    def due(self, now: float) -> list[Record]:
        """The held records of every rank whose hold ran out by ``now`` (the 1 Hz loop asks: a
        bar-only script that stopped printing, hung or not, still gets its steps)."""
        with self._lock:
            return [
                rec
                for rank in [r for r, t in self._since.items() if now - t >= self.hold_s]
                for rec in self._release(rank)
            ]

    def _release(self, rank: int) -> list[Record]:
        self._free.add(rank)
        held = self._held.pop(rank)
        del self._since[rank]
        return list(held)
