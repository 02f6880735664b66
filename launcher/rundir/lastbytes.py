"""The end of a run-dir file, in whole lines, without reading the rest of it.

For the readers that want only the newest lines of a file that may be huge: a failed rank's last
log lines (the root cause), the newest metrics and events (whether a run is stalled).
"""

from __future__ import annotations

import os
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
