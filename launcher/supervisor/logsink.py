"""Rank output: ``logs/rank-<r>.log``, read as it grows and parsed line by line.

Each rank writes its own log through a relay process of its own (``xl.launcher.rank.relay``):
nothing a rank prints goes through the supervisor, so a frozen, killed or disk-starved
supervisor never blocks nor ends training. The supervisor reads every local rank's file as it
grows (``tail``, once a tick, a bounded amount): whole lines are handed on (telemetry parses
them). A node > 0's output stays here: node 0 asks for it (``xl logs`` there) and takes each
rank's last lines as it exits. Node 0 of several writes what it took of the other nodes' ranks'
output here (``append``); those files are not read back.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from xl.launcher.rundir import layout
from xl.launcher.rundir.layout import RunLayout, log_rank
from xl.launcher.rundir.tail import writing
from xl.launcher.supervisor.journal import WriteFailed

_MAX_LINE = 65536
_TICK_BUDGET = 1 << 20  # per file and tick: a flood of output cannot stall the loop
_DRAIN_BUDGET = 16 << 20
_SCAN_EVERY = 10  # ticks between looks for new log files
_MAX_WRITE_FDS = 256  # other nodes' ranks' logs kept open at once (the least recent is closed)
_READ = 1 << 20
_RELAYS_S = 2.0  # at the end: how long the last lines may take to reach the logs


class LogSink:
    """The rank log files: read (local ranks) or written (other nodes' ranks, on node 0).

    ``on_line`` (None: nobody parses) gets each whole line; a tqdm redraw (\\r) counts as a line,
    and the newest redraw is handed on as soon as it stops changing (one tick), not when the next
    one comes: a rank that hangs mid-bar still shows where it stopped."""

    def __init__(
        self,
        run_dir: Path,
        *,
        on_line: Callable[[int, str], None] | None = None,
        wants: Callable[[str], bool] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.layout = RunLayout(run_dir)
        # Writes of other nodes' output the disk refused, by file, until the loop takes them
        # (``refused``): one a file, however many writes to it failed meanwhile.
        self.failed: dict[str, WriteFailed] = {}
        self.on_line = on_line
        # Whether any line of a text may matter to ``on_line`` (None: every line does). A chunk of
        # output it rules out is not split into lines at all: a rank writing 100 MB of plain lines
        # cost the supervisor ~0.5 s of CPU a run in per-line calls that led nowhere.
        self.wants = wants
        self.read_fds: dict[int, int] = {}  # local ranks' logs, open for reading
        self.partial: dict[int, bytes] = {}
        self.offsets: dict[int, int] = {}  # bytes read of each local rank's log
        self.redraw: dict[int, bytes] = {}  # a partial line after a \r, already handed on
        self.log_fds: dict[int, int] = {}  # other nodes' ranks' logs, written here
        self._ticks = 0

    # ---------------------------------------------------------------- local ranks: read
    def tail(self, budget: int = _TICK_BUDGET) -> None:
        """Read what every local rank's log gained since the last look."""
        if self._ticks % _SCAN_EVERY == 0:
            self._open_new()
        self._ticks += 1
        for rank in list(self.read_fds):
            if not self._read(rank, budget):
                self._redrawn(rank)

    def drain(self, rank: int | None = None) -> None:
        """Everything written so far (by ``rank`` only, when given), up to 16 MiB a file.

        Without ``rank`` (the end of the ranks): a relay still writing its rank's last lines
        gets a moment (bounded) to finish, so they are read, and the relays are gone after."""
        self._read_all(rank)
        if rank is not None:
            return
        deadline = time.monotonic() + _RELAYS_S
        while time.monotonic() < deadline and any(
            writing(self.layout.rank_log(r)) for r in self.read_fds
        ):
            time.sleep(0.02)
            self._read_all(None)

    def _read_all(self, rank: int | None) -> None:
        self._open_new()
        for r in list(self.read_fds):
            if rank is None or r == rank:
                self._read(r, _DRAIN_BUDGET)

    def _open_new(self) -> None:
        try:
            names = os.listdir(self.layout.logs)
        except OSError:
            return
        for name in names:
            rank = log_rank(name)
            if rank is None:
                continue
            if rank in self.read_fds or rank in self.log_fds:
                continue
            with contextlib.suppress(OSError):
                self.read_fds[rank] = os.open(
                    self.layout.rank_log(rank), os.O_RDONLY | os.O_CLOEXEC
                )

    def _read(self, rank: int, budget: int) -> int:
        fd = self.read_fds[rank]
        got = 0
        while budget > 0:
            try:
                # As much as is there (read into a buffer of its size, behind the unfinished line):
                # the lines are decoded from where they were read, never copied to be joined.
                want = min(budget, _READ, os.fstat(fd).st_size - self.offsets.get(rank, 0))
                if want <= 0:
                    return got
                partial = self.partial.get(rank, b"")
                chunk = bytearray(len(partial) + want)
                chunk[: len(partial)] = partial
                with memoryview(chunk) as view, view[len(partial) :] as space:
                    n = os.readv(fd, [space])
            except OSError:
                return got
            if not n:
                return got
            del chunk[len(partial) + n :]
            self.offsets[rank] = self.offsets.get(rank, 0) + n
            budget -= n
            got += n
            self.partial[rank] = self._hand_on(rank, chunk)
        return got

    def _redrawn(self, rank: int) -> None:
        """A tick without news: a bar's newest redraw (the text after a line's last \\r) is
        whole."""
        rest = self.partial.get(rank, b"")
        if self.on_line is None or not rest.startswith(b"\r"):
            return
        text = rest[1:]
        if text and self.redraw.get(rank) != text:
            self.redraw[rank] = text
            self.on_line(rank, text.decode("utf-8", "replace"))

    # ---------------------------------------------------------------- other nodes' ranks: write
    def append(self, rank: int, data: bytes, partial: bytes) -> bytes:
        """Append another node's rank output to logs/rank-<rank>.log and hand on whole lines;
        returns the unfinished line (kept by the hub)."""
        fd = self.log_fds.pop(rank, None)  # put back last: the dict stays least recently used first
        try:
            if fd is None:
                # open files stay bounded, whatever the ranks
                if len(self.log_fds) >= _MAX_WRITE_FDS:
                    with contextlib.suppress(OSError):
                        os.close(self.log_fds.pop(next(iter(self.log_fds))))
                fd = os.open(
                    self.layout.rank_log(rank),
                    os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                    0o600,
                )
            self.log_fds[rank] = fd
            os.write(fd, data)
        except OSError as exc:
            what = f"{layout.LOGS}/{layout.rank_log_name(rank)}"
            self.failed.setdefault(what, WriteFailed(what, exc))
        return self._lines(rank, data, partial)

    def refused(self) -> list[WriteFailed]:
        """The writes the disk refused since the last call (for the journal to say)."""
        failed = list(self.failed.values())
        self.failed.clear()
        return failed

    def _lines(self, rank: int, data: bytes, partial: bytes) -> bytes:
        """Hand on the whole lines of ``partial + data``; returns what is left unfinished (a
        redraw in progress keeps its leading \\r)."""
        return self._hand_on(rank, partial + data) if self.on_line is not None else b""

    def _hand_on(self, rank: int, chunk: bytes | bytearray) -> bytes:
        """Hand on the whole lines of ``chunk`` (an unfinished line, then what was read after
        it); returns what is left unfinished. The text is decoded from ``chunk`` in place."""
        on_line = self.on_line
        if on_line is None:
            return b""
        # a last \r may be half a \r\n
        end = len(chunk) - 1 if chunk.endswith(b"\r") else len(chunk)
        cut = max(chunk.rfind(b"\n", 0, end), chunk.rfind(b"\r", 0, end))
        stop: int | None
        if cut <= 0 and not chunk.startswith(b"\n"):
            stop, rest = None, bytes(chunk)  # nothing ended (or only a redraw began)
        elif chunk[cut] == 0x0A:
            stop = cut - 1 if cut > 0 and chunk[cut - 1] == 0x0D else cut
            rest = bytes(chunk[cut + 1 :])
        else:
            stop, rest = cut, bytes(chunk[cut:])  # the newest redraw starts at this \r
        if len(rest) > _MAX_LINE:
            # A long line without its end: handed on as it is (the parser splits at \r and \n).
            stop, rest = len(chunk), b""
        if stop is None:
            return rest
        start = 1 if chunk.startswith(b"\r") else 0
        # tqdm redraws with \r: each redraw is a line for the parser. One decode a chunk.
        with memoryview(chunk) as view, view[start:stop] as whole:
            text = str(whole, "utf-8", "replace")
        seen = self.redraw.pop(rank, None)
        if self.wants is not None and not self.wants(text):
            return rest
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        if seen is not None and lines[0] == seen.decode("utf-8", "replace"):
            del lines[0]  # the redraw handed on already: not twice
        for line in lines:
            on_line(rank, line)
        return rest

    # ---------------------------------------------------------------- the end
    def close_logs(self) -> None:
        """Read what is left, hand on unfinished last lines, close every file."""
        self.drain()
        if self.on_line is not None:
            for rank, rest in self.partial.items():
                rest = rest.removeprefix(b"\r")
                if rest and self.redraw.get(rank) != rest:
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
