"""Ask one rank on this node where it is (the requester's side of ``xl.launcher.rank.stacks``).

First the rank's socket door: structured stacks with thread names plus the Flight Recorder's
collectives. When the rank does not answer there in time (C code holds the GIL, so no Python
thread can run), the signal door: faulthandler writes every thread's stack from a C signal
handler, which this module reads back and parses. A rank that answers neither is reported with
``"error"``; nothing here waits longer than the deadline it is given.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from xl.launcher.rank.stacks import peer_is
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.stacks.verdict import SILENT

SOCKET_S = 1.5  # the socket door's share of the deadline; the rest goes to the signal door
_SETTLE_S = 0.1  # faulthandler's output is complete once the file stops growing this long
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def _ask_socket(name: str, pid: int, timeout: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect("\0" + name)
            if not peer_is(sock, pid):
                return None  # not the rank: someone else's socket under its name
            chunks = []
            while True:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
            doc = json.loads(b"".join(chunks))
        except (OSError, ValueError):
            return None
    return doc if isinstance(doc, dict) else None


def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for ``signum`` (else the signal's default would end it)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _own_frame(frame: dict[str, Any]) -> bool:
    path = str(frame.get("file") or "")
    return path.startswith("<frozen runpy") or path.endswith(
        ("/runpy.py", "/launcher/entry.py", "/launcher/rank/entry.py")
    )


def trim(threads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cut the outer frames of xl's rank entry and runpy: a stack starts in the user's code."""
    for thread in threads:
        frames = thread.get("frames") or []
        cut = 0
        while cut < len(frames) - 1 and _own_frame(frames[cut]):
            cut += 1
        thread["frames"] = frames[cut:]
    return threads


def parse_faulthandler(text: str, main_ident: int | None = None) -> list[dict[str, Any]]:
    """faulthandler's dump -> threads with frames innermost last, the main thread first."""
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            ident = int(head.group(2), 16)
            name = "MainThread" if ident == main_ident else f"Thread {head.group(2)}"
            threads.append({"name": name, "frames": [], "_main": ident == main_ident})
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1]["frames"].insert(
                0, {"file": frame.group(1), "line": int(frame.group(2)), "function": frame.group(3)}
            )
    threads.sort(key=lambda t: not t.pop("_main"))
    return threads


def _ask_signal(
    run_dir: Path, rank: int, pid: int, signum: int, main_ident: int | None, timeout: float
) -> list[dict[str, Any]] | None:
    path = RunLayout(run_dir).rank_stacks_text(rank)
    try:
        start = os.path.getsize(path)
    except OSError:
        return None
    if not _catches(pid, signum):
        return None
    try:
        os.kill(pid, signum)
    except OSError:
        return None
    deadline = time.monotonic() + timeout
    size, changed = start, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        try:
            now = os.path.getsize(path)
        except OSError:
            return None
        if now != size:
            size, changed = now, time.monotonic()
        elif size > start and time.monotonic() - changed >= _SETTLE_S:
            break
    if size <= start:
        return None
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read(size - start).decode(errors="replace")
    return parse_faulthandler(text, main_ident)


def ask_rank(run_dir: Path, info: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One rank's entry of the stacks document: ``info`` holds its ``rank``, ``node`` and
    ``pid``."""
    rank, pid = info.get("rank"), info.get("pid")
    out: dict[str, Any] = {"rank": rank, "node": info.get("node"), "pid": pid}
    if not isinstance(rank, int) or not isinstance(pid, int):
        return {**out, "error": "no process recorded for this rank yet"}
    try:
        door = json.loads(RunLayout(run_dir).rank_stacks_door(rank).read_text())
    except (OSError, ValueError):
        door = {}
    if not isinstance(door, dict) or door.get("pid") != pid:
        return {
            **out,
            "error": "this rank has no stack handler (it was not started by xl's rank entry)",
        }
    if not Path(f"/proc/{pid}").exists():
        return {**out, "error": "the process is gone"}
    answer = _ask_socket(str(door.get("socket")), pid, min(SOCKET_S, timeout / 2))
    if answer is not None:
        out["threads"] = trim(answer.get("threads") or [])
        out["collectives"] = answer.get("collectives") or []
        if answer.get("collectives_note"):
            out["note"] = answer["collectives_note"]
        return out
    left = max(0.2, timeout - min(SOCKET_S, timeout / 2))
    threads = _ask_signal(
        run_dir, rank, pid, int(door.get("signal") or 0), door.get("main_thread"), left
    )
    if threads is None:
        return {**out, "error": f"{SILENT} within {timeout:g} s"}
    out["threads"] = trim(threads)
    out["collectives"] = []
    out["note"] = (
        "Python could not run in this rank (C code holds the GIL): stacks from faulthandler, no "
        "collectives"
    )
    return out
