"""The sender: one daemon thread per rank process that turns queued ``xl.log`` calls into
frames and gets them to the run's collector.

It wakes ten times a second, turns queued calls into record lines (``xl.client.records``),
adds a ``sys`` line once a second, and sends them in batches over one TCP connection to
``XL_COLLECTOR``. Each connection opens with ``xl.handshake``: the collector proves it holds
``XL_TOKEN`` before this process sends it anything, and this process proves it too; the token
itself never travels. A listener that cannot prove it (another program on the port) gets nothing:
the records wait in the spool.

Nothing is lost and nothing is stored twice: frames stay in memory until the collector acks them
(cumulative 8-byte sequence numbers). After a lost connection they are sent again first, with
their own sequence numbers (the collector acks one it had already stored and does not store it
again); when the collector stays out of reach for RESEND_WAIT_S they go to the spool
(``xl.client.spool``), as does everything logged meanwhile, and are replayed on reconnect.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from collections import deque
from typing import Any

from xl import envnames, wire
from xl.client.records import cuda_counters, drain, sys_line
from xl.client.spool import Spool
from xl.client.watch import CommWatch

MAX_QUEUE = 100_000
INTERVAL_S = 0.1
SYS_INTERVAL_S = 1.0
MAX_UNACKED = 64
# Frames are cut well under the collector's cap so one batch never trips it; with at most
# MAX_UNACKED frames in flight, unacked data stays under 16 MiB.
FRAME_BUDGET = wire.MAX_FRAME // 4
_ACK_SIZE = 8
# Unacked frames wait this long after a lost connection to be resent as they were (then the spool).
RESEND_WAIT_S = 5.0


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class Sender:
    """Everything the background thread owns. One instance per process (reset after fork)."""

    def __init__(self) -> None:
        host, _, port = os.environ.get(envnames.COLLECTOR, "").rpartition(":")
        self.address = (host.strip("[]") or "127.0.0.1", int(port) if port.isdigit() else 0)
        self.token = os.environ.get(envnames.TOKEN, "").encode()
        self.rank = _env_int("RANK", 0)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.pid = os.getpid()
        self.spool = Spool(os.environ.get(envnames.RUN_DIR), self.rank, self.pid)
        self.queue: deque[tuple[float, dict[str, Any]]] = deque()
        # Overridable so tests can make the queue overflow on purpose.
        self.max_queue = max(1, _env_int(envnames.LOG_QUEUE, MAX_QUEUE))
        self.comm = CommWatch()
        self.dropped = 0
        self.owns_train = False
        self.given: set[str] = set()  # train keys the rank gives itself (records.drain)
        self.step_source: Any = None  # xl.client.attach_steps
        self.seq = 0
        self.sock: socket.socket | None = None
        self.next_connect = 0.0
        self.backoff = 0.2
        self.disconnected_at: float | None = None  # while unacked frames wait to be resent
        self.unverified = 0  # listeners that did not prove the run's token (nothing was sent)
        self.spooled_live = False  # lines went to the spool since it was last claimed
        # (seq, lines, from the replay) of every frame sent and not acked yet.
        self.unacked: deque[tuple[int, list[bytes], bool]] = deque()
        self.ack_buf = b""
        self.last_rate_t: dict[str, float] = {}
        self.last_sys = 0.0
        self.io_lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = False
        self.flushing = False
        self.thread = threading.Thread(target=self._run, name="xl-log", daemon=True)

    def reset_after_fork(self) -> None:
        """A forked child keeps the queue object (``log`` closures handed out append to it) but
        gets its own thread, connection, spool and counters; what the parent queued is the
        parent's."""
        self.queue.clear()
        self.comm.reset()
        self.pid = os.getpid()
        self.spool.reset_after_fork(self.pid)
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()  # the parent's connection; the child must not write to it
        self.sock = None
        self.unacked.clear()
        self.disconnected_at = None
        self.dropped = 0
        self.seq = 0
        self.owns_train = False
        self.given, self.step_source = set(), None  # the parent's steps are the parent's
        self.last_rate_t = {}
        self.io_lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="xl-log", daemon=True)
        self.thread.start()

    # -- the background loop ----------------------------------------------------------------

    def _run(self) -> None:
        while not self.stopping:
            self.wake.wait(INTERVAL_S)
            self.wake.clear()
            try:
                with self.io_lock:
                    self.pump()
            except Exception:  # the sender must outlive any bug: training goes on
                time.sleep(INTERVAL_S)

    def pump(self) -> None:
        lines = self._drain_queue()
        now = time.monotonic()
        if now - self.last_sys >= SYS_INTERVAL_S:
            self.last_sys = now
            t = time.time()
            line = sys_line(t, self.rank, {**self.comm.summary(), **cuda_counters(self.local_rank)})
            if line is not None:
                lines.append(line)
        # Connect only with something to say: a forked worker that never logs opens nothing.
        wants = lines or self.unacked or self.owns_train or self.spool.replay is not None
        if self.sock is None and wants and now >= self.next_connect:
            self._connect()
        if self.sock is None and self.unacked and now - (self.disconnected_at or now) >= RESEND_WAIT_S:
            self._spool_unacked()
        if self.sock is not None:
            self._read_acks()
        self._claim_live()
        if (
            self.sock is not None
            and self.spool.replay is not None
            and len(self.unacked) < MAX_UNACKED
        ):
            self._send_replay()
        if lines:
            if self.sock is not None and len(self.unacked) < MAX_UNACKED:
                self._send(lines, from_replay=False)
            else:
                self._spool(lines)

    def _drain_queue(self) -> list[bytes]:
        if self.queue:
            self.owns_train = True
        final = self.flushing or self.stopping  # every step, even one that just ended
        out, dropped = drain(self.queue, self.rank, self.last_rate_t, self.given, self.step_source, final)
        self.dropped += dropped  # counted, so the run's events say so
        return out

    # -- transport ----------------------------------------------------------------------------

    def _connect(self) -> None:
        sock, listener = _open(self.address, self.token, self.rank)
        if sock is None:
            self.unverified += listener  # it answered, and did not prove the token: it got nothing
            self.next_connect = time.monotonic() + self.backoff
            self.backoff = min(self.backoff * 2, 2.0)
            return
        self.sock = sock
        self.backoff = 0.2
        self.ack_buf = b""
        self.disconnected_at = None
        # What the last connection left unacked goes first, as it was: the collector drops what
        # it had already stored (by seq).
        for seq, chunk, _replay in list(self.unacked):
            self._write_frame(seq, chunk)
            if self.sock is None:
                return
        if self.owns_train:
            self._send_frame([], False)  # hello: the collector learns this rank logs itself
        self.spool.claim()

    def _claim_live(self) -> None:
        """Lines spooled since the last claim (while connected with MAX_UNACKED frames in
        flight, or while a replay was going on) are replayed once the replay before them is
        done, not at the next reconnect, which may never come."""
        if self.sock is not None and self.spooled_live and self.spool.replay is None:
            self.spooled_live = False
            self.spool.claim()

    def _send_replay(self) -> None:
        spool = self.spool
        lines = spool.replay_lines()
        if lines is None:
            return
        pending = lines[spool.replay_sent :]
        if not pending and not any(r for _, _, r in self.unacked):
            spool.finish_replay()
            return
        if pending:
            self._send(pending, from_replay=True)
            if self.sock is not None:
                spool.replay_sent = len(lines)

    def _send(self, lines: list[bytes], *, from_replay: bool) -> None:
        for chunk in _chunks(lines):
            if self.sock is None:
                if not from_replay:
                    self._spool(chunk)
                continue
            self._send_frame(chunk, from_replay)

    def _send_frame(self, chunk: list[bytes], from_replay: bool) -> None:
        assert self.sock is not None
        self.seq += 1
        self.unacked.append((self.seq, chunk, from_replay))
        self._write_frame(self.seq, chunk)

    def _write_frame(self, seq: int, chunk: list[bytes]) -> None:
        assert self.sock is not None
        header: dict[str, Any] = {
            "v": wire.VERSION,
            "rank": self.rank,
            "pid": self.pid,
            "seq": seq,
            "dropped": self.dropped,
        }
        if self.owns_train:
            header["train"] = True
        if self.flushing:
            header["ack"] = True
        frame = wire.encode_batch(header, chunk)
        try:
            self.sock.sendall(frame)
        except OSError:
            self._disconnect()

    def _read_acks(self, *, wait: float = 0.0) -> None:
        sock = self.sock
        if sock is None:
            return
        while True:
            # select first: a socket with a timeout would otherwise wait in recv.
            try:
                ready, _, _ = select.select([sock], [], [], wait)
            except (OSError, ValueError):
                self._disconnect()
                return
            if not ready:
                return
            try:
                data = sock.recv(4096)
            except (BlockingIOError, InterruptedError, TimeoutError):
                return
            except OSError:
                self._disconnect()
                return
            if not data:
                self._disconnect()
                return
            buf = self.ack_buf + data
            usable = len(buf) - len(buf) % _ACK_SIZE
            if usable:
                self._acked(int.from_bytes(buf[usable - _ACK_SIZE : usable], "big"))
            self.ack_buf = buf[usable:]
            if not self.unacked:
                return
            wait = 0.0

    def _acked(self, seq: int) -> None:
        while self.unacked and self.unacked[0][0] <= seq:
            self.unacked.popleft()
        # Once all sent: a file claimed while frames waited (a frozen collector) is not done yet.
        if self.spool.replay is not None and self.spool.all_sent() and not any(r for _, _, r in self.unacked):
            self.spool.finish_replay()

    def _disconnect(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock = None
        self.next_connect = time.monotonic() + self.backoff
        if self.unacked and self.disconnected_at is None:
            self.disconnected_at = time.monotonic()  # resent as they are on reconnect

    def _spool_unacked(self) -> None:
        # Unacked live frames go to the spool; unacked replay lines are still in the replay
        # file and are sent again from the last fully acked position.
        self.disconnected_at = None
        pending = list(self.unacked)
        self.unacked.clear()
        live = [line for _, chunk, from_replay in pending if not from_replay for line in chunk]
        self.spool.rewind(sum(len(chunk) for _, chunk, r in pending if r))
        if live:
            self._spool(live)

    def _spool(self, lines: list[bytes]) -> None:
        self.spooled_live = True
        if not self.spool.append(lines):
            self.dropped += len(lines)

    # -- flushing ----------------------------------------------------------------------------

    def flush(self, timeout: float) -> bool:
        """Send everything queued and wait (bounded) for the collector's acks."""
        deadline = time.monotonic() + max(0.0, timeout)
        if not self.io_lock.acquire(timeout=max(0.0, timeout)):
            return False
        try:
            self.flushing = True  # frames sent now ask for their ack at once
            self.last_sys = 0.0  # include the last comm waits / CUDA counters
            sent_before = self.seq
            self.pump()
            if self.sock is not None and self.unacked and self.seq == sent_before:
                self._send_frame([], False)  # a ping: acks everything before it
            while (self.unacked or self.spool.replay is not None or self.spooled_live) and self.sock is not None:
                if time.monotonic() >= deadline:
                    break
                self._read_acks(wait=max(0.01, min(0.5, deadline - time.monotonic())))
                self._claim_live()
                if self.spool.replay is not None and self.sock is not None:
                    self._send_replay()
            # Stored means acked: nothing unacked, queued or waiting in the spool, and nothing
            # ever dropped (a dropped record is one logged and never stored).
            return not self.unacked and not self.queue and not self.spool.pending() and not self.dropped
        finally:
            self.flushing = False
            self.io_lock.release()

    def shutdown(self, timeout: float) -> None:
        self.flush(timeout)
        with self.io_lock:
            self.stopping = True
            if self.sock is not None:
                self._disconnect()
            if self.unacked:
                self._spool_unacked()  # still unacked at exit: the spool keeps it for the supervisor
            leftover = self._drain_queue()
            if leftover:
                self._spool(leftover)


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


def _chunks(lines: list[bytes]) -> list[list[bytes]]:
    # Records over the collector's per-record cap were already cut out by train_line.
    chunks: list[list[bytes]] = []
    current: list[bytes] = []
    size = 0
    for line in lines:
        if current and size + len(line) + 1 > FRAME_BUDGET:
            chunks.append(current)
            current, size = [], 0
        current.append(line)
        size += len(line) + 1
    if current:
        chunks.append(current)
    return chunks
