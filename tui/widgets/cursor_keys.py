"""The keys of the Monitor's tables (ranks, nodes): the row cursor moved a row, a page, to an
end."""

from __future__ import annotations

from typing import ClassVar, Protocol

from textual.binding import Binding, BindingType


class _Table(Protocol):
    @property
    def row_count(self) -> int: ...

    cursor_row: int

    def move_cursor(self, row: int) -> None: ...

    def _visible_rows(self) -> int: ...


class CursorKeys:
    """Mixed into a line-API table with ``row_count``, ``cursor_row``, ``move_cursor(row)`` and
    ``_visible_rows()``; its BINDINGS start with CURSOR_BINDINGS."""

    CURSOR_BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "edge(0)", "First row", show=False),
        Binding("end", "edge(1)", "Last row", show=False),
    ]

    def action_cursor(self: _Table, delta: int) -> None:
        self.move_cursor(self.cursor_row + delta)

    def action_page(self: _Table, direction: int) -> None:
        self.move_cursor(self.cursor_row + direction * max(1, self._visible_rows()))

    def action_edge(self: _Table, end: int) -> None:
        self.move_cursor(self.row_count - 1 if end else 0)
