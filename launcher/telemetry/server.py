"""The collector's sockets: one ``selectors`` loop reading length-prefixed frames from every peer.

A single thread over non-blocking TCP sockets. An asyncio Protocol server doing the same
per-frame work stores about as many records per CPU-second (0.9-1.05x of each other in
``bench/bench_collector.py --compare-asyncio``), so the simpler design won: no event loop in
the supervisor, and a stop that drains and says goodbye in plain code. pyzmq is not installed
here and would add a compiled dependency to every rank for no measured gain.

This layer knows frames only as bytes: what a frame means is the subclass's ``_frame``
(``xl.launcher.telemetry.collector``). A peer whose length prefix is over the cap is
disconnected: after that its byte stream cannot be re-synchronised. After a frame's good records
are handed to the writer, its sequence number is acked (batched; see ACK_DELAY_S) so the client
can forget it. A connection that has not sent one valid frame within ``idle_s`` of opening is
closed and counted as ``idle``: it holds a connection slot and up to a frame of buffer, so a peer
that connects and says nothing (or trickles a frame) must not keep them.

Every connection opens with ``xl.handshake``: the server sends its challenge on accept and reads
nothing but the peer's HELLO (HELLO_SIZE bytes: all a stranger can make it buffer) until the
peer proved the token; then it proves it too, and frames follow. A wrong proof is answered
REFUSED, counted as ``bad_token`` and closed.

If the listening socket dies under it (``ss -K`` destroys it; accept then fails for good), the
server opens it again on the same address and says so (``listener.Listener``, ``_listener_event``).
"""

from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from xl import handshake, wire
from xl.address import format_address
from xl.launcher.rundir.events import EventKind
from xl.launcher.rundir.metrics import MetricsWriter
from xl.launcher.telemetry.listener import Listener

ACK = struct.Struct(">Q")
# How long stop() keeps reading what peers already sent before closing their sockets.
DRAIN_S = 0.3
GOODBYE_S = 0.5
# Acks are cumulative, so they are batched: one per connection every ACK_DELAY_S or every
# ACK_EVERY frames, unless the sender asks for one at once (flushing). A send() per frame was
# the largest single cost of the collector at 256 ranks.
ACK_DELAY_S = 0.25
ACK_EVERY = 16
# Each connection may buffer up to one frame before its token is checked; capping the number
# of connections caps that memory (a 4096-GPU job is 4096 ranks).
MAX_CONNECTIONS = 8192
# Descriptors kept free for everything else the supervisor opens (files, /proc, the crash path):
# a quarter of the limit, at most FD_RESERVE.
FD_RESERVE = 256
# A connection with no valid frame this long after it opened is closed. Ranks send their first
# frame as soon as they connect, node links a heartbeat every nodelink.HEARTBEAT_S (1 s).
IDLE_S = 30.0


def connection_cap() -> int:
    """Connections allowed at once: MAX_CONNECTIONS, or fewer so that FD_RESERVE descriptors
    stay free under the process's limit (see ``raise_fd_limit``)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(8, min(MAX_CONNECTIONS, soft - min(FD_RESERVE, soft // 4)))


@dataclass
class Conn:
    sock: socket.socket
    buf: bytearray = field(default_factory=bytearray)
    rank: int | None = None
    out: bytearray = field(default_factory=bytearray)
    writing: bool = False
    ack_seq: int | None = None  # the latest seq stored and not yet acked
    ack_frames: int = 0
    node: int | None = None  # a node link (multi-node), once its first frame is in
    stop_sent: bool = False
    peer: str = ""
    opened: float = field(default_factory=time.monotonic)
    valid: bool = False  # it proved the run's token (the handshake)
    nonce: bytes = b""  # the handshake's challenge sent to it
    role: bytes = b""  # handshake.ROLE_RANK or ROLE_NODE, once it said which
    who: int = -1  # the rank or node it proved the token as


class Acks:
    """The collector's acks, cumulative and so batched: a connection's latest stored seq goes
    back once ACK_EVERY frames are in, after ACK_DELAY_S, or at once when the sender asks (it is
    flushing). ``flush`` sends what a connection has to send."""

    def __init__(self, flush: Callable[[Conn], None]) -> None:
        self._flush = flush
        self._due: dict[int, tuple[float, Conn]] = {}  # by id(conn): (since, conn)

    @property
    def waiting(self) -> bool:
        return bool(self._due)

    def stored(self, conn: Conn, seqs: list[int], at_once: bool) -> None:
        """The frames ``seqs`` of ``conn`` are stored: ack them now or soon."""
        conn.ack_seq = seqs[-1]
        conn.ack_frames += len(seqs)
        if at_once or conn.ack_frames >= ACK_EVERY:
            self._ack(conn)
            self._due.pop(id(conn), None)
        elif id(conn) not in self._due:
            self._due[id(conn)] = (time.monotonic(), conn)

    def send_due(self, now: float, *, all_: bool = False) -> None:
        for key, (since, conn) in list(self._due.items()):
            if all_ or now - since >= ACK_DELAY_S:
                self._ack(conn)
                self._due.pop(key, None)

    def forget(self, conn: Conn) -> None:
        self._due.pop(id(conn), None)

    def _ack(self, conn: Conn) -> None:
        if conn.ack_seq is None:
            return
        conn.out += ACK.pack(conn.ack_seq)
        conn.ack_seq, conn.ack_frames = None, 0
        self._flush(conn)


class FrameServer:
    """Accept peers on ``host:port``, cut their streams into frames, hand each to ``_frame``,
    append the lines it keeps through ``writer`` and ack the frame; every failure is counted in
    ``rejects`` under its reason, and nothing a peer sends can stop the loop."""

    def __init__(
        self, writer: MetricsWriter, host: str, port: int, idle_s: float, token: bytes
    ) -> None:
        self.writer = writer
        self._token = token  # proved by every peer in the handshake, never sent
        self.idle_s = idle_s  # read on every check: tests shorten it on a running server
        self.rejects: Counter[str] = Counter()
        self._sel = selectors.DefaultSelector()
        self._listener = Listener(self._sel, host, port, self.rejects, self._listener_event)
        self.host, self.port = self._listener.host, self._listener.port
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._acks = Acks(self._flush_out)
        self._fresh: dict[int, Conn] = {}  # connections with no valid frame yet, by id
        self._next_idle_check = 0.0
        # A socketpair wakes the loop at once on stop() instead of waiting for its timeout.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.max_connections = connection_cap()

    # -- what a subclass decides ------------------------------------------------------------

    def _frame(
        self, payload: bytes, lines: list[bytes], conn: Conn | None = None
    ) -> tuple[int, bool] | None:
        """Handle one frame; append the record lines to store to ``lines``. Returns (seq, ack
        at once) for a frame to ack, None for one rejected or answered another way."""
        raise NotImplementedError

    def _hello(self, conn: Conn, hello: handshake.Hello) -> None:
        """``conn`` finished the handshake (``hello.ok``: with the run's token)."""

    def _listener_event(self, kind: EventKind, message: str) -> None:
        """The listening socket died, or was opened again."""

    def _closed(self, conn: Conn) -> None:
        """``conn`` was closed (by either side)."""

    def _tick_done(self) -> None:
        """Once per loop turn, on the loop's thread."""

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    def start(self) -> None:
        self._listener.register()
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name="xl-collector", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.writer.flush()

    def _wake(self, why: bytes = b"x") -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(why)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._tick(ACK_DELAY_S / 2 if self._acks.waiting else 0.2)
                    if not self._stop.is_set():
                        self._listener.reopen(time.monotonic())  # when it died (listener.py)
                    self._acks.send_due(time.monotonic())
                    self._close_idle(time.monotonic())
                    self._tick_done()
                    self.writer.maybe_flush()
                except Exception:  # e.g. the disk is full: count it and keep serving
                    self.rejects["write_error"] += 1
                    time.sleep(0.2)
            self._drain()
        finally:
            for key in list(self._sel.get_map().values()):
                with contextlib.suppress(Exception):
                    key.fileobj.close()  # type: ignore[union-attr]
            self._sel.close()
            self._wake_w.close()

    def _drain(self) -> None:
        # Peers may have sent frames just before stop(): read them so nothing in flight is lost.
        self._listener.close()
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            if not self._tick(0.05):
                break
        self._goodbye()

    def _goodbye(self) -> None:
        """Close peers so that the acks already sent reach them.

        Closing a socket with unread input makes the kernel send a reset, and a reset can
        discard the acks still waiting in the peer's receive queue; the peer would then resend
        frames already stored. So: send what is pending, half-close (FIN after the acks), and
        discard input until the peer closes too (or a short grace ends). Frames arriving now are
        not acked, so their senders keep them.
        """
        self._acks.send_due(time.monotonic(), all_=True)
        conns = self._conns()
        for conn in conns:
            with contextlib.suppress(OSError):
                if conn.out:
                    conn.sock.setblocking(True)
                    conn.sock.settimeout(0.2)
                    conn.sock.sendall(conn.out)
                    conn.sock.setblocking(False)
                conn.sock.shutdown(socket.SHUT_WR)
        open_conns = {conn.sock.fileno(): conn for conn in conns}
        deadline = time.monotonic() + GOODBYE_S
        while open_conns and time.monotonic() < deadline:
            for key, _mask in self._sel.select(0.05):
                conn = key.data
                if not isinstance(conn, Conn):
                    continue
                try:
                    data = conn.sock.recv(1 << 16)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    open_conns.pop(conn.sock.fileno(), None)
                    self._close(conn)

    # -- connections ----------------------------------------------------------------------------

    def _conns(self) -> list[Conn]:
        return [k.data for k in self._sel.get_map().values() if isinstance(k.data, Conn)]

    def _tick(self, timeout: float) -> int:
        events = self._sel.select(timeout)
        for key, mask in events:
            try:
                if key.data is None:
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(64)
                else:
                    if mask & selectors.EVENT_READ:
                        self._read(key.data)
                    if mask & selectors.EVENT_WRITE:
                        self._flush_out(key.data)
            except Exception:  # a peer must never be able to stop the collector
                self.rejects["internal_error"] += 1
                if isinstance(key.data, Conn):
                    self._close(key.data)
        return len(events)

    def _accept(self) -> None:
        for sock, peer in self._listener.accept():
            if len(self._sel.get_map()) >= self.max_connections:
                self.rejects["too_many_connections"] += 1
                sock.close()
                continue
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Conn(sock, peer=peer)
            conn.nonce, first = handshake.challenge()
            conn.out += first
            self._fresh[id(conn)] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)
            self._flush_out(conn)

    def _mark_valid(self, conn: Conn) -> None:
        """``conn`` sent a frame with the run's token: it is no longer at risk of the idle cut."""
        if not conn.valid:
            conn.valid = True
            self._fresh.pop(id(conn), None)

    def _close_idle(self, now: float) -> None:
        if not self._fresh or now < self._next_idle_check:
            return
        self._next_idle_check = now + min(1.0, self.idle_s / 4)
        for conn in [c for c in self._fresh.values() if now - c.opened >= self.idle_s]:
            self.rejects["idle"] += 1
            self._close(conn)

    def _close(self, conn: Conn) -> None:
        self._acks.forget(conn)
        self._fresh.pop(id(conn), None)
        with contextlib.suppress(Exception):
            self._sel.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()
        self._closed(conn)

    def _handshake(self, conn: Conn) -> bool:
        """Check a new connection's HELLO once all of it is in; False when it was closed."""
        if len(conn.buf) < handshake.HELLO_SIZE:
            return True
        hello = handshake.check_hello(
            self._token, conn.nonce, bytes(conn.buf[: handshake.HELLO_SIZE])
        )
        del conn.buf[: handshake.HELLO_SIZE]
        conn.out += hello.answer
        if hello.ok:
            self._mark_valid(conn)
        else:
            self.rejects["bad_token"] += 1
        self._flush_out(conn)
        self._hello(conn, hello)
        if not hello.ok:
            self._close(conn)
        return hello.ok

    def _read(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(
                1 << 20 if conn.valid else handshake.HELLO_SIZE - len(conn.buf)
            )  # a stranger: 53 bytes
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        buf = conn.buf
        buf += data
        if not conn.valid and (not self._handshake(conn) or not conn.valid):
            return
        pos = 0
        size = len(buf)
        lines: list[bytes] = []
        acks: list[int] = []
        ack_now = False
        while size - pos >= 4:
            (length,) = wire.HEADER.unpack_from(buf, pos)
            if length > wire.MAX_FRAME or length == 0:
                self.rejects["oversized" if length else "empty"] += 1
                self._close(conn)
                return
            if size - pos - 4 < length:
                break
            payload = bytes(buf[pos + 4 : pos + 4 + length])
            pos += 4 + length
            seq = self._frame(payload, lines, conn)
            if seq is not None:
                acks.append(seq[0])
                ack_now = ack_now or seq[1]
        if pos:
            del buf[:pos]
        if len(buf) > wire.MAX_FRAME + 4:  # cannot happen with a valid prefix; belt and braces
            self.rejects["oversized"] += 1
            self._close(conn)
            return
        if lines:
            self.writer.write_lines(lines)
        if acks:  # acked only after the lines are handed to the writer (above)
            self._acks.stored(conn, acks, ack_now)

    # -- writing back ---------------------------------------------------------------------------

    def _flush_out(self, conn: Conn) -> None:
        if conn.out:
            try:
                sent = conn.sock.send(conn.out)
                del conn.out[:sent]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._close(conn)
                return
        # Only touch the selector when the need to write changes: that is rare, and an
        # epoll_ctl per frame was a fifth of the collector's time at 256 ranks.
        writing = bool(conn.out)
        if writing != conn.writing:
            conn.writing = writing
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0)
            with contextlib.suppress(Exception):
                self._sel.modify(conn.sock, want, conn)
