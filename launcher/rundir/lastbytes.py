"""The end of a run-dir file, in whole lines, without reading the rest of it.

For the readers that want only the newest lines of a file that may be huge: a failed rank's last
log lines (the root cause), the newest metrics and events (whether a run is stalled).
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def last_lines(path: Path, limit: int) -> list[bytes]:
    """The lines within the file's last ``limit`` bytes ([] when unreadable); the first one is
    left out when the seek cut it (unless nothing else is there)."""
    try:
        with path.open("rb") as fh:
            start = max(0, fh.seek(0, os.SEEK_END) - limit)
            fh.seek(start)
            data = fh.read(limit)
    except OSError:
        return []
    rest = data.partition(b"\n")[2]
    if start > 0 and rest.strip():
        data = rest
    return data.splitlines()


_LAST_LINE_BYTES = 64 << 10
# The line Python's warnings module prints under a warning: the source line that warned, indented.
_WARNING = re.compile(r"^(\S.*?):(\d+): (\w*Warning: .*)$")


def said(line: str, before: str = "") -> str | None:
    """What a table's last-line cell shows for ``line`` of a rank's output (``before``: the line
    it follows, as said here): the line as last drawn (a progress bar's last frame, after its last
    carriage return), a warning as "UserWarning: MESSAGE (FILE:LINE)" (a path would fill the
    cell); None for what is not the rank's word: a blank line, a note xl wrote into the log
    (``[xl: ...]``), or the source line a warning echoes under itself (``  warnings.warn(``)."""
    frames = [f for f in line.split("\r") if f.strip()]
    text = frames[-1].rstrip() if frames else ""
    if not text.strip() or text.startswith("[xl: "):
        return None
    if text[:1].isspace() and _WARNING.match(before):
        return None  # the warning's echo: the warning itself, the line before, was said
    warned = _WARNING.match(text)
    if warned:
        return f"{warned[3]} ({os.path.basename(warned[1])}:{int(warned[2])})"
    return text.strip()


def last_output_line(path: Path) -> str:
    """What a rank last said (``said``), from the end of its log; "" when there is none."""
    lines = [ln.decode("utf-8", "replace") for ln in last_lines(path, _LAST_LINE_BYTES)]
    for i in range(len(lines) - 1, -1, -1):
        shown = said(lines[i], _drawn(lines[i - 1]) if i > 0 else "")
        if shown is not None:
            return shown
    return ""


def _drawn(line: str) -> str:
    """A line as a terminal last showed it: its last frame that is not empty."""
    frames = [f for f in line.split("\r") if f.strip()]
    return frames[-1].rstrip() if frames else ""
