"""Inside every rank: say where it is when asked, at no cost while nobody asks.

``install(run_dir, rank)`` runs before user code (from the rank entry). It sets up two ways to
ask, and nothing in the rank polls:

- a daemon thread blocked in ``accept()`` on an abstract Unix socket with an unpredictable name
  (another user cannot bind it first, as they could a name made from the pid alone), known
  to requesters only through the rank's private ``ranks/rank-<r>.stacks.json``. Each side checks
  the other with SO_PEERCRED (``peer_is``): a requester of the same user that connects gets one
  JSON answer: every thread's Python stack (``sys._current_frames``)
  and the rank's collectives from PyTorch's Flight Recorder (when torch is loaded). It needs the GIL
  for a moment, which it gets while the main thread waits inside gloo/NCCL or runs Python.
- ``faulthandler`` registered on a real-time signal: the C-level handler writes every thread's
  stack to ``ranks/rank-<r>.stacks.txt`` without taking the GIL, so a rank whose C code holds the
  GIL (a regex with catastrophic backtracking, a C extension spinning) still tells where it is.

``ranks/rank-<r>.stacks.json`` says both are set up (pid, signal, socket, main thread id);
requesters read it before they signal, so a process without the handler is never sent the signal
(whose default action would end it). Stdlib only; torch is used only if the script imported it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from types import FrameType
from typing import IO, Any

import xl
from xl.atomic import makedirs_private, write_unsynced
from xl.launcher.rank.frenv import set_buffer
from xl.launcher.rundir.layout import RunLayout

# A real-time signal: training code and its frameworks use SIGUSR1/2 (Lightning's requeue, ...).
SIGNAL = signal.SIGRTMIN + 6
# Flight Recorder entries kept per process group: tiny, and enough to see the last ops
FR_BUFFER = "2000"
MAX_FRAMES = 200
MAX_COLLECTIVES = 8  # per process group: the newest only, what the hang waits on is at the end
# a collective's tensor shapes are kept up to this many tensors (coalesced ones are long)
MAX_SIZES = 32

# What install set up, kept alive for the rank's life: the faulthandler file and the socket
_installed: dict[str, Any] = {}


def socket_name(pid: int) -> str:
    """A new abstract Unix socket name for the rank with this pid: 128 random bits in it."""
    # as secrets.token_hex(16), without hmac's imports
    return f"\0xl-stacks-{pid}-{os.urandom(16).hex()}"


def peer_is(sock: socket.socket, pid: int) -> bool:
    """Whether the process that bound the socket ``sock`` is connected to is ``pid``, of this user
    (root asks anyone's): a requester never reads an answer from a socket someone else bound."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return False
    peer_pid, uid, _gid = struct.unpack("3i", creds)
    return peer_pid == pid and (os.getuid() == 0 or uid == os.getuid())


# xl's own wrappers around torch (the step hooks: Work.wait, DataLoader's __next__, a module's
# __call__, backward) pass straight through to torch: a stack shows where the script and torch
# are, never xl's wrapper, which a verdict would otherwise name as the place a rank waits.
_PASS_THROUGH = tuple(
    os.path.join(os.path.dirname(os.path.abspath(xl.__file__ or "")), "integrations", name)
    for name in ("torchsteps.py", "stepclock.py")
)


def _frames(frame: FrameType | None) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    while frame is not None and len(out) < MAX_FRAMES:
        code = frame.f_code
        if not code.co_filename.endswith(_PASS_THROUGH):
            out.append({"file": code.co_filename, "line": frame.f_lineno, "function": code.co_name})
        frame = frame.f_back
    out.reverse()  # innermost last, as the document wants
    return out


def threads() -> list[dict[str, object]]:
    """Every thread's stack but the socket's own, the main thread first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    main = threading.main_thread().ident
    found = sorted(sys._current_frames().items(), key=lambda kv: kv[0] != main)
    return [
        {"name": names.get(ident, f"Thread {ident:#x}"), "frames": _frames(frame)}
        for ident, frame in found
        if ident != me
    ]


def collectives() -> tuple[list[dict[str, object]], str | None]:
    """The Flight Recorder's newest entries per process group, and why there are none if so."""
    torch = sys.modules.get("torch")
    if torch is None:
        return [], "torch is not loaded in this rank"
    try:
        dump = torch._C._distributed_c10d._dump_fr_trace_json
    except AttributeError:
        return (
            [],
            f"torch {getattr(torch, '__version__', '?')} "
            "has no Flight Recorder JSON dump: stacks only",
        )
    try:
        entries = json.loads(dump(True, False)).get("entries") or []
    except Exception as exc:  # a torch error must never reach the rank's own code
        return [], f"Flight Recorder dump failed: {exc}"
    per_pg: dict[str, list[dict[str, object]]] = {}
    for e in entries:
        if e.get("is_p2p"):
            continue
        pg = e.get("process_group") or [e.get("pg_id"), ""]
        name = str(pg[1] or pg[0]) if isinstance(pg, list) and pg else str(pg)
        op = str(e.get("profiling_name") or "?").split(":")[-1]
        state = (
            "completed"
            if e.get("retired") or e.get("state") == "completed"
            else str(e.get("state") or "?")
        )
        began = e.get("time_created_ns")
        seq = e.get("collective_seq_id")
        row: dict[str, object] = {"pg": name, "seq": seq, "op": op, "state": state}
        if isinstance(pg, list) and pg:
            # Groups are numbered in the order every rank creates them, the same on every rank;
            # their names need not differ (torch calls each subgroup without a name "undefined").
            row["pg_id"] = str(pg[0])
        for key, sizes in (("in", e.get("input_sizes")), ("out", e.get("output_sizes"))):
            if isinstance(sizes, list) and len(sizes) <= MAX_SIZES:
                row[key] = sizes  # the tensors' shapes: the same collective on two ranks must agree
        if isinstance(began, int) and began > 0:
            row["t"] = round(began / 1e9, 3)  # when it began: progress for ranks that log nothing
        per_pg.setdefault(name, []).append(row)
    out: list[dict[str, object]] = []
    for rows in per_pg.values():
        rows.sort(key=_seq)
        out.extend(rows[-MAX_COLLECTIVES:])
    return out, None


def _seq(row: dict[str, object]) -> int:
    seq = row["seq"]
    return seq if isinstance(seq, int) else -1


def answer() -> dict[str, object]:
    """What the socket sends, as JSON: this rank's threads and collectives."""
    colls, why = collectives()
    doc: dict[str, object] = {"pid": os.getpid(), "threads": threads(), "collectives": colls}
    if why:
        doc["collectives_note"] = why
    return doc


def _same_user(conn: socket.socket) -> bool:
    # An abstract socket has no file permissions: the kernel's word on the caller's uid is the lock.
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1] in (os.getuid(), 0)


def _serve(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with contextlib.suppress(Exception), conn:
            if _same_user(conn):
                conn.settimeout(5)
                conn.sendall(json.dumps(answer()).encode())


def install(run_dir: str | None, rank: int) -> bool:
    """Set up the socket and the signal for this rank; False (and the rank runs on untouched)
    when it cannot."""
    if not run_dir or _installed:
        return False
    # Gloo and NCCL record into the Flight Recorder only with a buffer; set before torch starts.
    # under the one name this torch reads (no deprecation warning)
    set_buffer(os.environ, FR_BUFFER)
    try:
        layout = RunLayout(run_dir)
        makedirs_private(layout.ranks)
        fd = os.open(layout.rank_stacks_text(rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        out: IO[str] = open(fd, "a")  # noqa: SIM115 - open for the rank's life; private like the run dir
        faulthandler.register(SIGNAL, file=out, all_threads=True, chain=False)
        name = socket_name(os.getpid())
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(name)
        server.listen(8)
    except (OSError, ValueError, RuntimeError):
        return False
    _installed.update(file=out, server=server)
    threading.Thread(target=_serve, args=(server,), name="xl-stacks", daemon=True).start()
    info = {
        "pid": os.getpid(),
        "signal": int(SIGNAL),
        "socket": name[1:],
        "main_thread": threading.main_thread().ident,
        "since": time.time(),
    }
    try:
        write_unsynced(str(layout.rank_stacks_socket(rank)), json.dumps(info).encode())
    except OSError:
        return False
    return True
