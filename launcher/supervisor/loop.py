"""The process that owns a run: ``python -m xl.launcher.supervisor RUN_DIR``.

Started by ``start_run`` in its own session with stdin from /dev/null, so neither Ctrl-C in the
launching terminal nor the terminal closing reaches it. It runs torchrun as its child and:

- receives every rank's stdout/stderr on a Unix socket (the rank's entry point connects to it) and
  writes it to ``logs/rank-<r>.log`` line by line, passing each line to telemetry;
- learns rank PIDs, exit codes and tracebacks from ``ranks/rank-<r>.json`` (written by the entry
  point) and keeps ``run.json`` and ``events.jsonl`` current;
- on the first failing rank records the root cause and stops the others; on SIGTERM/SIGINT
  (``xl stop``, Ctrl-C in ``xl launch``) stops every rank: SIGTERM, then SIGKILL after the grace
  period (``XL_STOP_GRACE`` seconds, default 10);
- is a child subreaper, so ranks orphaned by a killed torchrun become its children: it still
  ends them and collects their exit codes.

run.json (replaced atomically on every change)::

    run_id, name, status (running|succeeded|failed|stopped), spec, argv, env (what xl set), cwd,
    devices [{index, uuid, name}], nnodes, node_rank, nproc_per_node, world_size, host,
    started_at, ended_at (unix s), supervisor_pid, torchrun_pid, torchrun_exit_code, grace_s,
    stop_requested_at, ranks [{rank, local_rank, node, node_rank, pid, gpu, gpu_uuid, state,
    exit_code, started_at, ended_at}], failure {rank, exit_code, traceback, error, message, node,
    node_rank} | null

Rank ``state``: starting|running|exited|failed|stopped. ``exit_code`` < 0 means killed by that signal.
``failure.rank`` is null when no rank is to blame (torchrun itself died or could not start them).

events.jsonl kinds written here: run_started, rank_started (pid), rank_exited (exit_code), failure
(exit_code), stop_requested, run_ended (status); telemetry adds its diagnoses through ``emit``.
Also in the run dir: ranks/rank-<r>.json (what the entry point reports), logs/torchrun.log
(torchrun's own output), supervisor.log, sup.sock (the log socket, while running).

Several nodes (xl.launcher.multinode.nodelink): node 0's collector listens where every node can reach it
and its run dir becomes the run's one view. Every other node keeps its own run dir and also
sends node 0 its ranks, their output, lifecycle events, sampled metrics and its failure; node 0
adds them (``ranks`` of every node, ``node_rank`` on each), ends its part when another node fails
or is lost, tells the others to end theirs, and waits for their ends before finishing.
``failure`` then also names ``node`` (host) and ``node_rank``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import queue
import re
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xl.atomic import write_json_atomic
from xl.errors import UsageError
from xl.launcher import procs
from xl.launcher.control import grace_from_env
from xl.launcher.multinode import nodelink
from xl.proc import read_environ

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NAME = 15
_TICK_S = 0.1
# Node 0 of a multi-node run: a node whose link closed without its end is lost after this long
# (a supervisor that restarts its connection comes back well within it); one that went silent,
# after XL_NODE_TIMEOUT seconds. After its own ranks are done node 0 waits for every other
# node's end: without limit while that node is heard from with ranks running (under c10d global
# rank 0 may well be there, finishing last), else up to the stop grace plus this.
_NODE_CLOSED_S = 2.0
_NODE_TIMEOUT_S = 30.0
_NODE_END_WAIT_S = 10.0
_LINK_CLOSE_S = 3.0
# Node 0 records at most this many refused joins (a wrong XL_TOKEN), one per node, host and
# address: a peer cannot fill events.jsonl with them (collector.json counts every one).
_MAX_REFUSED_EVENTS = 16


def _debug(what: str) -> None:
    if os.environ.get("XL_DEBUG_TIMING"):
        print(f"{time.time():.3f} {what}", file=sys.stderr, flush=True)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _tail(path: Path, lines: int, limit: int, skip_blank: bool = False) -> list[str]:
    """The last ``lines`` lines of the file within its last ``limit`` bytes ([] when unreadable)."""
    try:
        with path.open("rb") as fh:
            start = max(0, fh.seek(0, os.SEEK_END) - limit)
            fh.seek(start)
            data = fh.read(limit)
    except OSError:
        return []
    rest = data.partition(b"\n")[2]
    if start > 0 and rest.strip():
        data = rest  # without the first line, cut by the seek
    text = data.decode("utf-8", "replace").splitlines()
    if skip_blank:
        text = [ln for ln in text if ln.strip()]
    return text[-lines:]


def describe_exit(rank: int, code: int | None) -> str:
    if code is None:
        return f"rank {rank} ended (exit code unknown)"
    if code < 0:
        return f"rank {rank} was killed by {_signal_name(code)}"
    return f"rank {rank} exited with code {code}"


@dataclass
class RankState:
    rank: int
    local_rank: int
    node: str
    gpu: int | None
    gpu_uuid: str | None
    node_rank: int = 0
    pid: int | None = None
    state: str = "starting"
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    traceback: str | None = None
    error: str | None = None
    record_mtime: float = 0.0
    alive_at: float | None = None  # the last time it was seen running
    vanished: bool = False  # ended without an exit record (killed)
    signalled: int | None = None  # the last signal xl sent it

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "node": self.node,
            "node_rank": self.node_rank,
            "pid": self.pid,
            "gpu": self.gpu,
            "gpu_uuid": self.gpu_uuid,
            "state": self.state,
            "exit_code": self.exit_code,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
        }

    @property
    def done(self) -> bool:
        return self.state in ("exited", "failed", "stopped")


@dataclass
class _Conn:
    sock: socket.socket
    rank: int | None = None
    head: bytes = b""
    partial: bytes = b""


@dataclass
class _Stop:
    reason: str  # "requested" | "failure" | "torchrun_died"
    since: float
    killed: bool = False
    extra: list[int] = field(default_factory=list)


@dataclass
class _RemoteNode:
    """Node 0's view of another node, from what its link sent."""

    node: int
    host: str = ""
    ranks: list[dict[str, Any]] = field(default_factory=list)
    seen: float = 0.0  # monotonic
    closed_at: float | None = None  # monotonic; its link closed without its end
    status: str | None = None  # its run ended with this
    lost: bool = False
    partial: dict[int, bytes] = field(default_factory=dict)
    idle_since: float | None = None  # monotonic; when node 0 learnt that none of its ranks runs

    @property
    def busy(self) -> bool:
        """Heard from (not lost), its part not ended, and some rank of it starting or running."""
        return self.status is None and not self.lost and self.idle_since is None


def _node_timeout() -> float:
    try:
        return max(2.0, float(os.environ.get("XL_NODE_TIMEOUT", _NODE_TIMEOUT_S)))
    except ValueError:
        return _NODE_TIMEOUT_S


class Supervisor:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.run: dict[str, Any] = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        self.run_id: str = self.run["run_id"]
        self.grace = float(self.run.get("grace_s") or grace_from_env())
        self.ranks: dict[int, RankState] = {}
        self.by_pid: dict[int, int] = {}
        self.conns: dict[int, _Conn] = {}
        self.log_fds: dict[int, int] = {}
        self.events_lock = threading.Lock()
        self.sel = selectors.DefaultSelector()
        self.torchrun: subprocess.Popen[bytes] | None = None
        self.torchrun_code: int | None = None
        self.stop: _Stop | None = None
        self.stop_signal: str | None = None
        self.failure: dict[str, Any] | None = None
        self.telemetry: Any = None
        self.telemetry_stopped = False
        self.dirty = False  # run.json needs rewriting
        self.write_errors: set[str] = set()
        self.token = secrets.token_hex(16)
        self.reparented: dict[int, int] = {}
        self.barrier_since: float | None = None  # multi-node: when torchrun outlived its ranks
        self.barrier_ended = False  # xl ended torchrun stuck at its exit barrier
        self.nnodes = int(self.run.get("nnodes") or 1)
        self.node_rank = int(self.run.get("node_rank") or 0)
        self.host = str(self.run.get("host") or socket.gethostname())
        self.failure_at: float | None = None  # when the root cause happened (any node's clock)
        self.failure_remote = False  # another node's failure, adopted: not sent back
        self.nodes_told = False  # node 0: the other nodes were told to stop
        self.last_words: dict[int, str] = {}  # a failed rank's last log line, when no traceback
        # Multi-node: node 0's collector address (every node), this node's link to it (nodes
        # > 0), and node 0's view of the others, fed by the collector thread through the inbox.
        self.hub: tuple[str, int] | None = None
        self.link: nodelink.NodeLink | None = None
        self.inbox: queue.SimpleQueue[tuple[int, str, list[dict[str, Any]] | None, float]] = queue.SimpleQueue()
        self.nodes: dict[int, _RemoteNode] = {}
        self.node_timeout = _node_timeout()
        self.local_done_at: float | None = None
        self.nodes_waited = False
        self.refused_seen: set[tuple[int, str, str]] = set()  # node 0: refused joins recorded
        self._multi_node_setup()
        self._init_ranks()

    def _multi_node_setup(self) -> None:
        if self.nnodes < 2:
            return
        try:
            self.hub = nodelink.hub_address(str((self.run.get("spec") or {}).get("rdzv") or ""), os.environ)
        except UsageError as exc:
            print(f"xl supervisor: no view of the other nodes: {exc}", file=sys.stderr, flush=True)
            return
        token = os.environ.get(nodelink.TOKEN_VAR)
        if nodelink.valid_token(token):
            self.token = str(token)
        elif self.node_rank > 0:
            print(
                f"xl supervisor: no valid {nodelink.TOKEN_VAR}: this node's records stay here only",
                file=sys.stderr,
                flush=True,
            )
            self.hub = None

    @property
    def is_hub(self) -> bool:
        """Node 0 of a multi-node run that gathers the other nodes."""
        return self.hub is not None and self.node_rank == 0

    # ---------------------------------------------------------------- records
    def _init_ranks(self) -> None:
        nproc = int(self.run["nproc_per_node"])
        node_rank = int(self.run.get("node_rank") or 0)
        devices = self.run.get("devices") or []
        host = str(self.run.get("host") or socket.gethostname())
        for local in range(nproc):
            rank = node_rank * nproc + local
            dev = devices[local] if local < len(devices) else None
            self.ranks[rank] = RankState(
                rank=rank,
                local_rank=local,
                node=host,
                gpu=dev["index"] if dev else None,
                gpu_uuid=dev["uuid"] if dev else None,
                node_rank=node_rank,
            )

    def emit(self, event: dict[str, Any]) -> None:
        """Append one event line; called from telemetry threads too."""
        event.setdefault("t", time.time())
        event.setdefault("rank", None)
        line = json.dumps(event, default=str) + "\n"
        try:
            with self.events_lock, open(self.run_dir / "events.jsonl", "a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError as exc:
            self._write_failed("events.jsonl", exc)
        if self.link is not None and event.get("kind") in nodelink.FORWARDED_EVENTS:
            self.link.send({"type": "event", "event": event})

    def save(self) -> None:
        self.dirty = False
        local = [r.to_json() for r in sorted(self.ranks.values(), key=lambda r: r.rank)]
        if self.link is not None:
            self.link.send({"type": "ranks", "ranks": local})
        remote = [r for node in self.nodes.values() for r in node.ranks]
        self.run["ranks"] = sorted(local + remote, key=lambda r: int(r.get("rank") or 0))
        self.run["failure"] = self.failure
        try:
            write_json_atomic(self.run_dir / "run.json", self.run)
        except OSError as exc:
            self.dirty = True  # the previous run.json stays whole; retried next turn
            self._write_failed("run.json", exc)

    def _write_failed(self, what: str, exc: OSError) -> None:
        # A full disk must not end the training: say it once and carry on.
        if what not in self.write_errors:
            self.write_errors.add(what)
            print(f"xl supervisor: cannot write {what}: {exc}", file=sys.stderr, flush=True)

    def _rank_dicts(self) -> list[dict[str, Any]]:
        """Every rank for telemetry; other nodes' ranks are flagged ``remote`` (not sampled here)."""
        local = [r.to_json() for r in sorted(self.ranks.values(), key=lambda r: r.rank)]
        return local + [{**r, "remote": True} for node in self.nodes.values() for r in node.ranks]

    def _telemetry(self, method: str, *args: Any) -> Any:
        if self.telemetry is None:
            return None
        try:
            return getattr(self.telemetry, method)(*args)
        except Exception as exc:  # telemetry must never take the run down with it
            print(f"xl supervisor: telemetry.{method} failed: {exc!r}", file=sys.stderr, flush=True)
            return None

    # ---------------------------------------------------------------- startup
    def _listen(self) -> str:
        path = str(self.run_dir / "sup.sock")
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
        self.sel.register(sock, selectors.EVENT_READ, "listen")
        self.listener = sock
        return address

    def _start_telemetry(self) -> dict[str, str]:
        from xl.launcher.telemetry.service import Telemetry

        where: dict[str, Any] = {}
        if self.is_hub:
            assert self.hub is not None
            host, port = self.hub
            where = {
                "host": nodelink.listen_host(host),
                "port": port,
                "advertise": host,
                "on_node": lambda node, name, msgs: self.inbox.put((node, name, msgs, time.time())),
                "on_node_closed": lambda node: self.inbox.put((node, "", None, time.time())),
            }
        elif self.hub is not None:
            where = {"forward": self._forward_records}
        try:
            self.telemetry = Telemetry(self.run_dir, token=self.token, emit_event=self.emit, **where)
            env = dict(self.telemetry.start())
        except Exception as exc:
            print(f"xl supervisor: telemetry did not start: {exc!r}", file=sys.stderr, flush=True)
            self.telemetry = None
            return {"XL_TOKEN": self.token}
        env.setdefault("XL_TOKEN", self.token)
        return env

    def _install_signals(self) -> None:
        rfd, wfd = os.pipe()
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        self.sel.register(rfd, selectors.EVENT_READ, "wake")
        self.wake_fd = rfd

        def on_stop(signum: int, _frame: Any) -> None:
            self.stop_signal = signal.Signals(signum).name

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the loop

    def _subreaper(self) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            # Forked from `xl launch`, it would show up as another `xl launch` in top/ps -e.
            libc.prctl(_PR_SET_NAME, b"xl-supervisor", 0, 0, 0)
        except (OSError, AttributeError):
            pass  # not Linux: orphans go to init; they are still found by XL_RUN_ID

    def _forward_records(self, records: list[dict[str, Any]]) -> None:
        from xl.launcher.rundir.metrics import dumps_line

        if self.link is not None:
            for rec in records:
                self.link.send({"type": "rec", "rank": rec["rank"], "line": dumps_line(rec).decode()})

    def start(self) -> None:
        _debug("supervisor start")
        self._subreaper()
        self._install_signals()
        if self.hub is not None and self.node_rank > 0:
            self.link = nodelink.NodeLink(*self.hub, self.token, self.node_rank, self.host)
            self.link.start()
        address = self._listen()
        (self.run_dir / "logs").mkdir(exist_ok=True)
        (self.run_dir / "ranks").mkdir(exist_ok=True)
        devices = self.run.get("devices") or []
        where = "GPUs " + ",".join(str(d["index"]) for d in devices) if devices else "CPU"
        # First, before telemetry can add any diagnosis of its own.
        self.emit({"kind": "run_started", "message": f"starting {len(self.ranks)} ranks on {where}"})
        env = dict(os.environ)
        env.update(self.run.get("env") or {})
        _debug("before telemetry")
        env.update(self._start_telemetry())
        if self.hub is not None and self.node_rank > 0:
            # This node's ranks send their xl.log frames straight to node 0's collector.
            env["XL_COLLECTOR"] = nodelink.format_address(*self.hub)
        _debug("after telemetry")
        env.update({"XL_RUN_ID": self.run_id, "XL_RUN_DIR": str(self.run_dir), "XL_LOGSOCK": address})
        with open(self.run_dir / "logs" / "torchrun.log", "ab") as log:
            self.torchrun = subprocess.Popen(
                self.run["argv"],
                cwd=self.run.get("cwd") or None,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                close_fds=True,
            )
        self.run.update(
            status="running",
            supervisor_pid=os.getpid(),
            supervisor_started_at=procs.create_time(os.getpid()),
            torchrun_pid=self.torchrun.pid,
            started_at=self.run.get("started_at") or time.time(),
            grace_s=self.grace,
        )
        self.save()
        self._telemetry("set_ranks", self._rank_dicts())

    # ---------------------------------------------------------------- the loop
    def run_loop(self) -> None:
        while True:
            timeout = _TICK_S
            for key, _ in self.sel.select(timeout):
                if key.data == "listen":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(OSError):
                        os.read(self.wake_fd, 512)
                else:
                    self._read(key.fileobj)  # type: ignore[arg-type]
            self._reap()
            self._scan_records()
            self._check_alive()
            if self.is_hub:
                self._node_inbox()
                self._check_nodes()
            elif self.link is not None:
                self._node_commands()
            if self.stop_signal and self.stop is None:
                self.emit({"kind": "stop_requested", "message": f"stop requested ({self.stop_signal})"})
                self.run["stop_requested_at"] = time.time()
                self._begin_stop("requested")
            if self.torchrun_code is not None and self.stop is None and not self._all_done():
                # torchrun is gone but ranks are not: it was killed. End them.
                self._torchrun_died()
            self._advance_stop()
            self._end_exit_barrier()
            if self.dirty:
                self.save()
            if self.telemetry is not None and not self.telemetry_stopped and self._ranks_gone() and not self._nodes_pending():
                # Every rank process is gone, so nothing can log any more: flush telemetry now,
                # while torchrun tears down (~0.5 s), not after it.
                self._stop_telemetry()
            if self.torchrun_code is not None and self._all_done():
                _debug("torchrun done")
                self._drain()
                if not self._leftovers() and not self._nodes_pending():
                    return

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            conn = _Conn(sock)
            self.conns[sock.fileno()] = conn
            self.sel.register(sock, selectors.EVENT_READ, "conn")

    def _read(self, sock: socket.socket) -> None:
        conn = self.conns.get(sock.fileno())
        if conn is None:
            return
        try:
            data = sock.recv(65536)
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
                if len(conn.head) > 4096:
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
            self._slot(conn.rank, int(hello.get("pid") or 0))
            self._learn_pid(conn.rank, int(hello.get("pid") or 0))
            if not data:
                return
        self._write_log(conn, data)

    def _write_log(self, conn: _Conn, data: bytes) -> None:
        rank = int(conn.rank)  # type: ignore[arg-type]
        conn.partial = self._append_log(rank, data, conn.partial)
        if self.link is not None:
            self.link.send_log(rank, data)

    def _append_log(self, rank: int, data: bytes, partial: bytes) -> bytes:
        """Append to logs/rank-<rank>.log and parse whole lines; returns the unfinished line."""
        fd = self.log_fds.get(rank)
        try:
            if fd is None:
                fd = os.open(self.run_dir / "logs" / f"rank-{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                self.log_fds[rank] = fd
            os.write(fd, data)
        except OSError as exc:
            self._write_failed(f"logs/rank-{rank}.log", exc)
        if self.telemetry is None:
            return b""
        # tqdm redraws with \r: each redraw is a line for the parser.
        chunk = (partial + data).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, partial = chunk.split(b"\n")
        if len(partial) > 65536:
            lines.append(partial)
            partial = b""
        for line in lines:
            self._telemetry("feed_log_line", rank, line.decode("utf-8", "replace"))
        return partial

    def _close(self, conn: _Conn) -> None:
        if conn.partial and conn.rank is not None:
            self._telemetry("feed_log_line", conn.rank, conn.partial.decode("utf-8", "replace"))
        conn.partial = b""
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn.sock)
        self.conns.pop(conn.sock.fileno(), None)
        conn.sock.close()

    def _drain(self, rank: int | None = None) -> None:
        """Output still queued in sockets of ranks that have exited (of ``rank`` only, when
        given). Never blocks: the sockets are non-blocking; a rank's is read up to 16 MiB (a
        child process of a dead rank may still hold it and write)."""
        for conn in list(self.conns.values()):
            if rank is not None and conn.rank != rank:
                continue
            budget = 16 << 20
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
                    self._write_log(conn, data)
                    budget -= len(data)
                else:
                    break

    def _slot(self, rank: int, pid: int, local_rank: int | None = None) -> RankState | None:
        """The RankState of global ``rank``, from the first word of that rank.

        Ranks start as guesses, node_rank * nproc + local_rank, often wrong: under c10d torch
        numbers nodes in the order they join (GROUP_RANK, not xl's node_rank) and ranks node after
        node, so arrival order and nodes with different GPU counts shift them. A rank's LOCAL_RANK (its record, else its environment)
        names its slot, which then takes the rank torch gave it; WORLD_SIZE fixes world_size."""
        st = self.ranks.get(rank)
        if int(self.run.get("nnodes") or 1) < 2 or (st is not None and st.pid is not None):
            return st
        env = read_environ(pid, ("LOCAL_RANK", "WORLD_SIZE")) if pid > 0 else {}
        if local_rank is None and env.get("LOCAL_RANK", "").isdigit():
            local_rank = int(env["LOCAL_RANK"])
        if env.get("WORLD_SIZE", "").isdigit() and int(env["WORLD_SIZE"]) != self.run.get("world_size"):
            self.run["world_size"] = int(env["WORLD_SIZE"])
            self.dirty = True
        mine = next((s for s in self.ranks.values() if s.local_rank == local_rank), None)
        if mine is None:
            return st  # LOCAL_RANK unknown: keep the guess
        if mine.rank == rank:
            return mine
        if mine.pid is not None:
            return None  # that slot already belongs to another rank
        # Swap keys with whatever guess held ``rank``; that one is fixed when its own rank reports.
        other = self.ranks.pop(rank, None)
        del self.ranks[mine.rank]
        if other is not None:
            other.rank = mine.rank
            self.ranks[other.rank] = other
        mine.rank = rank
        self.ranks[rank] = mine
        self.dirty = True
        return mine

    def _learn_pid(self, rank: int, pid: int) -> bool:
        st = self.ranks.get(rank)
        if st is None or pid <= 0 or st.pid == pid:
            return False
        st.pid = pid
        self.by_pid[pid] = rank
        if st.state == "starting":
            st.state = "running"
            st.started_at = st.started_at or time.time()
            gpu = f", GPU {st.gpu}" if st.gpu is not None else ""
            self.emit({"kind": "rank_started", "rank": rank, "pid": pid, "message": f"rank {rank} started (pid {pid}{gpu})"})
            self._telemetry("set_ranks", self._rank_dicts())
            self.dirty = True
            if self.stop is not None:
                # Started while everything is being stopped: it gets the same treatment.
                self._signal(st, signal.SIGKILL if self.stop.killed else signal.SIGTERM)
        return True

    def _scan_records(self) -> None:
        folder = self.run_dir / "ranks"
        try:
            names = os.listdir(folder)
        except OSError:
            return
        for name in names:
            if not (name.startswith("rank-") and name.endswith(".json")):
                continue
            path = folder / name
            try:
                mtime = path.stat().st_mtime
                rank = int(name[5:-5])
            except (OSError, ValueError):
                continue
            st = self.ranks.get(rank)
            if st is not None and mtime == st.record_mtime:
                continue
            try:
                rec = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            local = rec.get("local_rank")
            st = self._slot(rank, int(rec.get("pid") or 0), local if isinstance(local, int) else None)
            if st is None:
                continue
            st.record_mtime = mtime
            if rec.get("pid"):
                self._learn_pid(rank, int(rec["pid"]))
            st.started_at = rec.get("started_at") or st.started_at
            if "exit_code" in rec and not st.done:
                st.traceback = rec.get("traceback")
                st.error = rec.get("error")
                self._rank_ended(st, int(rec["exit_code"]), rec.get("ended_at"))

    def _rank_ended(self, st: RankState, code: int | None, when: float | None = None) -> None:
        self.dirty = True
        st.exit_code = code
        st.ended_at = when or time.time()
        if code == 0:
            st.state = "exited"
        elif st.signalled is not None or (
            self.stop is not None
            # Ended while a stop was under way: by its signal, without a code we could read (torchrun
            # reaped it), or, on a requested stop, by losing a peer that was stopped first.
            and (code is None or code < 0 or self.stop.reason == "requested")
        ):
            st.state = "stopped"
        else:
            st.state = "failed"
        self.emit({"kind": "rank_exited", "rank": st.rank, "exit_code": code, "message": describe_exit(st.rank, code)})
        self._telemetry("set_ranks", self._rank_dicts())
        if st.state == "failed" and self.failure is None and self.stop is None:
            self._record_failure(st)

    def _log_tail(self, rank: int, lines: int = 15, limit: int = 8192) -> str | None:
        """The end of logs/rank-<rank>.log (what this supervisor has written of it so far)."""
        tail = _tail(self.run_dir / "logs" / f"rank-{rank}.log", lines, limit)
        return "\n".join(tail) + "\n" if tail else None

    def _local_failure(self, rank: int | None, exit_code: int | None, traceback: str | None, error: str | None, message: str) -> dict[str, Any]:
        return {
            "rank": rank,
            "exit_code": exit_code,
            "traceback": traceback,
            "error": error,
            "message": message,
            "node": self.host,
            "node_rank": self.node_rank,
        }

    def _set_failure(self, failure: dict[str, Any], at: float) -> None:
        self.failure, self.failure_at = failure, at
        self.dirty = True
        if self.link is not None and not self.failure_remote:
            self.link.send({"type": "failure", "failure": failure, "at": at})

    def _record_failure(self, st: RankState) -> None:
        what = st.error or (describe_exit(st.rank, st.exit_code) if st.exit_code is not None else "died")
        message = f"rank {st.rank} failed first: {what}"
        traceback = st.traceback
        if traceback is None and st.error is None:
            # No Python exception to show (sys.exit(2) from argparse, os._exit, a C++ abort):
            # the rank's last words are the best explanation there is; they may still wait in
            # its socket.
            self._drain(st.rank)
            traceback = self._log_tail(st.rank)
            last = traceback.strip().splitlines()[-1].strip() if traceback and traceback.strip() else ""
            if last:
                message += f": {last[:200]}"
                self.last_words[st.rank] = last[:200]
        # When it happened, to compare with other nodes' failures: a killed rank died between
        # the last time it was seen running and now.
        at = (st.alive_at if st.vanished else None) or st.ended_at or time.time()
        self._set_failure(self._local_failure(st.rank, st.exit_code, traceback, st.error, message), at)
        self.emit({"kind": "failure", "rank": st.rank, "exit_code": st.exit_code, "message": message})
        self._begin_stop("failure")

    def _check_alive(self) -> None:
        for st in self.ranks.values():
            if st.pid is None or st.done:
                continue
            if st.pid in self.reparented:
                self._rank_ended(st, self.reparented.pop(st.pid))
                continue
            if procs.alive(st.pid):
                st.alive_at = time.time()
                continue
            # Gone without an exit record: killed by a signal (or os._exit).
            self._scan_records()
            if not st.done:
                st.vanished = True
                self._rank_ended(st, -st.signalled if st.signalled is not None else None)

    def _reap(self) -> None:
        # waitpid(-1): torchrun, and ranks orphaned to this subreaper. Nothing else in the
        # supervisor (telemetry included) may start child processes: they would be reaped here.
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            if self.torchrun is not None and pid == self.torchrun.pid:
                self.torchrun_code = code
                self.torchrun.returncode = code
                self.run["torchrun_exit_code"] = code
            elif pid in self.by_pid:
                self.reparented[pid] = code

    # ---------------------------------------------------------------- stopping
    def _signal(self, st: RankState, sig: int) -> None:
        # A rank that reported its exit may still hang in teardown (e.g. a stuck NCCL
        # destructor): it is signalled too; only its recorded outcome stays as it was.
        if st.pid is None or not procs.alive(st.pid):
            return
        if not st.done:
            st.signalled = int(sig)
        procs.signal_rank(st.pid, sig)

    def _begin_stop(self, reason: str) -> None:
        if self.stop is not None:
            self._stop_nodes()  # a failure found while stopping for no reason to tell
            return
        self.dirty = True
        self.stop = _Stop(reason=reason, since=time.monotonic())
        if reason == "requested" and self.torchrun is not None and self.torchrun_code is None:
            procs.signal_pid(self.torchrun.pid, signal.SIGTERM)
        for st in self.ranks.values():
            self._signal(st, signal.SIGTERM)
        # Ranks that never reported (e.g. still importing) are found by their environment.
        self.stop.extra = procs.find_run_pids(self.run_id, exclude=self._known_pids())
        for pid in self.stop.extra:
            procs.signal_rank(pid, signal.SIGTERM)
        self._stop_nodes()

    def _stop_nodes(self) -> None:
        """Node 0: collectives of the other nodes may wait for this node's ranks for many
        minutes: end them, when the stop was asked for or the run failed. A stray process left
        after a clean finish is no reason to fail the other nodes."""
        if not self.is_hub or self.nodes_told or self.stop is None:
            return
        if self.stop.reason != "requested" and self.failure is None:
            return
        self.nodes_told = True
        why = "requested" if self.stop.reason == "requested" else "failure"
        # A copy: the collector thread serializes it while _node_failure may complete ours.
        failure = dict(self.failure) if self.failure is not None else None
        self._telemetry("stop_nodes", {"reason": why, "failure": failure})

    def _known_pids(self) -> set[int]:
        pids = {st.pid for st in self.ranks.values() if st.pid}
        if self.torchrun is not None:
            pids.add(self.torchrun.pid)
        return {p for p in pids if p is not None}

    def _advance_stop(self) -> None:
        if self.stop is None or self.stop.killed:
            return
        if time.monotonic() - self.stop.since < self.grace:
            return
        self.stop.killed = True
        for st in self.ranks.values():
            self._signal(st, signal.SIGKILL)
        procs.kill_all(self.stop.extra + procs.find_run_pids(self.run_id, exclude=self._known_pids()))
        if self.torchrun is not None and self.torchrun_code is None:
            procs.signal_pid(self.torchrun.pid, signal.SIGKILL)

    def _end_exit_barrier(self) -> None:
        """Multi-node: a torchrun whose ranks have all ended waits at its exit barrier for every
        other node's torchrun (up to 300 s), and the torchrun of a node that failed never comes.
        This node's ranks are done, so its run is over: after the grace, end torchrun; the
        ranks' exit codes decide the status. Nothing of the other nodes needs it any more (their
        torchrun just logs that its own exit barrier failed, or that the c10d store it used is gone)."""
        if int(self.run.get("nnodes") or 1) < 2 or self.stop is not None or self.torchrun is None:
            return
        # Node 0's torchrun serves the c10d store: ending it while another node's ranks work on
        # (they may finish well after these, e.g. saving a checkpoint) has that node's torchrun
        # lose its store and kill them. Its barrier is ended only once no node is busy.
        if self.torchrun_code is not None or not self._ranks_gone() or self._nodes_busy():
            self.barrier_since = None
            return
        now = time.monotonic()
        if self.barrier_since is None:
            self.barrier_since = now
            return
        # Not less than 2 s: on success the other nodes arrive within torchrun's monitor tick.
        wait = max(self.grace, 2.0)
        if not self.barrier_ended and now - self.barrier_since >= wait:
            self.barrier_ended = True
            self.emit({
                "kind": "exit_barrier",
                "message": f"this node's ranks are done but torchrun still waited for the other nodes after {wait:g}s "
                "(one failed or was stopped?); ending it",
            })
            procs.signal_pid(self.torchrun.pid, signal.SIGTERM)
        elif self.barrier_ended and now - self.barrier_since >= wait + 1.0:
            # Its SIGTERM handler only runs once the store call it blocks in returns; it has
            # no rank left to tear down, so SIGKILL loses nothing.
            procs.signal_pid(self.torchrun.pid, signal.SIGKILL)

    def _torchrun_died(self) -> None:
        code = self.torchrun_code
        desc = _signal_name(code) if code is not None and code < 0 else f"code {code}"
        message = f"torchrun ended ({desc}) while ranks were running"
        self._set_failure(self._local_failure(None, code, None, None, message), time.time())
        self.emit({"kind": "failure", "rank": None, "exit_code": code, "message": message})
        self._begin_stop("torchrun_died")

    def _all_done(self) -> bool:
        for st in self.ranks.values():
            if st.done:
                continue
            if st.pid is None:
                # Never started (torchrun failed before spawning it): nothing to wait for.
                if self.torchrun_code is not None:
                    st.state = "failed" if self.stop is None else "stopped"
                    continue
                return False
            if procs.alive(st.pid):
                return False
        return True

    def _leftovers(self) -> bool:
        """Kill any process still carrying this run's id; True while some remain."""
        pids = procs.find_run_pids(self.run_id)
        if not pids:
            return False
        if self.stop is None:
            self._begin_stop("requested" if self.stop_signal else "torchrun_died")
            return True
        if self.stop.killed:
            procs.kill_all(pids)
        return True

    # ---------------------------------------------------------------- the end
    def _ranks_gone(self) -> bool:
        return all(st.done and (st.pid is None or not procs.alive(st.pid)) for st in self.ranks.values())

    def _stop_telemetry(self) -> None:
        if not self.telemetry_stopped:
            self.telemetry_stopped = True
            self._telemetry("stop")

    def _fill_from_torchrun_log(self) -> None:
        """Exit codes of ranks killed by a signal, from torchrun's own failure summary."""
        if all(st.exit_code is not None for st in self.ranks.values()):
            return
        try:
            text = (self.run_dir / "logs" / "torchrun.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return
        found = {
            int(m.group(1)): int(m.group(2))
            for m in re.finditer(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", text)
        }
        for rank, code in found.items():
            st = self.ranks.get(rank)
            if st is not None and st.exit_code is None:
                st.exit_code = code
        # torchrun's own "Root Cause" is the first failure *it* observed, often a rank it had
        # just terminated itself; the supervisor's order is kept. Only when the blamed rank
        # turns out to have died of a stop signal is another rank's real failure preferred.
        if self.failure is None or self.failure.get("exit_code") is not None or self.failure.get("rank") is None:
            return
        if self.failure.get("node_rank", self.node_rank) != self.node_rank or int(self.failure["rank"]) not in self.ranks:
            return  # another node's rank: that node explained it
        blamed = self.ranks[int(self.failure["rank"])]
        stop_codes = (-signal.SIGTERM, -signal.SIGKILL)
        real = [st for st in self.ranks.values() if st.exit_code not in (None, 0, *stop_codes)]
        if blamed.exit_code in stop_codes and real:
            blamed.state = "stopped"
            blamed = min(real, key=lambda st: st.ended_at or 0.0)
            blamed.state = "failed"
        message = f"rank {blamed.rank} failed first: {describe_exit(blamed.rank, blamed.exit_code)}"
        if blamed.rank in self.last_words:
            message += f": {self.last_words[blamed.rank]}"
        self.failure.update(rank=blamed.rank, exit_code=blamed.exit_code, message=message)
        # The first failure event lacked the signal (or named a rank torchrun had terminated).
        self.emit({"kind": "failure", "rank": blamed.rank, "exit_code": blamed.exit_code, "message": message})

    def _torchrun_tail(self, lines: int = 25) -> str | None:
        tail = _tail(self.run_dir / "logs" / "torchrun.log", lines, 32768, skip_blank=True)
        return "\n".join(tail) or None

    def finish(self) -> str:
        self._fill_from_torchrun_log()
        if self.stop is not None and self.stop.reason == "requested":
            status = "stopped"
        elif self.failure is not None:
            status = "failed"
        elif (self.torchrun_code == 0 or self.barrier_ended) and all(
            st.exit_code in (0, None) for st in self.ranks.values()
        ):
            status = "succeeded"
        else:
            status = "failed"
            bad = [st for st in self.ranks.values() if st.exit_code not in (0, None)]
            first = min(bad, key=lambda s: s.ended_at or 0.0) if bad else None
            self.failure = self._local_failure(
                first.rank if first else None,
                first.exit_code if first else self.torchrun_code,
                # No rank to blame (e.g. torchrun could not start them): torchrun's own last words.
                first.traceback if first else self._torchrun_tail(),
                first.error if first else None,
                f"torchrun exited with code {self.torchrun_code} (see logs/torchrun.log)",
            )
            self.failure_at = (first.ended_at if first else None) or time.time()
        for st in self.ranks.values():
            if not st.done:
                st.state = "stopped" if status == "stopped" else "failed"
        for node in self.nodes.values():
            for info in node.ranks:
                if node.lost and info.get("state") not in ("exited", "failed", "stopped"):
                    info["state"] = "failed"
        _debug("finish start")
        self._stop_telemetry()
        _debug("telemetry stopped")
        for fd in self.log_fds.values():
            os.close(fd)
        self.run.update(status=status, ended_at=time.time())
        self.save()
        self.emit({"kind": "run_ended", "status": status, "message": f"run {status}"})
        if self.link is not None:
            failure = None if self.failure_remote else self.failure
            self.link.send({"type": "end", "status": status, "failure": failure, "at": self.failure_at or time.time()})
            if not self.link.close(_LINK_CLOSE_S):
                print("xl supervisor: node 0 did not take this node's last records; they are here", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):
            self.listener.close()
            os.unlink(self.run_dir / "sup.sock")
        return status

    # ---------------------------------------------------------------- other nodes (node 0)
    def _node_inbox(self) -> None:
        """What the other nodes' links sent since the last turn (the collector thread queues it)."""
        while True:
            try:
                node, host, msgs, when = self.inbox.get_nowait()
            except queue.Empty:
                return
            if msgs and msgs[0].get("type") == "refused":
                self._node_refused(node, host, msgs[0])  # not a node of this run: no _RemoteNode
                continue
            remote = self.nodes.get(node)
            if remote is None:
                # Until its ranks are known, a node that is heard from counts as busy.
                remote = self.nodes[node] = _RemoteNode(node, seen=time.monotonic())
            if msgs is None:  # its link closed
                if remote.status is None and not remote.lost:
                    remote.closed_at = time.monotonic() - max(0.0, time.time() - when)
                continue
            remote.host = host or remote.host
            remote.seen, remote.closed_at = time.monotonic(), None
            for msg in msgs:
                try:
                    self._node_message(remote, msg)
                except (KeyError, TypeError, ValueError) as exc:  # checked by the collector; belt and braces
                    print(f"xl supervisor: node {node} sent {msg.get('type')!r} xl cannot use: {exc!r}", file=sys.stderr, flush=True)

    def _node_refused(self, node: int, host: str, refused: dict[str, Any]) -> None:
        """A node with a wrong XL_TOKEN tried to join: say so; the run waits on for the right one."""
        peer = str(refused.get("peer") or "")
        key = (node, host, peer)
        if key in self.refused_seen or len(self.refused_seen) >= _MAX_REFUSED_EVENTS:
            return
        self.refused_seen.add(key)
        where = f"host {host or '?'}" + (f", from {peer}" if peer else "")
        self.emit({
            "kind": "node_refused",
            "node": host,
            "node_rank": node,
            "peer": peer,
            "message": f"a node {node} ({where}) tried to join with a wrong {nodelink.TOKEN_VAR} and was refused; "
            "waiting on for this run's nodes: start them with the exact command this node printed",
        })

    def _node_message(self, remote: _RemoteNode, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        if kind == "log":
            rank = int(msg["rank"])
            data = str(msg["data"]).encode("utf-8", "surrogateescape")
            remote.partial[rank] = self._append_log(rank, data, remote.partial.get(rank, b""))
        elif kind == "ranks":
            remote.ranks = [
                {**info, "node": info.get("node") or remote.host, "node_rank": remote.node} for info in msg["ranks"]
            ]
            running = any(r.get("state") in ("starting", "running") for r in remote.ranks)
            if running:
                remote.idle_since = None
            elif remote.idle_since is None:
                remote.idle_since = time.monotonic()
            self.dirty = True
            self._telemetry("set_ranks", self._rank_dicts())
        elif kind == "event":
            event = dict(msg["event"])
            # The run's own run_started/run_ended are node 0's; another node's are its part's.
            event["kind"] = {"run_started": "node_started", "run_ended": "node_ended"}.get(event["kind"], event["kind"])
            event.update(node=remote.host, node_rank=remote.node)
            event["message"] = f"node {remote.node}: {event.get('message') or event['kind']}"
            self.emit(event)
            if event["kind"] == "stop_requested" and self.stop is None:
                # Someone stopped that node: its collectives are gone, so is the run.
                self.run["stop_requested_at"] = time.time()
                self._begin_stop("requested")
        elif kind == "failure":
            self._node_failure(remote, msg["failure"], float(msg["at"]))
        elif kind == "end":
            remote.status = str(msg["status"])
            if msg.get("failure") and remote.status == "failed":
                self._node_failure(remote, msg["failure"], float(msg["at"]))
            self.dirty = True

    def _node_failure(self, remote: _RemoteNode, failure: dict[str, Any], at: float) -> None:
        """Another node's root cause becomes the run's when it came first."""
        if failure.get("node_rank", remote.node) != remote.node:
            return  # a failure node 0 told it about, coming back
        if self.stop is not None and self.stop.reason == "requested":
            return
        where = f"node {remote.node} ({failure.get('node') or remote.host})"
        current = self.failure
        if current is not None and current.get("node_rank") == remote.node and current.get("rank") is not None:
            # That node's root cause already, completed by its last word (e.g. the signal that
            # killed the rank, read from its torchrun's summary at its end).
            for key in ("rank", "exit_code", "traceback", "error"):
                current[key] = failure.get(key) if failure.get(key) is not None else current.get(key)
            current["message"] = f"{where}: {failure.get('message') or 'failed'}"
            self.dirty = True
            return
        if current is not None and (self.failure_at is None or at >= self.failure_at):
            return
        adopted = {
            "rank": failure.get("rank"),
            "exit_code": failure.get("exit_code"),
            "traceback": failure.get("traceback"),
            "error": failure.get("error"),
            "message": f"{where}: {failure.get('message') or 'failed'}",
            "node": failure.get("node") or remote.host,
            "node_rank": remote.node,
        }
        self._set_failure(adopted, at)
        self.emit({
            "kind": "failure",
            "rank": adopted["rank"],
            "exit_code": adopted["exit_code"],
            "node": adopted["node"],
            "node_rank": remote.node,
            "message": adopted["message"],
        })
        self._begin_stop("failure")

    def _check_nodes(self) -> None:
        """A node whose link closed without its end, or that went silent, is lost: the run is over."""
        now = time.monotonic()
        for remote in self.nodes.values():
            if remote.status is not None or remote.lost:
                continue
            closed = remote.closed_at is not None and now - remote.closed_at > _NODE_CLOSED_S
            if not closed and now - remote.seen <= self.node_timeout:
                continue
            remote.lost = True
            since = remote.closed_at if remote.closed_at is not None else remote.seen
            running = [int(r["rank"]) for r in remote.ranks if r.get("state") in ("starting", "running")]
            how = "its supervisor's connection closed" if closed else f"nothing came from it for {self.node_timeout:g}s"
            ranks = f" with rank(s) {', '.join(map(str, running))} running" if running else ""
            message = f"node {remote.node} ({remote.host or '?'}) was lost{ranks}: {how} (killed, or its machine went down)"
            self.emit({"kind": "node_lost", "node": remote.host, "node_rank": remote.node, "message": message})
            failure = {
                "rank": None,
                "exit_code": None,
                "traceback": None,
                "error": None,
                "message": message,
                "node": remote.host,
                "node_rank": remote.node,
            }
            self._node_failure(remote, failure, time.time() - (now - since))
            self.dirty = True

    def _nodes_busy(self) -> bool:
        """Node 0: another node is heard from and still has ranks running."""
        return self.is_hub and any(remote.busy for remote in self.nodes.values())

    def _nodes_pending(self) -> bool:
        """Node 0, its own ranks done: True while it still waits for another node's end.

        A node that is heard from (its heartbeat: _check_nodes declares it lost once that
        stops) and has ranks running is waited for as long as that lasts, unless the run is
        being stopped (it was told to stop too: its own grace ends its ranks); a node whose ranks
        are done, or that was never heard from, for the stop grace plus _NODE_END_WAIT_S since
        node 0 knew (its end follows its ranks' within its own exit barrier's grace)."""
        if not self.is_hub or self.nodes_waited:
            return False
        now = time.monotonic()
        if self.local_done_at is None:
            self.local_done_at = now
        waiting = [
            n for n in range(1, self.nnodes) if not ((r := self.nodes.get(n)) is not None and (r.status is not None or r.lost))
        ]
        if not waiting:
            return False
        limit = self.grace + _NODE_END_WAIT_S
        for n in waiting:
            remote = self.nodes.get(n)
            if remote is not None and remote.busy and self.stop is None:
                return True
            since = max(self.local_done_at, remote.idle_since or 0.0) if remote is not None else self.local_done_at
            if now - since < limit:
                return True
        self.nodes_waited = True
        names = ", ".join(map(str, waiting))
        self.emit({
            "kind": "nodes_unfinished",
            "message": f"node(s) {names} had not reported the end of their part {limit:g}s after their ranks "
            "were done (or without a word from them); their own run dirs have the rest",
        })
        return False

    # ---------------------------------------------------------------- node 0's word (nodes > 0)
    def _node_commands(self) -> None:
        assert self.link is not None
        for cmd in self.link.commands():
            if cmd.get("refused"):
                self._token_refused()
                continue
            stop = cmd.get("stop")
            if not isinstance(stop, dict) or self.stop is not None:
                continue
            if stop.get("reason") == "requested":
                self.emit({"kind": "stop_requested", "message": "node 0 stopped the run"})
                self.run["stop_requested_at"] = time.time()
                self._begin_stop("requested")
                continue
            given = stop.get("failure")
            failure: dict[str, Any] = given if isinstance(given, dict) else {}
            if self.failure is None:
                node = failure.get("node_rank")
                message = f"the run failed on node {node if node is not None else '?'}: {failure.get('message') or 'see node 0'}"
                self.failure_remote = True
                self._set_failure({**failure, "message": message}, time.time())
                self.emit({"kind": "failure", "rank": failure.get("rank"), "message": message})
            self._begin_stop("failure")


    def _token_refused(self) -> None:
        """Node 0 refused this node's XL_TOKEN: this node can never join the run (its torchrun
        even waits in a rendezvous of its own: the id comes from the token). End its part at once
        with one line that says what is wrong and how to fix it. No failure event: the view
        prints the run's failure as its last line, and once is enough."""
        assert self.hub is not None
        message = (
            f"node 0 ({nodelink.format_address(*self.hub)}) refused this node's {nodelink.TOKEN_VAR}: it is not "
            f"the run's token; on this node, run the exact command node 0's 'xl launch' printed (with its {nodelink.TOKEN_VAR}=...)"
        )
        if self.failure is None:
            self.failure_remote = True  # nothing goes to node 0 any more
            self._set_failure(self._local_failure(None, None, None, None, message), time.time())
        if self.torchrun is not None and self.torchrun_code is None:
            # Its rendezvous would wait for nodes that never come: end it now, not after the grace.
            procs.signal_pid(self.torchrun.pid, signal.SIGTERM)
        self._begin_stop("failure")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m xl.launcher.supervisor RUN_DIR", file=sys.stderr)
        return 2
    sup = Supervisor(Path(argv[0]))
    try:
        sup.start()
        sup.run_loop()
    except BaseException as exc:
        # A bug here must not leave ranks behind nor a run that says "running" forever.
        import traceback

        traceback.print_exc()
        with contextlib.suppress(Exception):
            procs.kill_all(procs.find_run_pids(sup.run_id))
            if sup.torchrun is not None:
                procs.signal_pid(sup.torchrun.pid, signal.SIGKILL)
            sup.failure = sup.failure or sup._local_failure(None, None, None, None, f"supervisor error: {exc!r}")
        status = sup.finish()
        return 0 if status == "succeeded" else 1
    status = sup.finish()
    return 0 if status == "succeeded" else 1

