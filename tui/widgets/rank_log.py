"""The selected rank's output, following the end of its log, long lines wrapped as a terminal
wraps them (a traceback's last line, the one that says what went wrong, is often the longest).

The view holds a rank's last lines only: when it starts at a log's end, or more lines come than it
keeps, its first line says how many of the log's lines are not in it and where they all are
(docs/output.md)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from pathlib import Path

from rich.cells import cell_len, chop_cells
from textual import events
from textual.widgets import Log

from xl.textsafe import visible

MAX_LINES = 2000  # what stays scrollable; the full log is in the run dir
MAX_ROWS = 4 * MAX_LINES  # of them wrapped: fewer lines stay when they are long




def wrap(line: str, width: int) -> list[str]:
    """``line`` cut into rows of at most ``width`` cells, tabs expanded and every control character
    drawn (Log itself replaces only some C0 codes and passes ESC to the terminal: a rank's OSC 52
    would write the person's clipboard); one row when it fits or the width is not known yet."""
    shown = visible(line.expandtabs())
    if width <= 0 or cell_len(shown) <= width:
        return [shown]
    return chop_cells(shown, width)


class LogLines(list[str]):
    """A rank's lines for the view to start with, and how many of its log's lines came before
    them (``skipped``, in ``path``)."""

    def __init__(self, lines: Iterable[str], *, skipped: int = 0, path: Path | None = None) -> None:
        super().__init__(lines)
        self.skipped = skipped
        self.path = path


def skipped_line(count: int, path: Path | None) -> str:
    where = f": the whole output is in {path}" if path is not None else ""
    return f"… {count:,} line{'s' if count != 1 else ''} skipped{where}"


class RankLog(Log):
    def __init__(self, **kwargs) -> None:
        super().__init__(max_lines=None, auto_scroll=True, **kwargs)
        self.rank: int | None = None
        # The lines as the rank wrote them (each with its rows at the width it was wrapped at):
        # wrapped again when the width changes.
        self._raw: deque[tuple[str, int]] = deque()
        self._rows = 0
        self._wrapped_at = 0
        self.skipped = 0  # lines of the log before the first one in the view
        self.path: Path | None = None

    def _wrap_width(self) -> int:
        return self.scrollable_content_region.width

    def show(self, rank: int, lines: Iterable[str]) -> None:
        """Replace the content with another rank's recent lines."""
        self.rank = rank
        self._raw.clear()
        self._rows = 0
        self.skipped = lines.skipped if isinstance(lines, LogLines) else 0
        self.path = lines.path if isinstance(lines, LogLines) else None
        self.clear()
        if self.skipped:
            self.write_lines(wrap(skipped_line(self.skipped, self.path), self._wrap_width()))
        self.follow(lines)

    def follow(self, lines: Iterable[str]) -> None:
        lines = list(lines)
        if not lines:
            return
        width = self._wrapped_at = self._wrap_width()
        rows = [row for line in lines for row in self._add(line, width)]
        if self._trim():
            self._redraw(width)
        else:
            self.write_lines(rows)

    def _add(self, line: str, width: int) -> list[str]:
        rows = wrap(line, width)
        self._raw.append((line, len(rows)))
        self._rows += len(rows)
        return rows

    def _trim(self) -> int:
        """Drop the oldest lines past MAX_LINES or MAX_ROWS (the newest line stays), counted
        as skipped; how many."""
        dropped = 0
        while len(self._raw) > 1 and (len(self._raw) > MAX_LINES or self._rows > MAX_ROWS):
            self._rows -= self._raw.popleft()[1]
            dropped += 1
        self.skipped += dropped
        return dropped

    def _redraw(self, width: int) -> None:
        """Everything again at ``width``: the skipped line first, then the rank's lines."""
        self._wrapped_at = width
        raw = [line for line, _ in self._raw]
        self._raw.clear()
        self._rows = 0
        wrapped = [self._add(line, width) for line in raw]
        dropped = self._trim()  # narrower: more rows, perhaps too many
        rows = wrap(skipped_line(self.skipped, self.path), width) if self.skipped else []
        rows += [row for line_rows in wrapped[dropped:] for row in line_rows]
        self.clear()
        self.write_lines(rows)

    def on_resize(self, event: events.Resize) -> None:
        width = self._wrap_width()
        if width != self._wrapped_at and self._raw:
            self._redraw(width)
