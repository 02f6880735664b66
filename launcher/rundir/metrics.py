"""metrics.jsonl: its lines appended (``MetricsWriter``) and read back (``parse_rows``).

Several threads write here (collector, sampler, the supervisor's log parser). Each call appends
whole lines under one lock, so a reader never sees two records interleaved; the buffer is
flushed at least every ``flush_interval`` seconds so a tailing reader sees records within ~1 s.

A line is read once, by ``parse_rows``, into a ``MetricsRow``: its rank, time and kind typed, by
the one rule of xl.figures (a line with no int ``rank`` or no finite ``t`` is no row), and its
figures by the keys xl.figures names. Readers past it match on ``MetricKind``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from enum import Enum
from typing import Any

from xl.launcher.rundir.jsonl import decode_lines, decode_lines_json, fast_loads
from xl.launcher.rundir.layout import RunLayout

# Lines the disk refused wait in memory up to this much (the newest kept) and are written once
# it takes them again: a full disk loses metrics only past this, and never stops the run.
PENDING_CAP = 64 << 20


class MetricsWriter:
    def __init__(self, run_dir: str | os.PathLike[str], *, flush_interval: float = 0.25) -> None:
        self.path = RunLayout(run_dir).metrics
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Append mode: a restarted supervisor continues the same file, nothing earlier is lost.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._buf = bytearray()
        self._lock = threading.Lock()
        self._flush_interval = flush_interval
        self._last_flush = time.monotonic()
        self._closed = False
        self.lines_written = 0
        # cut from the waiting lines while the disk refused them (an event says so)
        self.bytes_lost = 0
        self.error: OSError | None = None  # the last write failure, None once writes succeed

    def write_lines(self, lines: list[bytes]) -> None:
        if not lines:
            return
        with self._lock:
            if self._closed:
                return
            # Appended in place, the newline after: no copy of the batch made on the way.
            self._buf += b"\n".join(lines)
            self._buf += b"\n"
            self.lines_written += len(lines)
            if len(self._buf) > PENDING_CAP:
                # Keep whole lines: cut at the first newline past the excess.
                cut = self._buf.find(b"\n", len(self._buf) - PENDING_CAP) + 1
                self.bytes_lost += cut
                del self._buf[:cut]
            if len(self._buf) >= 1 << 20 and self.error is None:
                self._write()

    def maybe_flush(self) -> None:
        now = time.monotonic()
        if now - self._last_flush >= self._flush_interval:
            self.flush()

    def _write(self) -> None:
        """Write what waits (under the lock). A short write (the disk filled mid-line) leaves
        the rest waiting: only this writer appends, so the line is completed later."""
        try:
            while self._buf:
                n = os.write(self._fd, self._buf)
                del self._buf[:n]
            self.error = None
        except OSError as exc:
            self.error = exc

    def flush(self) -> None:
        with self._lock:
            if not self._closed:
                self._write()
            self._last_flush = time.monotonic()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._write()
            self.bytes_lost += len(self._buf)  # the disk still refuses them: never written
            self._buf.clear()
            try:
                os.fsync(self._fd)
            except OSError:
                pass
            os.close(self._fd)
            self._closed = True


class MetricKind(str, Enum):
    """Who wrote a line: the rank (``train``), or the sampler or xl.watch (``sys``)."""

    TRAIN = "train"
    SYS = "sys"


_KIND_OF = {k.value: k for k in MetricKind}


# One metrics.jsonl line as read: (rank, t, kind, figures). ``kind`` is None for a kind xl does
# not write; ``figures`` is the line's object, its figures by the keys xl.figures names, as JSON
# gave them (a figure is read through xl.figures.number: anything but a finite number is None).
# A plain tuple, unpacked by its readers: they take in hundreds of lines a second per rank, and a
# tuple is made for a quarter of what a NamedTuple costs and a tenth of a frozen dataclass.
MetricsRow = tuple[int, float, MetricKind | None, Mapping[str, Any]]


def _row(rec: object) -> MetricsRow | None:
    """One decoded line as a row by the whole rule (xl.figures.stamp's, inlined): None for what is
    not an object with an int ``rank`` (JSON's ints are exactly int: ``true`` is not rank 1) and a
    finite ``t``; a ``kind`` xl does not write is None."""
    if type(rec) is not dict:
        return None
    rank = rec.get("rank")
    t = rec.get("t")
    if (type(t) is not float and type(t) is not int) or t - t != 0 or type(rank) is not int:
        return None
    kind = rec.get("kind")
    return rank, t, _KIND_OF.get(kind) if type(kind) is str else None, rec


# The readers' hot path (700 lines a second on a 64-rank run, millions in a digest): a line of
# the shape xl writes (an object with ``rank``, ``t`` and a kind it writes) is taken by three
# lookups that raise for any other shape, which then gets ``_row``'s whole rule; a try costs
# nothing until it raises, where a check of the value's type and a ``get`` a key cost a call each.


def parse_rows(values: list[object]) -> list[MetricsRow]:
    """Decoded metrics.jsonl lines as rows; what is not one (``_row``) is skipped."""
    rows: list[MetricsRow] = []
    add, kinds = rows.append, _KIND_OF
    for rec in values:
        try:
            rank = rec["rank"]  # type: ignore[index]
            t = rec["t"]  # type: ignore[index]
            kind = kinds[rec["kind"]]  # type: ignore[index]
        except (KeyError, TypeError):  # not the common shape: the whole rule
            row = _row(rec)
            if row is not None:
                add(row)
            continue
        # 0.0, not 0: a float against a float is the interpreter's fast compare
        if type(rank) is int and (type(t) is float or type(t) is int) and t - t == 0.0:
            add((rank, t, kind, rec))  # type: ignore[arg-type]  # a dict: only one has ["rank"]
    return rows


def read_rows(lines: list[bytes]) -> list[MetricsRow]:
    """metrics.jsonl's lines (bytes, one object each) as rows: ``parse_rows`` of what
    jsonl.decode_lines gives, a big poll's lines decoded and made rows in one pass."""
    fast = fast_loads(len(lines))
    if fast is None:
        return parse_rows(decode_lines(lines))
    rows: list[MetricsRow] = []
    add, kinds = rows.append, _KIND_OF
    for line in lines:
        try:
            rec = fast(line)
            rank = rec["rank"]  # type: ignore[index]
            t = rec["t"]  # type: ignore[index]
            kind = kinds[rec["kind"]]  # type: ignore[index]
        except ValueError:  # orjson refuses it: the json module's verdict (jsonl.decode_lines)
            row = _row(next(iter(decode_lines_json([line])), None))
        except (KeyError, TypeError):  # as parse_rows
            row = _row(rec)
        else:
            if type(rank) is int and (type(t) is float or type(t) is int) and t - t == 0.0:
                add((rank, t, kind, rec))  # type: ignore[arg-type]  # as in parse_rows
            continue
        if row is not None:
            add(row)
    return rows
