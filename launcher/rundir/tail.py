"""Complete lines appended to a growing file since the last read: the run dir's logs and JSONL.

One tail for every reader of the run dir (the RunReader's metrics, events and rank logs; `xl
logs`; the plain view), so each of them sees whole lines only and survives a file that starts
over. Memory stays bounded whatever the file holds: it is read in chunks, and of a line whose
newline has not come yet at most ``LINE_CAP`` bytes are kept (a 100 MB line without a newline
costs a reader ~1 MiB, not the 100 MB and its copies).

A rank's log is written by the rank's relay, which holds a shared ``flock`` on it while it runs
(``xl.launcher.rank.relay``): ``writing`` tells a reader whether more may still come.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import cast

from xl.launcher.rundir.layout import log_rank, rank_log_name

CHUNK = 4 << 20  # bytes per read: large reads, few calls
LINE_CAP = 1 << 20  # of an unfinished line, at most this much is kept (its newest bytes)


class Tail:
    """Complete lines appended to a file since the last call (survives truncation).

    ``initial_cap``: the first read takes at most the file's last ``initial_cap`` bytes (its
    first, probably cut, line dropped): a view needs recent lines, not a huge file's history;
    ``skipped_lines`` then says how many lines it left out (they stay in the file).
    ``partial`` holds a last line whose newline has not been written yet (its last LINE_CAP bytes;
    with ``stream``, a longer one is handed out in pieces instead, ``mid_line`` set).
    """

    def __init__(self, path: Path, initial_cap: int | None = None, *, stream: bool = False) -> None:
        self.path = path
        self.stream = stream  # pass on every byte: an over-long line comes out in pieces
        self.mid_line = False  # (stream) what read_bytes returned last ended inside a line
        self.offset = 0
        self.partial = b""
        self.cut = False  # the partial line lost its beginning (it was longer than LINE_CAP)
        self.skipped_lines = 0
        self._first = True
        self._cap = initial_cap

    def _skip_history(self, size: int) -> bool:
        """On the first read of a file larger than ``initial_cap``: start near its end."""
        if not (self._first and self._cap is not None and size > self._cap):
            self._first = False
            return False
        self._first = False
        start = size - self._cap
        with contextlib.suppress(OSError), open(self.path, "rb") as fh:
            done = 0
            while done < start:
                block = fh.read(min(CHUNK, start - done))
                if not block:
                    break
                self.skipped_lines += block.count(b"\n")
                done += len(block)
        self.offset = start
        return True

    def read_bytes(self, limit: int = CHUNK) -> bytes:
        """The whole lines (each ending in a newline) appended since the last call, about
        ``limit`` bytes at most: call again while it returns something."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return b""
        if size < self.offset:  # replaced or truncated: start over
            self.offset, self.partial, self.cut = 0, b"", False
        if size == self.offset:
            return b""
        skip_first = self._skip_history(size) if self._first else False
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                while self.offset < size:
                    # A chunk at a time: a huge line without a newline is kept bounded as it is
                    # read.
                    data = fh.read(min(limit, CHUNK, size - self.offset))
                    if not data:
                        return b""
                    self.offset += len(data)
                    whole = self._split(data)
                    if whole and skip_first:
                        # The first line is cut: it began before what was read.
                        whole = whole[whole.find(b"\n") + 1 :]
                        self.skipped_lines += 1
                        skip_first = False
                    if whole:
                        return whole
        except OSError:
            pass
        return b""

    def read_after(self, head: bytes, limit: int = CHUNK) -> bytearray | None:
        """``read_bytes`` for a stream (no ``initial_cap``), as ``head`` followed by the lines, in
        one bytearray read into in place (None: nothing whole yet). A flood of output is copied
        once here (the kernel's read), not three times (the read, the unfinished line joined to
        it, the slice that leaves the next one out), and the caller may change it in place."""
        if (self._first and self._cap is not None) or not self.stream:
            # a view's first look, or whole lines only: the general way
            data = self.read_bytes(limit)
            return bytearray(head + data) if data else None
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return None
        if size < self.offset:  # replaced or truncated: start over
            self.offset, self.partial, self.cut = 0, b"", False
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            while self.offset < size:
                begin = len(head) + len(self.partial)
                buf = bytearray(begin + min(limit, CHUNK, size - self.offset))
                buf[:begin] = head + self.partial
                got = begin
                with memoryview(buf) as view:
                    while got < len(buf):
                        part = view[got:]
                        n = os.preadv(fd, [part], self.offset + got - begin)
                        part.release()  # the bytearray is resized below: no view may be left
                        if not n:
                            break
                        got += n
                if got == begin:
                    return None
                del buf[got:]
                self.offset += got - begin
                end = buf.rfind(b"\n", len(head))
                if end < 0:
                    if len(buf) - len(head) >= LINE_CAP:  # an over-long line: its next piece
                        self.partial, self.mid_line = b"", True
                        return buf
                    self.partial = bytes(buf[len(head) :])
                    continue
                self.mid_line = self.cut = False
                self.partial = bytes(buf[end + 1 :])
                del buf[end + 1 :]  # in place: no copy
                return buf
        except OSError:
            pass
        finally:
            os.close(fd)
        return None

    def _split(self, data: bytes) -> bytes:
        """Whole lines of ``partial + data`` (or, streaming, a long line's next piece)."""
        end = data.rfind(b"\n")
        if end < 0:
            rest = self.partial + data
            if self.stream and len(rest) >= LINE_CAP:
                self.partial, self.mid_line = b"", True
                return rest
            self._keep(rest)
            return b""
        self.mid_line = self.cut = False
        whole = self.partial + data[: end + 1] if self.partial else data[: end + 1]
        self._keep(data[end + 1 :])
        return whole

    def _keep(self, rest: bytes) -> None:
        if len(rest) > LINE_CAP and not self.stream:
            rest = rest[-LINE_CAP:]
            self.cut = True
        self.partial = rest

    def flush_partial(self) -> bytes:
        """An unfinished last line, taken out (at a run's end: it will not get its newline)."""
        data, self.partial = self.partial, b""
        return data

    def read(self, limit: int | None = None) -> list[bytes]:
        """Complete lines since the last call, without their newlines (all of them, or those of
        about ``limit`` bytes)."""
        lines: list[bytes] = []
        while True:
            data = self.read_bytes(limit or CHUNK)
            if not data:
                return lines
            lines += data[:-1].split(b"\n")
            if limit is not None:
                return lines


class RankLogs:
    """A run's rank logs copied to a byte stream as they grow: every line whole, prefixed
    ``[rank R] ``, each rank's in order, nothing dropped; large reads and writes, and between
    them one copy of the bytes (the prefixing replace: a rank writing 100 MB of lines cost the
    view ~0.3 s of CPU in five copies, ~0.1 s in this one).

    A line longer than LINE_CAP comes in pieces as it grows; another rank's line in between
    ends the piece with a newline, and the rest comes prefixed again."""

    def __init__(
        self, logs_dir: Path, *, prefix: bool = True, ranks: list[int] | None = None
    ) -> None:
        self.logs_dir = logs_dir
        self.prefix = prefix
        self.fixed = ranks is not None
        self.tails: dict[int, Tail] = {}
        # the newest whole line of each rank (after its last \r)
        self.last_line: dict[int, bytes] = {}
        self._open: int | None = None  # the rank whose line the output is in the middle of
        for rank in ranks or []:
            self.tails[rank] = Tail(logs_dir / rank_log_name(rank), stream=True)

    def discover(self) -> None:
        if self.fixed:
            return
        try:
            names = os.listdir(self.logs_dir)
        except OSError:
            return
        for name in names:
            rank = log_rank(name)
            if rank is not None and rank not in self.tails:
                self.tails[rank] = Tail(self.logs_dir / name, stream=True)

    def copy(
        self, write: Callable[[bytes], object], *, drain: bool = False, limit: int = CHUNK
    ) -> int:
        """Write what every rank's log gained (``limit`` bytes a rank per round; ``drain``: one
        rank's all before the next's); the number of bytes read."""
        total = 0
        for rank in sorted(self.tails):
            tail = self.tails[rank]
            while True:
                tag = f"[rank {rank}] ".encode() if self.prefix else b""
                # A newline before the lines when the first begins a line: each line, the first
                # too, then gets its prefix in one replace.
                led = bool(tag) and self._open != rank
                data = tail.read_after(b"\n" if led else b"", limit)
                if data is None:
                    break
                total += len(data) - led
                self._write_lines(write, rank, data, tag, led=led, mid_line=tail.mid_line)
                if not drain:
                    break
        return total

    def _write_lines(
        self,
        write: Callable[[bytes], object],
        rank: int,
        data: bytearray,
        tag: bytes,
        *,
        led: bool,
        mid_line: bool,
    ) -> None:
        """``data`` (from ``Tail.read_after``: led by a newline when its first line takes the
        prefix) prefixed and written; changed in place, one copy in all (the replace)."""
        if self._open is not None and self._open != rank:
            write(b"\n")
            self._open = None
        if not mid_line:
            start = data.rfind(b"\n", 0, len(data) - 1) + 1
            self.last_line[rank] = bytes(
                data[max(start, data.rfind(b"\r", start, len(data) - 1) + 1) : -1]
            )
        if tag:
            data = data.replace(b"\n", b"\n" + tag)
            if led:
                del data[:1]  # the leading newline (deleting a bytearray's head moves nothing)
            if not mid_line:
                del data[-len(tag) :]  # the prefix after the last newline: no line follows yet
        # Handed on as it is, not copied into bytes: every writer here takes any buffer (a binary
        # stream's write, decode, joining).
        write(cast(bytes, data))
        self._open = rank if mid_line else None

    def finish(self, write: Callable[[bytes], object]) -> None:
        """The end: unfinished last lines, each given its newline."""
        for rank in sorted(self.tails):
            rest = self.tails[rank].flush_partial()
            if rest:
                tag = f"[rank {rank}] ".encode() if self.prefix else b""
                led = bool(tag) and self._open != rank
                data = bytearray(b"\n" + rest + b"\n" if led else rest + b"\n")
                self._write_lines(write, rank, data, tag, led=led, mid_line=False)
        if self._open is not None:
            write(b"\n")
            self._open = None

    def caught_up(self, rank: int) -> bool:
        """Everything of ``rank``'s log was copied and its relay is done with it."""
        tail = self.tails.get(rank)
        if tail is None:
            return True
        try:
            size = os.stat(tail.path).st_size
        except OSError:
            return True
        return tail.offset >= size and not writing(tail.path)

    def writing(self) -> list[int]:
        """The ranks whose relay still writes their log."""
        return [rank for rank, tail in self.tails.items() if writing(tail.path)]


def writing(path: Path) -> bool:
    """Some relay still writes this rank log (it holds a shared lock on it while it runs)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases a lock taken here
    return False
