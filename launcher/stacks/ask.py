"""Ask one rank on this node where it is (the requester's side of ``xl.launcher.rank.stacks``).

First the rank's socket: structured stacks with thread names plus the Flight Recorder's
collectives. When the rank does not answer there in time (C code holds the GIL, so no Python
thread can run), its signal: faulthandler writes every thread's stack from a C signal handler,
which this module reads back and parses. A rank that answers neither is reported with
``"error"``; nothing here waits longer than the deadline it is given.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from xl.launcher.rank.stacks import peer_is
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.stacks.collectives import Collectives
from xl.launcher.stacks.model import Frame, RankStacks, Target, Thread
from xl.launcher.stacks.verdict import SILENT

SOCKET_S = 1.5  # the socket's share of the deadline; the rest goes to the signal
_SETTLE_S = 0.1  # faulthandler's output is complete once the file stops growing this long
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


@dataclass(frozen=True, slots=True)
class Answer:
    """What a rank's socket answers: its threads, its collectives, and why there are none."""

    threads: Sequence[Thread]
    collectives: Collectives
    note: str | None = None


def parse_answer(doc: object) -> Answer | None:
    """A rank's socket answer (JSON, xl.launcher.rank.stacks.answer) -> its values."""
    if not isinstance(doc, dict):
        return None
    entry = RankStacks.from_json(
        {"threads": doc.get("threads") or [], "collectives": doc.get("collectives") or []}
    )
    note = doc.get("collectives_note")
    said = note if isinstance(note, str) and note else None
    return Answer(entry.threads or (), entry.collectives, said)


def _ask_socket(name: str, pid: int, timeout: float) -> Answer | None:
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
    return parse_answer(doc)


def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for ``signum`` (else the signal's default would end it)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _own_frame(frame: Frame) -> bool:
    path = frame.file
    return path.startswith("<frozen runpy") or path.endswith(
        ("/runpy.py", "/launcher/entry.py", "/launcher/rank/entry.py")
    )


def trim(threads: Sequence[Thread]) -> tuple[Thread, ...]:
    """Cut the outer frames of xl's rank entry and runpy: a stack starts in the user's code."""
    out = []
    for thread in threads:
        frames = thread.frames
        cut = 0
        while cut < len(frames) - 1 and _own_frame(frames[cut]):
            cut += 1
        out.append(Thread(thread.name, frames[cut:]) if cut else thread)
    return tuple(out)


def parse_faulthandler(text: str, main_ident: int | None = None) -> list[Thread]:
    """faulthandler's dump -> threads with frames innermost last, the main thread first."""
    found: list[tuple[bool, str, list[Frame]]] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            ident = int(head.group(2), 16)
            name = "MainThread" if ident == main_ident else f"Thread {head.group(2)}"
            found.append((ident == main_ident, name, []))
            continue
        frame = _FRAME.match(line)
        if frame and found:
            found[-1][2].append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
    found.sort(key=lambda t: not t[0])
    return [Thread(name, tuple(reversed(frames))) for _, name, frames in found]


def _ask_signal(
    run_dir: Path, rank: int, pid: int, signum: int, main_ident: int | None, timeout: float
) -> list[Thread] | None:
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


def ask_rank(run_dir: Path, target: Target, timeout: float) -> RankStacks:
    """One rank's entry of the stacks document."""
    rank, pid = target.rank, target.pid
    if rank is None or pid is None:
        return target.failed("no process recorded for this rank yet")
    try:
        found = json.loads(RunLayout(run_dir).rank_stacks_socket(rank).read_text())
    except (OSError, ValueError):
        found = {}
    if not isinstance(found, dict) or found.get("pid") != pid:
        return target.failed(
            "this rank has no stack handler (it was not started by xl's rank entry)"
        )
    if not Path(f"/proc/{pid}").exists():
        return target.failed("the process is gone")
    entry = RankStacks(rank, target.host, pid)
    answer = _ask_socket(str(found.get("socket")), pid, min(SOCKET_S, timeout / 2))
    if answer is not None:
        return replace(
            entry, threads=trim(answer.threads), collectives=answer.collectives, note=answer.note
        )
    left = max(0.2, timeout - min(SOCKET_S, timeout / 2))
    main = found.get("main_thread")
    signum = found.get("signal")
    threads = _ask_signal(
        run_dir,
        rank,
        pid,
        signum if type(signum) is int else 0,
        main if type(main) is int else None,
        left,
    )
    if threads is None:
        return replace(entry, error=f"{SILENT} within {timeout:g} s")
    return replace(
        entry,
        threads=trim(threads),
        note="Python could not run in this rank (C code holds the GIL): stacks from faulthandler, "
        "no collectives",
    )
