"""The selected rank's output, following the end of its log."""

from __future__ import annotations

from collections.abc import Iterable

from textual.widgets import Log

MAX_LINES = 2000  # what stays scrollable; the full log is in the run dir


class RankLog(Log):
    def __init__(self, **kwargs) -> None:
        super().__init__(max_lines=MAX_LINES, auto_scroll=True, **kwargs)
        self.rank: int | None = None

    def show(self, rank: int, lines: Iterable[str]) -> None:
        """Replace the content with another rank's recent lines."""
        self.rank = rank
        self.clear()
        self.write_lines(list(lines))

    def follow(self, lines: Iterable[str]) -> None:
        lines = list(lines)
        if lines:
            self.write_lines(lines)
