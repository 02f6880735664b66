"""The node link: how the supervisor of a node other than 0 sends what it records to node 0.

Node 0's collector listens where every node can reach it (xl.launcher.multinode.join says
where, and with which token); each other node's supervisor keeps one connection there, a
:class:`NodeLink`, and sends node frames whose body lines xl.launcher.multinode.protocol
defines and node 0 checks.

A frame without body lines, every second, is the heartbeat. Node 0 answers each frame with a reply
frame ``{"ack": seq}`` (same length prefix) and tells every node ``{"stop": {"reason", "failure"}}``
when the run ends anywhere, ``{"stacks": {"id", "rank", "timeout"}}`` when it wants this node's
ranks' stacks (``xl stacks`` or a hang on node 0; the supervisor answers), and ``{"logs": {"id",
"rank", "offset"}}`` when it wants a piece of a rank's output (``xl logs`` on node 0). Frames
are resent after a reconnect until acked; node 0 drops the ones it already has (by seq). Each
connection opens with ``xl.handshake`` (role ``n``, this node's number): node 0 proves it holds
the run's token before this node sends it anything, and the token never travels. When node 0
answers that this node's proof is wrong, the link stops for good and ``commands()`` returns
``{"refused": "bad_token"}``, for the supervisor to say so and end this node's part (retrying
with the same token could never succeed). A listener
that proves nothing (another program on node 0's port) gets nothing; the link says so and tries
again later.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xl import handshake, wire
from xl.address import format_address
from xl.launcher.multinode.clip import clip_failure
from xl.launcher.multinode.protocol import (
    MAX_LOG_CHUNK,
    MAX_STACKS_ID,
    EndMessage,
    FailureMessage,
    LogMessage,
    Outgoing,
)
from xl.launcher.rundir.outcome import Failure

# Node 0 closes a connection that sent no valid frame within collector.IDLE_S (30 s) of opening,
# and declares a node lost after XL_NODE_TIMEOUT (>= 2 s) without a frame: a link's first
# heartbeat comes HEARTBEAT_S after it connects, and one every HEARTBEAT_S after that.
HEARTBEAT_S = 1.0
_CONNECT_TIMEOUT_S = 2.0
_IO_TIMEOUT_S = 5.0
_MAX_PENDING = 64 << 20  # bytes waiting to be sent before new messages are dropped
_MAX_UNACKED = 64
_FRAME_BUDGET = wire.MAX_FRAME // 4


@dataclass(frozen=True, slots=True)
class StopCommand:
    """Node 0 ends the run: asked for (``xl stop`` there, or on another node), or it failed."""

    requested: bool
    failure: Failure | None  # the run's root cause, as node 0 has it (a failure only)


@dataclass(frozen=True, slots=True)
class StacksAsk:
    id: str
    rank: int | None  # None: every rank of this node
    timeout: float | None  # seconds node 0 waits (None: not said)


@dataclass(frozen=True, slots=True)
class LogsAsk:
    id: str
    rank: int
    offset: int  # from where in its output file


@dataclass(frozen=True, slots=True)
class Refused:
    """Not from node 0's replies: the link's word that node 0 refused this node's token."""

    reason: str


Command = StopCommand | StacksAsk | LogsAsk | Refused


def parse_command(msg: Mapping[str, object]) -> Command | None:
    """What node 0 asks in a reply frame (``{"stacks": ...}``, ``{"logs": ...}``,
    ``{"stop": ...}``), None for anything else (an ack, or what this xl does not know)."""
    ask = msg.get("stacks")
    if isinstance(ask, dict):
        ident, rank, timeout = _ident(ask), ask.get("rank"), ask.get("timeout")
        if not ident or not (rank is None or type(rank) is int):
            return None
        if not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
            timeout = None
        return StacksAsk(ident, rank, None if timeout is None else float(timeout))
    ask = msg.get("logs")
    if isinstance(ask, dict):
        ident, rank, offset = _ident(ask), ask.get("rank"), ask.get("offset")
        if not ident or type(rank) is not int:
            return None
        return LogsAsk(ident, rank, offset if type(offset) is int and offset >= 0 else 0)
    stop = msg.get("stop")
    if isinstance(stop, dict):
        failure = stop.get("failure")
        return StopCommand(
            stop.get("reason") == "requested",
            Failure.from_json(failure) if isinstance(failure, dict) else None,
        )
    return None


def _ident(ask: dict[str, Any]) -> str:
    return str(ask.get("id") or "")[:MAX_STACKS_ID]


class NodeLink:
    """One connection from this node's supervisor to node 0's collector, in its own thread.

    ``send`` never blocks nor raises: messages wait in memory (up to 64 MiB, then new ones are
    dropped and counted) while node 0 cannot be reached, and training goes on either way.
    ``commands()`` returns what node 0 asked (``{"stop": {...}}``, ``{"stacks": {...}}``) since the
    last call.
    """

    def __init__(self, host: str, port: int, token: str, node: int, hostname: str) -> None:
        self.address = (host, port)
        self._token, self._node = token.encode(), node
        self._header = {"v": wire.VERSION, "node": node, "host": hostname[:256], "pid": os.getpid()}
        self._lock = threading.Lock()
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._unacked: deque[tuple[int, bytes]] = deque()
        self._commands: list[Command] = []
        self._seq = 0
        self._sock: socket.socket | None = None
        self._inbuf = b""
        self._next_connect = 0.0
        self._backoff = 0.2
        self._last_sent = 0.0
        self._wake = threading.Event()
        self._closing = False
        self._deadline = math.inf
        self.dropped = 0  # messages not queued (too much waiting, or closing): said in close()
        self.refused: str | None = None  # node 0 refused this link (its reason): it stopped
        self.heard_at: float | None = None  # monotonic; node 0's last reply frame (None: never)
        self._said: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="xl-nodelink", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, msg: Outgoing) -> None:
        """A message to node 0, made its JSON line here."""
        obj = msg.to_json()
        failure = obj.get("failure")
        if isinstance(msg, (FailureMessage, EndMessage)) and isinstance(failure, Mapping):
            # Too long a text would have node 0 reject the whole message (a load_state_dict
            # error easily is).
            obj["failure"] = clip_failure(failure)
        try:
            line = json.dumps(obj, separators=(",", ":"), default=str, allow_nan=False).encode()
        except (TypeError, ValueError):
            return
        self.send_line(line)

    def send_line(self, line: bytes) -> None:
        """One body line to node 0 as it is, unchecked: what ``send`` makes of a message."""
        with self._lock:
            if self.refused is not None:
                return  # node 0 takes nothing from this node; its own run dir has it all
            if self._closing or self._pending_bytes + len(line) > _MAX_PENDING:
                self.dropped += 1
                return
            self._pending.append(line)
            self._pending_bytes += len(line)
        self._wake.set()

    def send_log(self, rank: int, data: bytes) -> None:
        # surrogateescape: bytes that are not UTF-8 travel as escapes and come out unchanged.
        text = data.decode("utf-8", "surrogateescape")
        for i in range(0, len(text), MAX_LOG_CHUNK):
            self.send(LogMessage(rank, text[i : i + MAX_LOG_CHUNK]))

    def commands(self) -> list[Command]:
        with self._lock:
            out, self._commands = self._commands, []
        return out

    def close(self, timeout: float) -> bool:
        """Send what is queued (until ``timeout``), then disconnect; True when all was acked."""
        with self._lock:
            self._closing = True
            self._deadline = time.monotonic() + timeout
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout + 1.0)
        with self._lock:
            done = self.refused is None and not self._pending and not self._unacked
            dropped = self.dropped
        self._disconnect()
        if dropped:
            self._say(
                f"{dropped} message(s) of this node were dropped (too much waiting to be sent); "
                "they are in its own run dir"
            )
        return done

    # -- the thread ---------------------------------------------------------------------------

    def _say(self, what: str) -> None:
        if what not in self._said:  # once per kind of failure, in supervisor.log
            self._said.add(what)
            print(
                f"xl supervisor: node 0 at {format_address(*self.address)}: {what}",
                file=sys.stderr,
                flush=True,
            )

    def _run(self) -> None:
        while True:
            with self._lock:
                idle = not self._pending and not self._unacked
                if self.refused is not None or (
                    self._closing and (idle or time.monotonic() >= self._deadline)
                ):
                    if self.refused is not None:
                        self._disconnect()
                    return
            try:
                self._step()
            except Exception as exc:  # the link must never take the supervisor down
                self._say(f"link error {exc!r}")
                self._disconnect()
                time.sleep(0.2)

    def _step(self) -> None:
        now = time.monotonic()
        if self._sock is None:
            if now < self._next_connect:
                self._wake.wait(min(0.1, self._next_connect - now))
                self._wake.clear()
                return
            if not self._connect():
                return
        self._send_pending(now)
        sock = self._sock
        if sock is None:
            return
        readable, _, _ = select.select([sock], [], [], 0.05)
        if readable:
            self._read()
        if not readable and not self._pending:
            self._wake.wait(0.05)
            self._wake.clear()

    def _connect(self) -> bool:
        try:
            sock = socket.create_connection(self.address, timeout=_CONNECT_TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(_IO_TIMEOUT_S)
        except OSError as exc:
            self._say(
                f"cannot connect yet ({exc.strerror or exc}); this node keeps its own records "
                "meanwhile"
            )
            self._next_connect = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, 2.0)
            return False
        verdict = handshake.client_handshake(sock, self._token, handshake.ROLE_NODE, self._node)
        if verdict != handshake.OK:
            with contextlib.suppress(OSError):
                sock.close()
            if verdict == handshake.REFUSED_TOKEN:
                with self._lock:
                    self._refuse("bad_token")
                return False
            self._say(
                "the listener there did not prove it holds this run's XL_TOKEN (another program "
                "on that port?); nothing was sent to it, trying again"
            )
            self._next_connect = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, 2.0)
            return False
        self._sock, self._inbuf, self._backoff = sock, b"", 0.2
        # Whatever node 0 had not acked goes again; it drops the frames it already has.
        with self._lock:
            resend = [frame for _, frame in self._unacked]
        try:
            for frame in resend:
                sock.sendall(frame)
        except OSError:
            self._disconnect()
            return False
        self._last_sent = time.monotonic()
        return True

    def _disconnect(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
            self._next_connect = time.monotonic() + self._backoff

    def _send_pending(self, now: float) -> None:
        while self._sock is not None:
            with self._lock:
                if len(self._unacked) >= _MAX_UNACKED:
                    return
                lines: list[bytes] = []
                size = 0
                while self._pending and (not lines or size + len(self._pending[0]) < _FRAME_BUDGET):
                    line = self._pending.popleft()
                    self._pending_bytes -= len(line)
                    lines.append(line)
                    size += len(line) + 1
                if not lines and now - self._last_sent < HEARTBEAT_S:
                    return
                self._seq += 1
                frame = wire.encode_batch({**self._header, "seq": self._seq}, lines)
                self._unacked.append((self._seq, frame))
            try:
                self._sock.sendall(frame)
            except OSError:
                self._disconnect()  # kept in _unacked: sent again after the reconnect
                return
            self._last_sent = now
            if not lines:
                return

    def _read(self) -> None:
        assert self._sock is not None
        try:
            # Readable: returns at once (EINTR is retried by Python; a timeout socket never
            # raises BlockingIOError).
            data = self._sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self._disconnect()
            return
        buf = self._inbuf + data
        while len(buf) >= 4:
            (length,) = wire.HEADER.unpack_from(buf, 0)
            if length > wire.MAX_FRAME:
                self._disconnect()
                return
            if len(buf) < 4 + length:
                break
            raw, buf = buf[4 : 4 + length], buf[4 + length :]
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            self.heard_at = time.monotonic()
            ack = msg.get("ack")
            with self._lock:
                if type(ack) is int:
                    while self._unacked and self._unacked[0][0] <= ack:
                        self._unacked.popleft()
                elif (command := parse_command(msg)) is not None:
                    self._commands.append(command)
        self._inbuf = buf

    def _refuse(self, reason: str) -> None:
        """Node 0 refused this node (lock held): stop sending for good, tell the supervisor."""
        self.refused = reason
        self._commands.append(Refused(reason))
        self._pending.clear()
        self._pending_bytes = 0
        self._unacked.clear()
        self._say("refused this node's XL_TOKEN (not the run's token); the link stops")
