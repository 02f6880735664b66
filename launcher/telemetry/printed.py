"""Which of a rank's printed bars and log dicts are its training steps.

The log parser (logparse.py) finds tqdm bars and log dicts in what a rank prints; not all of them
are training. Where the rank reports its own steps (it announced itself: ``"train": true`` in its
frame header, sent at its first optimizer step under xl launch, or by xl.log and the framework
integrations), nothing it prints is a step: its own records say more. Before that, under
instrumentation (xl launch without ``--no-instrument``), a rank that will announce has not yet
taken its first optimizer step, so what it prints is not training: datasets' ``Map 320/320``,
transformers' ``Loading weights 41/41``. Those records are held, per rank, and dropped once it
announces. A rank that has not announced ``XL_PRINTED_HOLD_S`` (60 s) after its first such record
(a script with no optimizer: inference, evaluation, or one that steps no torch optimizer) gets
them: the held records are written with their own times, and what it prints from then on as it
comes. With ``--no-instrument`` nothing is held: the bars are the only steps there are.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from xl import wire

HOLD_S = 60.0
_HELD = 512  # per rank, the newest kept: what comes before them is not training anyway


class Printed:
    """``take(rank, rec, now)``: the records to store now for one record parsed from a rank's
    output (none, the record, or the held ones and it); ``announced(rank)``: the rank reports its
    own steps from now on. Any thread."""

    def __init__(self, *, instrumented: bool, hold_s: float = HOLD_S) -> None:
        self.instrumented = instrumented
        self.hold_s = hold_s
        self._lock = threading.Lock()
        self._own: set[int] = set()  # ranks that report their own steps
        self._held: dict[int, deque[dict[str, Any]]] = {}
        self._since: dict[int, float] = {}  # when a rank's first held record was printed
        self._free: set[int] = set()  # ranks whose printed steps are theirs (the hold ran out)
        self.dropped = 0  # records held and then dropped: printed before the rank's first step
        self._bar_step: dict[int, int] = {}  # each rank's last bar step stored or held

    def found(self, rank: int, found: dict[str, Any], now: float) -> list[dict[str, Any]]:
        """What the log parser found in a line of ``rank``'s output (logparse.parse_line) as its
        train record, through ``take``: a Trainer's summary is none, a bar one per new step (not
        one per redraw)."""
        if found.pop("summary", False):
            return []
        if "loss" not in found and "lr" not in found:
            step = found.get("step")
            with self._lock:
                if step is not None and self._bar_step.get(rank) == step:
                    return []
                if step is not None:
                    self._bar_step[rank] = step
        rec: dict[str, Any] = {"t": round(now, 3), "rank": rank, "kind": "train"}
        for key, value in found.items():
            rec.setdefault(key if key not in wire.RESERVED else f"user_{key}", value)
        rec["source"] = "log"
        return self.take(rank, rec, rec["t"])

    def announced(self, rank: int) -> None:
        with self._lock:
            if rank in self._own:
                return
            self._own.add(rank)
            self.dropped += len(self._held.pop(rank, ()))
            self._since.pop(rank, None)

    def take(self, rank: int, rec: dict[str, Any], now: float) -> list[dict[str, Any]]:
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

    def due(self, now: float) -> list[dict[str, Any]]:
        """The held records of every rank whose hold ran out by ``now`` with nothing printed since
        (a bar-only script that stopped printing, hung or not, still gets its steps)."""
        with self._lock:
            return [rec for rank in [r for r, t in self._since.items() if now - t >= self.hold_s] for rec in self._release(rank)]

    def _release(self, rank: int) -> list[dict[str, Any]]:
        self._free.add(rank)
        held = self._held.pop(rank)
        del self._since[rank]
        return list(held)
