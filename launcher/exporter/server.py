"""The exporter's HTTP server: bounded in connections, threads and time whatever its clients do.

http.server's ThreadingHTTPServer gives every connection a thread for as long as it stays open
(512 idle connections: 513 threads, 518 fds) and prints a traceback for a client that resets its
connection early. Here one thread accepts connections and reads their request heads with a
selector; a head that is whole goes to one of a few worker threads, which answer it with the
handler given (a BaseHTTPRequestHandler). So an idle or slow client costs a socket, never a
thread, and:

- at most ``max_connections`` are open; a new one past that closes the oldest one that has not
  sent its request yet, so a flood of idle connections never locks Prometheus out;
- a request's head must arrive whole within HEAD_S and fit in MAX_HEAD bytes;
- a reply must be taken within REPLY_S;
- a client that resets or leaves is closed in silence; anything else that goes wrong answering
  is one line on stderr, never a traceback.
"""

from __future__ import annotations

import io
import queue
import selectors
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import TextIO

MAX_CONNECTIONS = 256  # open at once: far above what scrapers need, far below the fd limit
WORKERS = 4  # threads that answer requests (a scrape renders in milliseconds)
HEAD_S = 10.0  # a request's head arrives whole within this, or the connection is closed
REPLY_S = 10.0  # a reply is taken within this, or the connection is closed
MAX_HEAD = 16 * 1024
SAY_FULL_S = 60.0  # "connections at the cap" is said at most this often


@dataclass
class _Conn:
    sock: socket.socket
    address: tuple[str, int]  # the peer's (host, port)
    since: float  # monotonic, when accepted
    head: bytearray = field(default_factory=bytearray)


class _DeadlineWriter:
    """A socket's writing side, unbuffered (http.server writes the head and the body in one call
    each), that gives up once ``deadline`` (monotonic) has passed. Not an io class: one of those
    flushes again as it is collected and prints what that raised."""

    closed = False

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        while view:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the client did not take its reply in time")
            self._sock.settimeout(left)
            sent = self._sock.send(view[:65536])
            view = view[sent:]
        return total


class HeadFirstHandler(BaseHTTPRequestHandler):
    """A request handler fed a head the server already read (``request`` is its _Conn)."""

    def setup(self) -> None:
        conn: _Conn = self.request
        self.connection = conn.sock
        self.rfile = io.BytesIO(bytes(conn.head))
        self.wfile = _DeadlineWriter(conn.sock, time.monotonic() + REPLY_S)  # type: ignore[assignment]

    def finish(self) -> None:
        self.rfile.close()


class BoundedServer:
    """``serve_forever`` until ``shutdown``; ``handler`` a HeadFirstHandler subclass."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: type[HeadFirstHandler],
        *,
        max_connections: int = MAX_CONNECTIONS,
        workers: int = WORKERS,
        log: TextIO | None = None,
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, port), family=family, backlog=128)
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self.handler, self.max_connections, self.log = handler, max_connections, log or sys.stderr
        self._waiting: dict[int, _Conn] = {}  # by fd, oldest first: reading their heads
        self._busy = 0  # handed to the workers and not closed yet
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Conn | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._said_full = -SAY_FULL_S
        self._selector = selectors.DefaultSelector()
        self._workers = [
            threading.Thread(target=self._work, name=f"xl-exporter-{i}", daemon=True)
            for i in range(workers)
        ]

    def shutdown(self) -> None:
        """Ends serve_forever within half a second; safe in a signal handler."""
        self._stop.set()

    def serve_forever(self) -> None:
        for worker in self._workers:
            worker.start()
        self._selector.register(self.socket, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(timeout=0.5):
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.data)
                self._expire()
        finally:
            for conn in list(self._waiting.values()):
                self._drop(conn)
            for _ in self._workers:
                self._jobs.put(None)
            for worker in self._workers:
                worker.join(timeout=REPLY_S)
            self._selector.close()
            self.socket.close()

    def open_connections(self) -> int:
        with self._lock:
            return len(self._waiting) + self._busy

    def _accept(self) -> None:
        for _ in range(64):  # a burst at a time; the rest at the next select
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of fds, or the client left already
                self._say(f"cannot accept a connection ({exc.strerror or exc})")
                return
            if self.open_connections() >= self.max_connections and not self._evict():
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Conn(sock, address, time.monotonic())
            with self._lock:
                self._waiting[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _evict(self) -> bool:
        """Close the oldest connection still to send its request, to make room."""
        self._say(
            f"{self.max_connections} connections open at once, the most it keeps; the oldest idle "
            "ones are closed"
        )
        oldest = next(iter(self._waiting.values()), None)
        if oldest is None:
            return False
        self._drop(oldest)
        return True

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by the client
            self._drop(conn)
            return
        if not data:
            self._drop(conn)
            return
        conn.head += data
        if b"\r\n\r\n" in conn.head:
            self._selector.unregister(conn.sock)
            with self._lock:
                del self._waiting[conn.sock.fileno()]
                self._busy += 1
            self._jobs.put(conn)
        elif len(conn.head) > MAX_HEAD:
            self._drop(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in list(self._waiting.values()):  # oldest first
            if now - conn.since < HEAD_S:
                break
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        """Close a connection still reading its head."""
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        with self._lock:
            self._waiting.pop(conn.sock.fileno(), None)
        conn.sock.close()

    def _work(self) -> None:
        while True:
            conn = self._jobs.get()
            if conn is None:
                return
            try:
                conn.sock.setblocking(True)
                self.handler(conn, conn.address, self)  # type: ignore[arg-type]
            except OSError:
                pass  # the client reset, left or was too slow: nothing for a person to do
            except Exception as exc:  # a bug answering one scrape; the server stays up
                self._say(
                    f"error answering {conn.address[0]}: {type(exc).__name__}: {exc}", always=True
                )
            finally:
                conn.sock.close()
                with self._lock:
                    self._busy -= 1

    def _say(self, line: str, *, always: bool = False) -> None:
        now = time.monotonic()
        if not always and now - self._said_full < SAY_FULL_S:
            return
        if not always:
            self._said_full = now
        try:
            self.log.write(f"xl exporter: {line}\n")
            self.log.flush()
        except (OSError, ValueError):
            pass
