"""The collector's listening socket, opened again when it dies under it.

``ss -K`` (or any SOCK_DESTROY) can close a listening socket from outside: ``accept`` then fails
with EINVAL for good and the selector keeps calling it readable: left so, no rank could connect
again for the rest of the run. ``Listener.accept`` tells that apart from a failure of one
connection (out of descriptors, aborted), drops the dead socket and listens again on the same
address (REOPEN_S apart while the port is taken), and says so through ``event``.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import time
from collections import Counter
from collections.abc import Callable

from xl.address import format_address
from xl.launcher.rundir.events import EventKind

REOPEN_S = 0.5
ACCEPTS_PER_TURN = 64
# accept() errors of one connection: the listening socket is fine.
_ONE_CONNECTION = (
    errno.EMFILE,
    errno.ENFILE,
    errno.ENOBUFS,
    errno.ENOMEM,
    errno.ECONNABORTED,
    errno.EPROTO,
)


def listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    # A restarted supervisor rebinds the port its ranks already know (TIME_WAIT allowed).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(1024)
    sock.setblocking(False)
    return sock


class Listener:
    """One listening socket on ``host:port`` (port 0: any), registered in ``sel`` with data None."""

    def __init__(self, sel: selectors.BaseSelector, host: str, port: int, rejects: Counter[str],
                 event: Callable[[EventKind, str], None]) -> None:
        self._sel, self._rejects, self._event = sel, rejects, event
        self.sock: socket.socket | None = listen(host, port)
        self.host, self.port = self.sock.getsockname()[:2]
        self._bind_host = host
        self._next_reopen = 0.0

    @property
    def where(self) -> str:
        return format_address(str(self.host), int(self.port))

    def register(self) -> None:
        if self.sock is not None:
            self._sel.register(self.sock, selectors.EVENT_READ, None)

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(Exception):
                self._sel.unregister(sock)
            sock.close()

    def accept(self) -> list[tuple[socket.socket, str]]:
        """The connections waiting (at most ACCEPTS_PER_TURN), each with its peer's address
        ("host:port"; "" where the kernel gives none)."""
        out: list[tuple[socket.socket, str]] = []
        while self.sock is not None and len(out) < ACCEPTS_PER_TURN:
            try:
                sock, addr = self.sock.accept()
                out.append((sock, format_address(str(addr[0]), int(addr[1])) if addr else ""))
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno in _ONE_CONNECTION:
                    self._rejects["accept_error"] += 1
                    break
                self._rejects["listener_died"] += 1  # EINVAL: the socket itself was destroyed
                self.close()
                self.reopen(time.monotonic())
        return out

    def reopen(self, now: float) -> None:
        """Listen again on the same address (or try again REOPEN_S later)."""
        if self.sock is not None or now < self._next_reopen:
            return
        self._next_reopen = now + REOPEN_S
        try:
            sock = listen(self._bind_host, int(self.port))
        except OSError as exc:
            self._rejects["listener_reopen_failed"] += 1
            if self._rejects["listener_reopen_failed"] == 1:
                self._event(
                    EventKind.COLLECTOR_UNAVAILABLE,
                    f"the collector cannot listen on {self.where} again ({exc.strerror or exc}); "
                    f"retrying every {REOPEN_S:g} s",
                )
            return
        self.sock = sock
        self.register()
        self._rejects["listener_reopened"] += 1
        self._event(
            EventKind.COLLECTOR_REOPENED,
            f"the collector's socket on {self.where} was closed under it; it listens again and "
            f"the ranks reconnect",
        )
