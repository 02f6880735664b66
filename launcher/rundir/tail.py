"""Complete lines appended to a growing file since the last read: the run dir's logs and JSONL.

One tail for every reader of the run dir (the RunReader's metrics, events and rank logs; `xl
logs -f`), so each of them sees whole lines only and survives a file that starts over.
"""

from __future__ import annotations

import os
from pathlib import Path


class Tail:
    """Complete lines appended to a file since the last call (survives truncation).

    ``initial_cap``: the first read takes at most the file's last ``initial_cap`` bytes (its
    first, probably cut, line dropped): a view needs recent lines, not a huge file's history.
    ``partial`` holds a last line whose newline has not been written yet.
    """

    def __init__(self, path: Path, initial_cap: int | None = None) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self._first = True
        self._cap = initial_cap

    def read(self) -> list[bytes]:
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return []
        if size < self.offset:  # replaced or truncated: start over
            self.offset, self.partial = 0, b""
        if size == self.offset:
            return []
        skip_first = False
        if self._first and self._cap is not None and size > self._cap:
            self.offset = size - self._cap
            skip_first = True
        self._first = False
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(size - self.offset)
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        if skip_first and lines:
            lines.pop(0)
        return lines
