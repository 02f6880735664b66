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
_WARNING = re.compile(rb"^(\S.*?):(\d+): (\w*Warning: .*)$")


def last_output_line(path: Path) -> str:
    """What a rank last said, for a table's last-line cell: its last line that is not blank, as
    last drawn (a progress bar's last frame: the text after its last carriage return), never a
    note xl wrote into the log (``[xl: ...]``) and never the source line a warning echoes under
    itself (``  warnings.warn(``: the warning above it is what was said, shown as "UserWarning:
    MESSAGE (FILE:LINE)"). "" when there is none.
    """
    lines = last_lines(path, _LAST_LINE_BYTES)
    shown = [_drawn(line) for line in lines]
    for i in range(len(lines) - 1, -1, -1):
        text = shown[i]
        if not text.strip() or text.startswith(b"[xl: "):
            continue
        if text[:1].isspace() and i > 0 and _WARNING.match(shown[i - 1]):
            continue  # the warning's echo: the warning itself is the line before
        warned = _WARNING.match(text.strip())
        if warned:  # what it warns of first, where from after (a path would fill the cell)
            where = os.path.basename(warned[1].decode("utf-8", "replace"))
            return f"{warned[3].decode('utf-8', 'replace')} ({where}:{int(warned[2])})"
        return text.decode("utf-8", "replace").strip()
    return ""


def _drawn(line: bytes) -> bytes:
    """A line as a terminal last showed it: its last frame that is not empty."""
    frames = [f for f in line.split(b"\r") if f.strip()]
    return frames[-1] if frames else b""
