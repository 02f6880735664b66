"""Node 0's socket to the other nodes' stacks: how ``xl stacks`` (a process of its own) and the
hang capture reach the collector that holds every node's link.

Node 0's collector opens an abstract Unix socket and writes ``ranks/nodes.stacks.json`` (pid,
socket) next to the ranks' own ``rank-<r>.stacks.json``. A requester connects, sends one JSON
line ``{"rank", "timeout"}`` and reads one JSON answer ``{"ranks": [entries], "asked":
[nodes]}``: the other nodes' entries, gathered through their links within ``timeout``; or
sends ``{"logs": {"rank", "node", "offset"}, "timeout"}`` and reads ``{"logs": {"data",
"offset", "size", ...} | null}``: a piece of a rank's output from the node that has it
(``xl logs`` on node 0). As with a rank's socket, the kernel's word on the caller's uid
(SO_PEERCRED) is the lock: an abstract socket has no file permissions, and the run dir that
names it is private. Nothing polls: the server's thread waits in ``accept()``; each request gets
a short-lived thread (a few at once, the rest are told "busy").
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xl.atomic import write_json_atomic
from xl.launcher.rank.stacks import peer_is
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.stacks.model import RankStacks

_MAX_REQUEST = 4096
_MAX_AT_ONCE = 4
_SLACK_S = 1.0  # the requester waits this much past the deadline it gave, for the answer to travel

# (rank or None, timeout) -> (entries of the other nodes' ranks, the nodes that were asked)
Gather = Callable[[int | None, float], tuple[list[dict[str, Any]], list[int]]]
# (rank, node, offset, timeout) -> that node's ``logs`` answer, or None
FetchLogs = Callable[[int, int, int, float], dict[str, Any] | None]


def _same_user(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1] in (os.getuid(), 0)


@dataclass(frozen=True, slots=True)
class NodesAnswer:
    """The other nodes' entries, and the nodes that were asked."""

    entries: tuple[RankStacks, ...]
    asked: frozenset[int]


class NodesStacksServer:
    """The serving side, in node 0's supervisor (opened by the collector when it takes nodes)."""

    def __init__(self, run_dir: Path, gather: Gather, fetch_logs: FetchLogs | None = None) -> None:
        self.run_dir = run_dir
        self._gather = gather
        self._fetch_logs = fetch_logs
        # Nobody can bind it first (os.urandom, as secrets.token_hex, without its imports)
        self._name = f"xl-nodes-stacks-{os.getpid()}-{os.urandom(16).hex()}"
        self._sock: socket.socket | None = None
        self._slots = threading.BoundedSemaphore(_MAX_AT_ONCE)

    def open(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind("\0" + self._name)
        sock.listen(8)
        self._sock = sock
        layout = RunLayout(self.run_dir)
        layout.ranks.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_json_atomic(layout.nodes_stacks_socket, {"pid": os.getpid(), "socket": self._name})
        threading.Thread(
            target=self._serve, args=(sock,), name="xl-nodes-stacks", daemon=True
        ).start()

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
            with contextlib.suppress(OSError):
                RunLayout(self.run_dir).nodes_stacks_socket.unlink()

    def _serve(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                with contextlib.suppress(OSError), conn:
                    conn.sendall(b'{"error": "busy: other stacks requests are being answered"}')
                continue
            threading.Thread(
                target=self._answer, args=(conn,), name="xl-nodes-stacks-ask", daemon=True
            ).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            with contextlib.suppress(Exception), conn:
                if not _same_user(conn):
                    return
                conn.settimeout(2.0)
                raw = conn.makefile("rb").readline(_MAX_REQUEST)
                ask = json.loads(raw) if raw else {}
                rank = ask.get("rank") if isinstance(ask, dict) else None
                timeout = ask.get("timeout") if isinstance(ask, dict) else None
                limit = (
                    min(float(timeout), 30.0)
                    if isinstance(timeout, (int, float)) and timeout > 0
                    else 3.0
                )
                logs = ask.get("logs") if isinstance(ask, dict) else None
                if isinstance(logs, dict):
                    answer = self._logs(logs, limit)
                else:
                    entries, asked = self._gather(rank if type(rank) is int else None, limit)
                    answer = {"ranks": entries, "asked": asked}
                conn.settimeout(5.0)
                conn.sendall(json.dumps(answer, default=str).encode())
        finally:
            self._slots.release()


    def _logs(self, want: dict[str, Any], limit: float) -> dict[str, Any]:
        """A piece of a rank's output, from the node that has it (``{"logs": null}``: none)."""
        rank, node, offset = want.get("rank"), want.get("node"), want.get("offset", 0)
        if self._fetch_logs is None or type(rank) is not int or type(node) is not int:
            return {"logs": None}
        start = offset if type(offset) is int and offset > 0 else 0
        return {"logs": self._fetch_logs(rank, node, start, limit)}


# edge: the node's answer as it came over the link, for `xl logs` and the app to print
def ask_logs(
    run_dir: Path, rank: int, node: int, offset: int, timeout: float = 5.0
) -> dict[str, Any] | None:
    """A piece of ``rank``'s output from ``offset``, asked of ``node`` through node 0's socket
    (``{"data", "offset", "size"}``), or None (no socket: the run is over; the node did not
    answer)."""
    doc = _request(run_dir, {"logs": {"rank": rank, "node": node, "offset": offset}}, timeout)
    logs = doc.get("logs") if doc is not None else None
    return logs if isinstance(logs, dict) and isinstance(logs.get("data"), str) else None


def ask(run_dir: Path, rank: int | None, timeout: float) -> NodesAnswer | None:
    """The other nodes' entries through node 0's socket (None: no socket, or no answer)."""
    doc = _request(run_dir, {"rank": rank}, timeout)
    found = doc.get("ranks") if doc is not None else None
    if doc is None or not isinstance(found, list):
        return None
    asked = doc.get("asked")
    return NodesAnswer(
        tuple(RankStacks.from_json(e) for e in found if isinstance(e, dict)),
        frozenset(n for n in asked if type(n) is int) if isinstance(asked, list) else frozenset(),
    )


def _request(run_dir: Path, request: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    """One request through node 0's socket and its answer (None: no socket, or no answer)."""
    try:
        found = json.loads(RunLayout(run_dir).nodes_stacks_socket.read_text())
        name, pid = str(found["socket"]), int(found["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout + _SLACK_S)
        try:
            sock.connect("\0" + name)
            if not peer_is(sock, pid):
                return None  # not node 0's supervisor: someone else's socket under its name
            sock.sendall(json.dumps({**request, "timeout": timeout}).encode() + b"\n")
            chunks = []
            while chunk := sock.recv(1 << 16):
                chunks.append(chunk)
            doc = json.loads(b"".join(chunks))
        except (OSError, ValueError):
            return None
    return doc if isinstance(doc, dict) else None
