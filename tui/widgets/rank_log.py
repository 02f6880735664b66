"""The selected rank's output, following the end of its log, long lines wrapped as a terminal
wraps them (a traceback's last line, the one that says what went wrong, is often the longest)."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable

from rich.cells import cell_len, chop_cells
from textual import events
from textual.widgets import Log

MAX_LINES = 2000  # what stays scrollable; the full log is in the run dir


# What Log itself replaces when it draws a line (control codes); the wrap counts what is drawn.
_CONTROL = re.compile("[\u0000-\u0014]")


def wrap(line: str, width: int) -> list[str]:
    """``line`` cut into rows of at most ``width`` cells (as Log shows it: tabs expanded, control
    codes replaced); one row when it fits or the width is not known yet."""
    shown = _CONTROL.sub("\ufffd", line.expandtabs())
    if width <= 0 or cell_len(shown) <= width:
        return [shown]
    return chop_cells(shown, width)


class RankLog(Log):
    def __init__(self, **kwargs) -> None:
        super().__init__(max_lines=MAX_LINES, auto_scroll=True, **kwargs)
        self.rank: int | None = None
        # The lines as the rank wrote them: wrapped again when the width changes.
        self._raw: deque[str] = deque(maxlen=MAX_LINES)
        self._wrapped_at = 0

    def _wrap_width(self) -> int:
        return self.scrollable_content_region.width

    def show(self, rank: int, lines: Iterable[str]) -> None:
        """Replace the content with another rank's recent lines."""
        self.rank = rank
        self._raw.clear()
        self.clear()
        self.follow(lines)

    def follow(self, lines: Iterable[str]) -> None:
        lines = list(lines)
        if not lines:
            return
        self._raw.extend(lines)
        width = self._wrapped_at = self._wrap_width()
        self.write_lines([row for line in lines for row in wrap(line, width)])

    def on_resize(self, event: events.Resize) -> None:
        width = self._wrap_width()
        if width != self._wrapped_at and self._raw:
            self._wrapped_at = width
            self.clear()
            self.write_lines([row for line in self._raw for row in wrap(line, width)])
