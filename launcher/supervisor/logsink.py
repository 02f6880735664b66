"""Rank output: ``logs/rank-<r>.log``, read as it grows and parsed line by line.

Each rank writes its own log through a relay process of its own (``xl.launcher.rank.relay``):
nothing a rank prints goes through the supervisor, so a frozen, killed or disk-starved
supervisor never blocks nor ends training. The supervisor reads every local rank's file as it
grows (``tail``, once a tick, a bounded amount): whole lines are handed on (telemetry parses
them), and a node > 0 sends its ranks' output to node 0 through ``forward``. Node 0 of several
also writes the other nodes' ranks' output here (``append``); those files are not read back.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from pathlib import Path

LOGS_DIR = "logs"
_MAX_LINE = 65536
_TICK_BUDGET = 1 << 20  # per file and tick: a flood of output cannot stall the loop
_DRAIN_BUDGET = 16 << 20
_RANK_LOG = re.compile(r"^rank-(\d+)\.log$")
_SCAN_EVERY = 10  # ticks between looks for new log files
_MAX_WRITE_FDS = 256  # other nodes' ranks' logs kept open at once (the least recent is closed)


def log_path(run_dir: Path, rank: int) -> Path:
    return run_dir / LOGS_DIR / f"rank-{rank}.log"


class LogSink:
    """The rank log files: read (local ranks) or written (other nodes' ranks, on node 0).

    ``on_line`` (None: nobody parses) gets each whole line; a tqdm redraw (\\r) counts as a line."""

    def __init__(self, run_dir: Path, write_failed: Callable[[str, OSError], None]) -> None:
        self.run_dir = run_dir
        self.write_failed = write_failed
        self.on_line: Callable[[int, str], None] | None = None
        self.forward: Callable[[int, bytes], None] | None = None
        self.read_fds: dict[int, int] = {}  # local ranks' logs, open for reading
        self.partial: dict[int, bytes] = {}
        self.log_fds: dict[int, int] = {}  # other nodes' ranks' logs, written here
        self._ticks = 0

    # ---------------------------------------------------------------- local ranks: read
    def tail(self, budget: int = _TICK_BUDGET) -> None:
        """Read what every local rank's log gained since the last look."""
        if self._ticks % _SCAN_EVERY == 0:
            self._open_new()
        self._ticks += 1
        for rank in list(self.read_fds):
            self._read(rank, budget)

    def drain(self, rank: int | None = None) -> None:
        """Everything written so far (by ``rank`` only, when given), up to 16 MiB a file."""
        self._open_new()
        for r in list(self.read_fds):
            if rank is None or r == rank:
                self._read(r, _DRAIN_BUDGET)

    def _open_new(self) -> None:
        try:
            names = os.listdir(self.run_dir / LOGS_DIR)
        except OSError:
            return
        for name in names:
            match = _RANK_LOG.match(name)
            if match is None:
                continue
            rank = int(match.group(1))
            if rank in self.read_fds or rank in self.log_fds:
                continue
            with contextlib.suppress(OSError):
                self.read_fds[rank] = os.open(self.run_dir / LOGS_DIR / name, os.O_RDONLY | os.O_CLOEXEC)

    def _read(self, rank: int, budget: int) -> None:
        fd = self.read_fds[rank]
        while budget > 0:
            try:
                data = os.read(fd, min(budget, 1 << 16))
            except OSError:
                return
            if not data:
                return
            budget -= len(data)
            self.partial[rank] = self._lines(rank, data, self.partial.get(rank, b""))
            if self.forward is not None:
                self.forward(rank, data)

    # ---------------------------------------------------------------- other nodes' ranks: write
    def append(self, rank: int, data: bytes, partial: bytes) -> bytes:
        """Append another node's rank output to logs/rank-<rank>.log and hand on whole lines;
        returns the unfinished line (kept by the hub)."""
        fd = self.log_fds.pop(rank, None)  # put back last: the dict stays least recently used first
        try:
            if fd is None:
                if len(self.log_fds) >= _MAX_WRITE_FDS:  # open files stay bounded, whatever the ranks
                    with contextlib.suppress(OSError):
                        os.close(self.log_fds.pop(next(iter(self.log_fds))))
                fd = os.open(log_path(self.run_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            self.log_fds[rank] = fd
            os.write(fd, data)
        except OSError as exc:
            self.write_failed(f"logs/rank-{rank}.log", exc)
        return self._lines(rank, data, partial)

    def _lines(self, rank: int, data: bytes, partial: bytes) -> bytes:
        if self.on_line is None:
            return b""
        # tqdm redraws with \r: each redraw is a line for the parser.
        chunk = (partial + data).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, partial = chunk.split(b"\n")
        if len(partial) > _MAX_LINE:
            lines.append(partial)
            partial = b""
        for line in lines:
            self.on_line(rank, line.decode("utf-8", "replace"))
        return partial

    # ---------------------------------------------------------------- the end
    def close_logs(self) -> None:
        """Read what is left, hand on unfinished last lines, close every file."""
        self.drain()
        if self.on_line is not None:
            for rank, rest in self.partial.items():
                if rest:
                    self.on_line(rank, rest.decode("utf-8", "replace"))
        self.partial.clear()
        self.close_all()

    def close_all(self) -> None:
        """The crash path: close every file without reading (frees descriptors, needs none)."""
        for fd in [*self.read_fds.values(), *self.log_fds.values()]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.read_fds.clear()
        self.log_fds.clear()
