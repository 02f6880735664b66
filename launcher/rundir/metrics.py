"""Appends lines to a run's metrics.jsonl: buffered, thread-safe, flushed often.

Several threads write here (collector, sampler, the supervisor's log parser). Each call appends
whole lines under one lock, so a reader never sees two records interleaved; the buffer is
flushed at least every ``flush_interval`` seconds so a tailing reader sees records within ~1 s.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


def dumps_line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":"), allow_nan=False).encode()


class MetricsWriter:
    def __init__(self, run_dir: str | os.PathLike[str], *, flush_interval: float = 0.25) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Append mode: a restarted supervisor continues the same file, nothing earlier is lost.
        self._fh = open(self.path, "ab", buffering=1 << 20)  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()
        self._flush_interval = flush_interval
        self._last_flush = time.monotonic()
        self._closed = False
        self.lines_written = 0

    def write_lines(self, lines: list[bytes]) -> None:
        if not lines:
            return
        with self._lock:
            if self._closed:
                return
            self._fh.write(b"\n".join(lines) + b"\n")
            self.lines_written += len(lines)

    def write(self, record: dict[str, Any]) -> None:
        self.write_lines([dumps_line(record)])

    def maybe_flush(self) -> None:
        now = time.monotonic()
        if now - self._last_flush >= self._flush_interval:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            if not self._closed:
                self._fh.flush()
            self._last_flush = time.monotonic()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._fh.flush()
            try:
                os.fsync(self._fh.fileno())
            except OSError:
                pass
            self._fh.close()
            self._closed = True
