"""The rank-output socket: every rank's stdout/stderr, into ``logs/rank-<r>.log`` line by line.

Each rank's entry point connects to the Unix socket ``sup.sock`` (its path is given to ranks as
XL_LOGSOCK), says who it is in a first JSON line (rank, pid, the run's token) and then sends its
raw output. Bytes go to the rank's log file as they come; whole lines are handed on (telemetry
parses them), a rank's own node > 0 copy goes to node 0 through ``forward``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SOCKET_FILE = "sup.sock"
LOGS_DIR = "logs"
_MAX_HELLO = 4096
_MAX_LINE = 65536
_DRAIN_BUDGET = 16 << 20


@dataclass
class _Conn:
    sock: socket.socket
    rank: int | None = None
    head: bytes = b""
    partial: bytes = b""


def log_path(run_dir: Path, rank: int) -> Path:
    return run_dir / LOGS_DIR / f"rank-{rank}.log"


class LogSink:
    """The listening socket, its connections and the open rank log files.

    Registers its sockets in the loop's selector with a callable as data: the loop calls it when
    the socket is ready. ``on_line`` (None: nobody parses) gets each whole line; a tqdm redraw
    (\\r) counts as a line."""

    def __init__(
        self,
        run_dir: Path,
        run_id: str,
        token: str,
        sel: selectors.BaseSelector,
        on_hello: Callable[[int, int], None],
        write_failed: Callable[[str, OSError], None],
    ) -> None:
        self.run_dir = run_dir
        self.run_id = run_id
        self.token = token
        self.sel = sel
        self.on_hello = on_hello
        self.write_failed = write_failed
        self.on_line: Callable[[int, str], None] | None = None
        self.forward: Callable[[int, bytes], None] | None = None
        self.conns: dict[int, _Conn] = {}
        self.log_fds: dict[int, int] = {}
        self.listener: socket.socket | None = None

    def listen(self) -> str:
        """Open the socket; returns the address ranks connect to (XL_LOGSOCK)."""
        path = str(self.run_dir / SOCKET_FILE)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if len(path.encode()) < 100:
            address, bind_to = path, path
        else:
            # Deep run dirs exceed the 108-byte socket path limit: use Linux's abstract namespace.
            address = f"@xl-{self.run_id}-{secrets.token_hex(4)}"
            bind_to = "\0" + address[1:]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock.bind(bind_to)
        sock.listen(256)
        sock.setblocking(False)
        self.sel.register(sock, selectors.EVENT_READ, self.accept)
        self.listener = sock
        return address

    def accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            conn = _Conn(sock)
            self.conns[sock.fileno()] = conn
            self.sel.register(sock, selectors.EVENT_READ, lambda conn=conn: self.read(conn))

    def read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        if conn.rank is None:
            conn.head += data
            if b"\n" not in conn.head:
                if len(conn.head) > _MAX_HELLO:
                    self._close(conn)
                return
            line, _, data = conn.head.partition(b"\n")
            try:
                hello = json.loads(line)
                if hello.get("token") != self.token:
                    raise ValueError("bad token")
                conn.rank = int(hello["rank"])
            except (ValueError, KeyError, TypeError):
                self._close(conn)
                return
            self.on_hello(conn.rank, int(hello.get("pid") or 0))
            if not data:
                return
        self._write(conn, data)

    def _write(self, conn: _Conn, data: bytes) -> None:
        rank = int(conn.rank)  # type: ignore[arg-type]
        conn.partial = self.append(rank, data, conn.partial)
        if self.forward is not None:
            self.forward(rank, data)

    def append(self, rank: int, data: bytes, partial: bytes) -> bytes:
        """Append to logs/rank-<rank>.log and hand on whole lines; returns the unfinished line.

        Also node 0's way in for other nodes' output (their ``partial`` is kept by the hub)."""
        fd = self.log_fds.get(rank)
        try:
            if fd is None:
                fd = os.open(log_path(self.run_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                self.log_fds[rank] = fd
            os.write(fd, data)
        except OSError as exc:
            self.write_failed(f"logs/rank-{rank}.log", exc)
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

    def _close(self, conn: _Conn) -> None:
        if conn.partial and conn.rank is not None and self.on_line is not None:
            self.on_line(conn.rank, conn.partial.decode("utf-8", "replace"))
        conn.partial = b""
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn.sock)
        self.conns.pop(conn.sock.fileno(), None)
        conn.sock.close()

    def drain(self, rank: int | None = None) -> None:
        """Output still queued in sockets of ranks that have exited (of ``rank`` only, when
        given). Never blocks: the sockets are non-blocking; a rank's is read up to 16 MiB (a
        child process of a dead rank may still hold it and write)."""
        for conn in list(self.conns.values()):
            if rank is not None and conn.rank != rank:
                continue
            budget = _DRAIN_BUDGET
            while budget > 0:
                try:
                    data = conn.sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    data = b""
                if not data:
                    self._close(conn)
                    break
                if conn.rank is not None:
                    self._write(conn, data)
                    budget -= len(data)
                else:
                    break

    def close_logs(self) -> None:
        for fd in self.log_fds.values():
            os.close(fd)

    def close(self) -> None:
        """Stop listening and remove the socket file (connections end with the ranks)."""
        with contextlib.suppress(OSError):
            if self.listener is not None:
                self.listener.close()
            os.unlink(self.run_dir / SOCKET_FILE)
