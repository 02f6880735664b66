"""Shared-memory segments NCCL and torch leave behind in /dev/shm when a job dies before it can
unlink them: which are stale (nobody maps them any more), and how much they hold.

NCCL names its segments nccl-XXXXXX and unlinks them once both peers have mapped them, so one
still there that no process maps was left by a dead job. torch's shared-memory manager names
them torch_<pid>_<n>_<n>: stale once that pid is gone. Reading every process's maps is done only
when such files exist, and bounded (a busy machine costs at most _MAX_PROCS reads).

A segment younger than _SETTLE seconds is never called stale: NCCL unlinks its own within
seconds of making them, so one still there after that was left behind; a young one may be a job
starting now, or one in another container sharing this /dev/shm (--ipc=host), whose processes
this /proc does not show.
"""

from __future__ import annotations

import os
import re
import time

from xl.doctor.facts import Segment
from xl.doctor.probes.files import listdir

_SEGMENT = re.compile(r"^(nccl-[0-9A-Za-z]+|torch_(\d+)_\w+)$")
_MAX_PROCS = 4096
_MAX_MAPS = 1 << 20  # bytes read from one process's maps
_SETTLE = 120.0  # seconds


def _mapped(folder: str) -> tuple[set[str], bool]:
    """The files in `folder` some process maps, and whether every process could be read."""
    prefix = folder.rstrip("/") + "/"
    seen: set[str] = set()
    complete = True
    for n, pid in enumerate(p for p in listdir("/proc") if p.isdigit()):
        if n >= _MAX_PROCS:
            return seen, False
        try:
            with open(f"/proc/{pid}/maps", "rb") as fh:
                text = fh.read(_MAX_MAPS).decode("utf-8", "replace")
        except OSError:
            complete = False
            continue
        for line in text.splitlines():
            at = line.find(prefix)
            if at >= 0:
                seen.add(line[at:].removesuffix(" (deleted)"))
    return seen, complete


def segments(folder: str) -> list[Segment]:
    """NCCL's and torch's segments in the shared-memory folder, each judged stale or not."""
    names = [n for n in listdir(folder) if _SEGMENT.match(n)]
    if not names:
        return []
    real = os.path.realpath(folder)
    mapped, complete = _mapped(real)
    now = time.time()
    me = os.getuid()
    out: list[Segment] = []
    for name in sorted(names):
        path = os.path.join(real, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        m = _SEGMENT.match(name)
        pid = m.group(2) if m else None
        if path in mapped or now - st.st_mtime < _SETTLE:
            stale: bool | None = False
        elif pid is not None:
            stale = not os.path.exists(f"/proc/{pid}")
        else:
            # Our own processes' maps are always readable: a file of ours nobody maps is stale.
            stale = True if complete or st.st_uid == me else None
        out.append(Segment(os.path.join(folder, name), st.st_blocks * 512, st.st_uid, stale))
    return out
