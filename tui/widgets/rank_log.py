"""The selected rank's output, following the end of its log, long lines wrapped as a terminal
wraps them (a traceback's last line, the one that says what went wrong, is often the longest).

Following is a mode of the view, not its scroll position at the moment lines come: it shows
the newest line whatever happens around it (a log already long when the view opens, a banner or
a second header line that makes the pane shorter, a narrower terminal), until the person scrolls
back; scrolled to the end again (or ``follow_end``, the Monitor's `f`), it follows again. Each
change of it is posted (``RankLog.Following``) so the pane's title can say it.

The view holds a rank's last lines only: when it starts at a log's end, or more lines come than it
keeps, its first line says how many of the log's lines are not in it and where they all are
(docs/output.md)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.cells import cell_len, chop_cells
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Label, Log

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
    class Following(Message):
        """The view started or stopped following its log's end."""

        def __init__(self, following: bool) -> None:
            super().__init__()
            self.following = following

    def __init__(self, **kwargs) -> None:
        # Log's own auto_scroll follows only while the view is at the end as lines come: once
        # the pane got shorter after a scroll to the end, it stopped for good.
        super().__init__(max_lines=None, auto_scroll=False, **kwargs)
        self.following = True
        self._moving = False  # the view scrolls itself: not the person scrolling back
        self.rank: int | None = None
        # The lines as the rank wrote them (each with its rows at the width it was wrapped at):
        # wrapped again when the width changes.
        self._raw: deque[tuple[str, int]] = deque()
        self._rows = 0
        self._wrapped_at = 0
        self._gone = 0  # lines dropped from the view's start since show(): _raw[i] is line _gone+i
        self._head_rows = 0  # rows the skipped line takes as drawn
        self.skipped = 0  # lines of the log before the first one in the view
        self.path: Path | None = None

    def _wrap_width(self) -> int:
        return self.scrollable_content_region.width

    def show(self, rank: int, lines: Iterable[str]) -> None:
        """Replace the content with another rank's recent lines, and follow its end."""
        self.rank = rank
        self._raw.clear()
        self._rows = self._gone = 0
        self.skipped = lines.skipped if isinstance(lines, LogLines) else 0
        self.path = lines.path if isinstance(lines, LogLines) else None
        self._set_following(True)
        with self._scrolling():  # clearing scrolls to the top on its own
            self.clear()
            head = self._head(self._wrap_width())
            self.write_lines(head)
        self._head_rows = len(head)
        self.follow(lines)
        self._to_end()

    def follow(self, lines: Iterable[str]) -> None:
        """Add a rank's new lines."""
        lines = list(lines)
        if not lines:
            return
        top = self._top_line()
        width = self._wrapped_at = self._wrap_width()
        rows = [row for line in lines for row in self._add(line, width)]
        if self._trim():
            self._redraw(width, top)
        else:
            self.write_lines(rows)
            self._to_end()

    def follow_end(self) -> None:
        """Show the newest line and follow the log again."""
        self._set_following(True)
        self._to_end()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if not self._moving:  # the person scrolled (wheel, keys, scrollbar): back, or to the end
            self._set_following(round(new_value) >= self.max_scroll_y)

    def on_resize(self, event: events.Resize) -> None:
        width = self._wrap_width()
        if width != self._wrapped_at and self._raw:
            self._redraw(width, self._top_line())
        else:  # only shorter or taller: the newest line stays at the bottom
            self._to_end()

    @contextmanager
    def _scrolling(self) -> Iterator[None]:
        self._moving = True
        try:
            yield
        finally:
            self._moving = False

    def _to_end(self) -> None:
        if self.following:
            with self._scrolling():
                self.scroll_end(animate=False, immediate=True, x_axis=False)

    def _set_following(self, following: bool) -> None:
        if following != self.following:
            self.following = following
            self.post_message(self.Following(following))

    def _head(self, width: int) -> list[str]:
        return wrap(skipped_line(self.skipped, self.path), width) if self.skipped else []

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
        self._gone += dropped
        return dropped

    def _top_line(self) -> int:
        """The number (since show()) of the line drawn at the top of the view; -1: the skipped
        line."""
        row = round(self.scroll_y) - self._head_rows
        if row < 0:
            return -1
        for index, (_, rows) in enumerate(self._raw):
            if row < rows:
                return self._gone + index
            row -= rows
        return self._gone + len(self._raw) - 1

    def _redraw(self, width: int, top: int) -> None:
        """Everything again at ``width``: the skipped line first, then the rank's lines. A person
        reading back keeps the line they read at the top (the oldest kept once it is dropped)."""
        self._wrapped_at = width
        raw = [line for line, _ in self._raw]
        self._raw.clear()
        self._rows = 0
        wrapped = [self._add(line, width) for line in raw]
        dropped = self._trim()  # narrower: more rows, perhaps too many
        head = self._head(width)
        rows = head + [row for line_rows in wrapped[dropped:] for row in line_rows]
        self._head_rows = len(head)
        with self._scrolling():
            self.clear()
            self.write_lines(rows)
            if not self.following:
                kept = top - self._gone
                row = 0 if kept < 0 else self._head_rows + sum(n for _, n in list(self._raw)[:kept])
                self.scroll_to(y=row, animate=False, immediate=True)
        self._to_end()


class LogPane(Vertical):
    """The chosen rank's log under a title that names the rank and says whether the view
    follows the log's end (styled in tui/xl.tcss: ``#log-title``, ``#rank-log``)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rank: int | None = None

    def compose(self) -> ComposeResult:
        yield Label("Log", id="log-title")
        yield RankLog(id="rank-log")

    def choose(self, rank: int) -> None:
        """Another rank: its lines come with the next poll, from its end."""
        self.rank = rank
        self._title(following=True)

    def take(self, rank: int, lines: list[str]) -> None:
        """A poll's lines of ``rank``: its last ones after a switch (LogLines), else new ones."""
        log = self.query_one(RankLog)
        if rank != self.rank:
            return
        if log.rank != rank or isinstance(lines, LogLines):
            log.show(rank, lines)
        else:
            log.follow(lines)

    def follow_end(self) -> None:
        self.query_one(RankLog).follow_end()

    def on_rank_log_following(self, message: RankLog.Following) -> None:
        self._title(message.following)

    def _title(self, following: bool) -> None:
        if self.rank is not None:
            state = "following" if following else "scrolled back: f follows"
            self.query_one("#log-title", Label).update(f"Log — rank {self.rank} ({state})")
