"""The sender's connection to the run's collector: frames out, cumulative acks back.

Each connection opens with ``xl.handshake``: the collector proves it holds ``XL_TOKEN`` before
this process sends it anything, and this process proves it too; the token itself never travels.
A listener that cannot prove it (another program on the port) gets nothing.

Every frame sent stays in ``unacked`` until the collector acks it (cumulative 8-byte sequence
numbers); after a lost connection they are sent again first, with their own sequence numbers (the
collector acks one it had already stored and does not store it again). What to do with frames
that stay unacked (the spool) is the sender's business (``xl.client.sender``).

A rank of a node > 0 dials its own node's supervisor (``XL_COLLECTOR``, loopback), which sends node
0 a summary of its ranks; it also knows node 0's collector (``XL_COLLECTOR_NODE_0``, the
``fallback``), dialled only when its own cannot be reached or stops acking for ``ack_stale_s``
(that supervisor was killed or is frozen): training outlives its supervisor, and node 0 then
hears the rank itself (docs/multinode.md, "Node links").

Everything here runs on the sender thread, which holds the GIL between system calls while the
training thread may want it: once connected, a wake-up costs one ``recv`` for the acks and one
``sendall``, and nothing when there is nothing to send or to read.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from xl import wire

ACK_SIZE = 8
# Frames unacked this long on a live connection while a fallback is known: the collector is
# frozen (its supervisor stopped), so the fallback is dialled. A quarter of node 0's patience
# with a silent node (XL_NODE_TIMEOUT, 30 s by default): node 0 must hear the rank before it
# judges its node lost.
ACK_STALE_S = 7.5


class Link:
    """One rank process's connection; ``header(seq)`` gives each frame's header."""

    def __init__(
        self,
        address: tuple[str, int],
        token: bytes,
        rank: int,
        header: Callable[[int], dict[str, Any]],
        fallback: tuple[str, int] | None = None,
    ) -> None:
        self.address, self.token, self.rank = address, token, rank
        self.fallback = fallback
        self.ack_stale_s = ACK_STALE_S
        self.frozen = False  # the last collector stopped acking: the fallback first next time
        self.on_fallback = False  # connected to the fallback (it stays there while it lasts)
        self.acked_at = 0.0  # monotonic: the last ack, or when frames began to wait for one
        self.header = header
        self.sock: socket.socket | None = None
        self.fd = -1  # the socket's descriptor while connected (acks are read from it directly)
        self.seq = 0
        self.next_connect = 0.0
        self.backoff = 0.2
        self.disconnected_at: float | None = None  # while unacked frames wait to be resent
        self.unverified = 0  # listeners that did not prove the run's token (nothing was sent)
        # (seq, lines, from the replay) of every frame sent and not acked yet.
        self.unacked: deque[tuple[int, list[bytes], bool]] = deque()
        self.ack_buf = b""
        self.on_acked: Callable[[], None] | None = None  # after acks took frames off

    def reset_after_fork(self) -> None:
        """A forked child must not write to the parent's connection; its frames are the parent's."""
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock, self.fd = None, -1
        self.unacked.clear()
        self.disconnected_at = None
        self.seq = 0

    def connect(self) -> bool:
        """Open a connection (when the backoff allows) and resend what the last one left
        unacked, as it was; True when connected."""
        order = [self.address] if self.fallback is None else [self.address, self.fallback]
        if self.frozen:
            order.reverse()  # a frozen collector would still take the connection, and stall
        self.frozen, self.on_fallback = False, False
        sock, listener = None, 0
        for address in order:
            sock, more = _open(address, self.token, self.rank)
            listener += more
            if sock is not None:
                self.on_fallback = address != self.address
                break
        if sock is None:
            self.unverified += listener  # it answered, and did not prove the token: it got nothing
            self.next_connect = time.monotonic() + self.backoff
            self.backoff = min(self.backoff * 2, 2.0)
            return False
        self.sock, self.fd = sock, sock.fileno()
        self.backoff = 0.2
        self.ack_buf = b""
        self.disconnected_at = None
        self.acked_at = time.monotonic()
        # The collector drops what it had already stored (by seq).
        for seq, chunk, _replay in list(self.unacked):
            self.write(seq, chunk)
            if self.sock is None:
                return False
        return True

    def send(self, chunk: list[bytes], from_replay: bool) -> None:
        """One frame of ``chunk``, kept until acked (the caller checks ``sock`` first)."""
        self.seq += 1
        if not self.unacked:
            self.acked_at = time.monotonic()
        self.unacked.append((self.seq, chunk, from_replay))
        self.write(self.seq, chunk)

    def write(self, seq: int, chunk: list[bytes]) -> None:
        sock = self.sock
        assert sock is not None
        frame = wire.encode_batch(self.header(seq), chunk)
        try:
            sock.sendall(frame)
        except OSError:
            self.disconnect()

    def read_acks(self, *, wait: float = 0.0) -> None:
        """Take acked frames off ``unacked``; ``wait``: how long to wait for the first ack."""
        if self.sock is None or (not self.unacked and wait <= 0.0):
            # Nothing sent waits for an ack: a lost connection shows at the next send.
            return
        while True:
            data = self._recv(wait)
            if data is None:
                return
            if not data:
                self.disconnect()
                return
            buf = self.ack_buf + data
            usable = len(buf) - len(buf) % ACK_SIZE
            if usable:
                self._acked(int.from_bytes(buf[usable - ACK_SIZE : usable], "big"))
            self.ack_buf = buf[usable:]
            if not self.unacked:
                return
            wait = 0.0

    def _recv(self, wait: float) -> bytes | None:
        """What came (b"" at the end of the connection), or None: nothing yet, or the connection
        broke (then disconnected)."""
        sock = self.sock
        if sock is None:
            return None
        if wait > 0.0:
            try:
                ready, _, _ = select.select([sock], [], [], wait)
            except (OSError, ValueError):
                self.disconnect()
                return None
            if not ready:
                return None
        try:
            # The socket has a timeout, so its descriptor is non-blocking: a plain recv on it
            # answers at once, where sock.recv would first poll (a second system call).
            return os.read(self.fd, 4096)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            self.disconnect()
            return None

    def check_stale(self, now: float) -> None:
        """With a fallback known: a collector that took frames and acked none for ACK_STALE_S is
        frozen; let go of it (the frames are resent wherever the next connection goes)."""
        if (
            self.fallback is not None
            and self.sock is not None
            and not self.on_fallback
            and self.unacked
            and now - self.acked_at > self.ack_stale_s
        ):
            self.frozen = True
            self.disconnect()
            self.next_connect = now  # the fallback at once: nothing is to be waited for here

    def _acked(self, seq: int) -> None:
        self.acked_at = time.monotonic()
        unacked = self.unacked
        while unacked and unacked[0][0] <= seq:
            unacked.popleft()
        if self.on_acked is not None:
            self.on_acked()

    def disconnect(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock, self.fd = None, -1
        self.next_connect = time.monotonic() + self.backoff
        if self.unacked and self.disconnected_at is None:
            self.disconnected_at = time.monotonic()  # resent as they are on reconnect

    def take_unacked(self) -> list[tuple[int, list[bytes], bool]]:
        """Give up on resending: the frames still unacked, for the spool."""
        self.disconnected_at = None
        pending = list(self.unacked)
        self.unacked.clear()
        return pending


def _open(address: tuple[str, int], token: bytes, rank: int) -> tuple[socket.socket | None, int]:
    """A connection to a collector that proved it holds ``token`` (xl.handshake), or None and
    1 when a listener answered without proving it (0: nobody there)."""
    from xl import handshake  # noqa: PLC0415 - hmac/hashlib cost ~2 ms: only ranks that connect pay

    try:
        sock = socket.create_connection(address, timeout=1.0)
    except OSError:
        return None, 0
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(2.0)
        if handshake.client_handshake(sock, token, handshake.ROLE_RANK, rank) == handshake.OK:
            return sock, 0
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sock.close()
    return None, 1
