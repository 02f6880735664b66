"""How the nodes of a multi-node run reach node 0, so node 0's run dir is the one view of the run.

The contract (README, "Several nodes"):

- ``XL_TOKEN``: the run's secret, the same on every node. Node 0 takes it from its environment
  when set (Slurm passes one to every node), else makes one and prints the command to run on the
  other nodes with it. Every other node needs it.
- ``XL_COLLECTOR_PORT``: the port of node 0's collector, the same on every node; default: the
  ``--rdzv`` port + 1. Node 0's collector listens on the ``--rdzv`` host at that port; the ranks
  of every node send their ``xl.log`` frames there, and the supervisor of every other node sends
  what it records over one connection, a :class:`NodeLink`.

A node frame is a wire frame whose header names the node instead of a rank
(``{"v", "token", "node", "host", "pid", "seq"}``); each body line is one JSON object with a
``type``:

    ranks    {"ranks": [...]}                 its ranks as in its run.json
    log      {"rank", "data"}                 a rank's output (text; undecodable bytes escaped)
    event    {"event": {...}}                 a lifecycle event (rank_started, rank_exited, ...)
    failure  {"failure": {...}, "at": t}      its root cause, and when it happened
    end      {"status", "failure", "at"}      its run ended
    rec      {"rank", "line"}                 a metrics.jsonl line it sampled

A frame without body lines, every second, is the heartbeat. Node 0 answers each frame with a
reply frame ``{"ack": seq}`` (same length prefix) and tells every node ``{"stop": {"reason",
"failure"}}`` when the run ends anywhere. Frames are resent after a reconnect until acked; node
0 drops the ones it already has (by seq). A frame whose token is not the run's is answered
``{"error": "bad_token"}`` (nothing else, nothing of the real token): the link then stops for
good and ``commands()`` returns ``{"refused": "bad_token"}``, for the supervisor to say so and
end this node's part (retrying with the same token could never succeed).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import math
import os
import re
import secrets
import select
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, MutableMapping
from typing import Any

from xl import wire
from xl.errors import UsageError
from xl.launcher.plan import parse_rdzv
from xl.launcher.spec import LaunchSpec

TOKEN_VAR = "XL_TOKEN"
PORT_VAR = "XL_COLLECTOR_PORT"
_TOKEN = re.compile(r"^[A-Za-z0-9._~+/=-]{16,256}$")

# Events of another node that node 0 records too; the rest (its diagnoses) node 0 makes itself
# from the metrics it receives.
FORWARDED_EVENTS = frozenset(
    {"run_started", "rank_started", "rank_exited", "stop_requested", "run_ended", "exit_barrier"}
)
MESSAGE_TYPES = frozenset({"ranks", "log", "event", "failure", "end", "rec"})
_FINAL = ("succeeded", "failed", "stopped")
MAX_RANKS = 1 << 16
MAX_LOG_CHUNK = 16 << 10
_MAX_TEXT = 64 << 10  # a traceback
_MAX_FIELD_TEXT = 4096  # any other text of an event, rank or failure
_CLIPPED = "[...]"
_MAX_FIELDS = 32
_RANK_LIMIT = 1 << 20

# Node 0 closes a connection that sent no valid frame within collector.IDLE_S (30 s) of opening,
# and declares a node lost after XL_NODE_TIMEOUT (>= 2 s) without a frame: a link's first
# heartbeat comes HEARTBEAT_S after it connects, and one every HEARTBEAT_S after that.
HEARTBEAT_S = 1.0
_CONNECT_TIMEOUT_S = 2.0
_IO_TIMEOUT_S = 5.0
_MAX_PENDING = 64 << 20  # bytes waiting to be sent before new messages are dropped
_MAX_UNACKED = 64
_FRAME_BUDGET = wire.MAX_FRAME // 4


# ------------------------------------------------------------------ the contract


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def hub_address(rdzv: str, env: Mapping[str, str]) -> tuple[str, int]:
    """(host, port) of node 0's collector: the --rdzv host, XL_COLLECTOR_PORT or rdzv port + 1."""
    host, port = parse_rdzv(rdzv)
    raw = env.get(PORT_VAR, "").strip()
    if raw:
        if not (raw.isascii() and raw.isdigit() and 0 < int(raw) < 65536):
            raise UsageError(f"{PORT_VAR}={raw!r} is not a port; use 1-65535, the same on every node")
        return host, int(raw)
    if port + 1 > 65535:
        raise UsageError(
            f"--rdzv port {port} leaves no port for node 0's collector (it uses the next one); "
            f"set {PORT_VAR} to a free port, the same on every node"
        )
    return host, port + 1


def valid_token(token: str | None) -> bool:
    return bool(token) and _TOKEN.match(token or "") is not None


def token_from_env(env: Mapping[str, str], node_rank: int) -> str | None:
    """The run's token from XL_TOKEN; None on node 0 when unset (it makes one)."""
    token = env.get(TOKEN_VAR, "")
    if not token:
        if node_rank > 0:
            raise UsageError(
                f"--node-rank {node_rank} needs {TOKEN_VAR}, the run's token: run the command node 0's "
                f"'xl launch' printed (or give every node the same {TOKEN_VAR})"
            )
        return None
    if not valid_token(token):
        raise UsageError(
            f"{TOKEN_VAR} must be 16-256 letters, digits or -_.~+/= (e.g. from 'openssl rand -hex 16')"
        )
    return token


def listen_host(host: str) -> str:
    """Where node 0's collector binds: the --rdzv host, or every address when that name is a
    loopback alias here (hosts files map the machine's own name to 127.0.1.1), which the other
    nodes could not reach. Frames still need the token."""
    try:
        ipaddress.ip_address(host)
        return host  # an address written out is taken as it is
    except ValueError:
        pass
    try:
        addr = str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError):
        return host
    if host != "localhost" and ipaddress.ip_address(addr.split("%")[0]).is_loopback:
        return "::" if ":" in addr else "0.0.0.0"
    return host


def check_listen(host: str, port: int) -> None:
    """Node 0: fail early, with the fix, when its collector could not listen where nodes dial."""
    host = listen_host(host)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise UsageError(f"--rdzv host {host!r} does not resolve here ({exc.strerror or exc})") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        raise UsageError(
            f"node 0 cannot listen on {format_address(host, port)} for the run's collector "
            f"({exc.strerror or exc}); run node 0 on the --rdzv host, or set {PORT_VAR} to a free "
            "port, the same on every node"
        ) from None
    finally:
        sock.close()


def join_command(spec: LaunchSpec, node_rank: int, token: str | None, port_env: str | None) -> str:
    """The command for another node; ``token`` None: the token came from the environment."""
    assigns = [f"{TOKEN_VAR}={_quote(token)}" if token else f'{TOKEN_VAR}="${TOKEN_VAR}"']
    if port_env:
        assigns.append(f"{PORT_VAR}={_quote(port_env)}")
    argv = ["xl", "launch", "--nnodes", str(spec.nnodes), "--node-rank", str(node_rank), "--rdzv", str(spec.rdzv)]
    if spec.gpus is not None:
        argv += ["--gpus", spec.gpus]
    if spec.nproc is not None:
        argv += ["--nproc", str(spec.nproc)]
    if spec.mixed_precision is not None:
        argv += ["--mixed-precision", spec.mixed_precision]
    for key, value in spec.env.items():
        argv += ["--env", f"{key}={value}"]
    if spec.name:
        argv += ["--name", spec.name]
    if spec.script is not None:
        argv += (["--"] if spec.script.startswith("-") else []) + [spec.script]
    else:
        argv += ["-m", str(spec.module)]
    argv += list(spec.args)
    return " ".join([*assigns, *map(_quote, argv)])


def join_text(spec: LaunchSpec, token: str | None, port_env: str | None) -> str:
    """What node 0's `xl launch` prints for the person starting the other nodes."""
    where = spec.cwd or os.getcwd()
    if spec.nnodes == 2:
        head = f"xl: this is node 0 of 2; on the other node, in {where}, run:"
    else:
        head = (
            f"xl: this is node 0 of {spec.nnodes}; on each other node, in {where}, run this "
            f"with that node's --node-rank (1 to {spec.nnodes - 1}):"
        )
    tail = "" if token else f"\n  (with the same {TOKEN_VAR} as this node)"
    return f"{head}\n  {join_command(spec, 1, token, port_env)}{tail}\n"


def prepare_launch(spec: LaunchSpec, env: MutableMapping[str, str]) -> str | None:
    """`xl launch` of a multi-node run, before anything starts: check the contract (UsageError),
    put the run's token in ``env`` for the supervisor, and return what node 0 prints."""
    host, port = hub_address(spec.rdzv or "", env)
    given = token_from_env(env, spec.node_rank)
    if spec.node_rank > 0:
        return None
    check_listen(host, port)
    token = given or secrets.token_hex(16)
    # The supervisor (forked from this process, or started by it) reads it from there; it never
    # goes to run.json nor to a command line.
    env[TOKEN_VAR] = token
    # A token the person gave is not printed back (it may be in a batch job's log).
    return join_text(spec, None if given else token, env.get(PORT_VAR))


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


# ------------------------------------------------------------------ node 0: checking messages


def _check_value(value: Any, max_text: int) -> None:
    kind = type(value)
    if kind is float:
        if not math.isfinite(value):
            raise wire.FrameError("bad_value")
    elif kind is str:
        if len(value) > max_text:
            raise wire.FrameError("bad_value")
    elif not (value is None or kind is int or kind is bool):
        raise wire.FrameError("bad_value")


def _check_fields(obj: Any, *, max_text: int = _MAX_FIELD_TEXT, text_keys: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A flat dict of scalars (strings capped), as events, ranks and failures are."""
    if type(obj) is not dict or len(obj) > _MAX_FIELDS:
        raise wire.FrameError("bad_node_message")
    for key, value in obj.items():
        if type(key) is not str or len(key) > wire.MAX_KEY_LEN:
            raise wire.FrameError("bad_key")
        _check_value(value, _MAX_TEXT if key in text_keys else max_text)
    return obj


def _rank(value: Any) -> int:
    if type(value) is not int or not 0 <= value < _RANK_LIMIT:
        raise wire.FrameError("bad_rank")
    return int(value)


def _time(value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise wire.FrameError("bad_time")
    return float(value)


def check_message(obj: Any) -> dict[str, Any]:
    """Validate one body line of a node frame (already JSON-decoded); FrameError when bad."""
    if type(obj) is not dict or obj.get("type") not in MESSAGE_TYPES:
        raise wire.FrameError("bad_node_message")
    kind = obj["type"]
    if kind == "log":
        _rank(obj.get("rank"))
        data = obj.get("data")
        if type(data) is not str or len(data) > MAX_LOG_CHUNK:
            raise wire.FrameError("bad_value")
    elif kind == "rec":
        _rank(obj.get("rank"))
        line = obj.get("line")
        if type(line) is not str or len(line) > wire.MAX_RECORD:
            raise wire.FrameError("record_too_large")
    elif kind == "event":
        event = _check_fields(obj.get("event"))
        if event.get("kind") not in FORWARDED_EVENTS:
            raise wire.FrameError("bad_kind")
    elif kind == "ranks":
        ranks = obj.get("ranks")
        if type(ranks) is not list or len(ranks) > MAX_RANKS:
            raise wire.FrameError("bad_node_message")
        for info in ranks:
            _rank(_check_fields(info).get("rank"))
    elif kind == "failure":
        _check_fields(obj.get("failure"), text_keys=frozenset({"traceback"}))
        _time(obj.get("at"))
    else:  # end
        if obj.get("status") not in _FINAL:
            raise wire.FrameError("bad_value")
        if obj.get("failure") is not None:
            _check_fields(obj["failure"], text_keys=frozenset({"traceback"}))
        _time(obj.get("at"))
    return obj


def clip_failure(failure: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``failure`` within what node 0 takes (check_message): the head of long texts
    (message, error), the tail of the traceback (where the exception is)."""
    out = dict(failure)
    for key, value in failure.items():
        if type(value) is not str:
            continue
        if key == "traceback":
            if len(value) > _MAX_TEXT:
                out[key] = _CLIPPED + value[len(value) - (_MAX_TEXT - len(_CLIPPED)) :]
        elif len(value) > _MAX_FIELD_TEXT:
            out[key] = value[: _MAX_FIELD_TEXT - len(_CLIPPED)] + _CLIPPED
    return out


def reply(obj: dict[str, Any]) -> bytes:
    return wire.encode_frame(json.dumps(obj, separators=(",", ":")).encode())


# ------------------------------------------------------------------ nodes > 0: the link


class NodeLink:
    """One connection from this node's supervisor to node 0's collector, in its own thread.

    ``send`` never blocks nor raises: messages wait in memory (up to 64 MiB, then new ones are
    dropped and counted) while node 0 cannot be reached, and training goes on either way.
    ``commands()`` returns what node 0 asked (``{"stop": {...}}``) since the last call.
    """

    def __init__(self, host: str, port: int, token: str, node: int, hostname: str) -> None:
        self.address = (host, port)
        self._header = {"v": wire.VERSION, "token": token, "node": node, "host": hostname[:256], "pid": os.getpid()}
        self._lock = threading.Lock()
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._unacked: deque[tuple[int, bytes]] = deque()
        self._commands: list[dict[str, Any]] = []
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
        self._said: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="xl-nodelink", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, msg: dict[str, Any]) -> None:
        if msg.get("type") in ("failure", "end") and isinstance(msg.get("failure"), dict):
            # Too long a text would have node 0 reject the whole message (a load_state_dict
            # error easily is).
            msg = {**msg, "failure": clip_failure(msg["failure"])}
        try:
            line = json.dumps(msg, separators=(",", ":"), default=str, allow_nan=False).encode()
        except (TypeError, ValueError):
            return
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
            self.send({"type": "log", "rank": rank, "data": text[i : i + MAX_LOG_CHUNK]})

    def commands(self) -> list[dict[str, Any]]:
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
            self._say(f"{dropped} message(s) of this node were dropped (too much waiting to be sent); they are in its own run dir")
        return done

    # -- the thread ---------------------------------------------------------------------------

    def _say(self, what: str) -> None:
        if what not in self._said:  # once per kind of trouble, in supervisor.log
            self._said.add(what)
            print(f"xl supervisor: node 0 at {format_address(*self.address)}: {what}", file=sys.stderr, flush=True)

    def _run(self) -> None:
        while True:
            with self._lock:
                idle = not self._pending and not self._unacked
                if self.refused is not None or (self._closing and (idle or time.monotonic() >= self._deadline)):
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
            self._say(f"cannot connect yet ({exc.strerror or exc}); this node keeps its own records meanwhile")
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
            ack = msg.get("ack")
            with self._lock:
                if type(ack) is int:
                    while self._unacked and self._unacked[0][0] <= ack:
                        self._unacked.popleft()
                elif isinstance(msg.get("stop"), dict):
                    self._commands.append(msg)
                elif msg.get("error") == "bad_token":
                    self._refuse("bad_token")
                    break
        self._inbuf = buf

    def _refuse(self, reason: str) -> None:
        """Node 0 refused this node (lock held): stop sending for good, tell the supervisor."""
        self.refused = reason
        self._commands.append({"refused": reason})
        self._pending.clear()
        self._pending_bytes = 0
        self._unacked.clear()
        self._say("refused this node's XL_TOKEN (not the run's token); the link stops")

