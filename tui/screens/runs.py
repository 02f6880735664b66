"""Runs: every run in the run store, newest first; enter opens one in the Monitor."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Header, Static

from xl.tui import fmt
from xl.tui.screens.base import XLScreen

if TYPE_CHECKING:
    from xl.launcher.rundir.store import RunInfo

# The id (what `xl attach` takes) right after the status, the free-length name last: at 80
# columns a long name is what gets cut, never the id.
COLUMNS = (
    ("status", "Status"),
    ("id", "Run id"),
    ("start", "Started"),
    ("dur", "Duration"),
    ("world", "Ranks"),
    ("name", "Name"),
)


# Narrower than this, Started gives way to Name (a run id begins with its start: 20260530-142501-…);
# at 80 columns the name had 2 letters left.
FULL_WIDTH = 100

# Room for values a running run's row grows into between rebuilds ("59s" -> "1h02m", "running"
# -> "succeeded").
MIN_WIDTH = {"status": 9, "dur": 7}


def run_cells(info: RunInfo, now: float) -> dict[str, fmt.Cell]:
    start, end = info.started_at, info.ended_at
    status = info.status or "?"
    cell = fmt.coloured(status)
    if status == "running" and not info.supervisor_alive:
        # run.json says running but its supervisor is gone (machine rebooted, kill -9).
        cell = fmt.coloured("orphaned")
    return {
        "status": cell,
        "start": time.strftime("%Y-%m-%d %H:%M", time.localtime(start)) if start else "-",
        "dur": fmt.duration(((end or now) - start) if start else None),
        "world": str(info.world_size or "-"),
        "name": info.name or "-",
        "id": info.run_id,
    }


class RunsScreen(XLScreen):
    AUTO_FOCUS = "#runs-table"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "Open"),
        Binding("r", "refresh", "Refresh"),
        Binding("space", "mark", "Mark"),
        Binding("c", "compare", "Compare"),
    ]

    class Listed(Message):
        bubble = False

        def __init__(self, runs: list[RunInfo], error: str | None) -> None:
            super().__init__()
            self.runs = runs
            self.error = error

    def __init__(self, *, interval: float = 2.0) -> None:
        super().__init__(id="runs")
        self.interval = interval
        self.runs: dict[str, RunInfo] = {}
        self._cells: dict[str, dict[str, Any]] = {}
        self._active = True
        self._next_list: Timer | None = None  # the one pending refresh (see on_runs_screen_listed)
        self.marked: list[str] = []  # run ids marked with space, two at most: `c` compares them
        self._columns: tuple[
            tuple[str, str], ...
        ] = ()  # the columns shown (their set depends on the width)

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Static("", id="runs-summary")
        yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.title = "xl — Runs"
        self._list()

    def on_resize(self) -> None:
        if self._shown_columns() != self._columns:
            self._list()  # the table is rebuilt with the columns that fit

    def _shown_columns(self) -> tuple[tuple[str, str], ...]:
        return (
            COLUMNS
            if self.size.width >= FULL_WIDTH
            else tuple(c for c in COLUMNS if c[0] != "start")
        )

    def on_screen_suspend(self) -> None:
        self._active = False

    def on_screen_resume(self) -> None:
        if not self._active:
            self._active = True
            self._list()

    def action_refresh(self) -> None:
        self._list()

    @work(thread=True, exclusive=True, group="runs-list")
    def _list(self) -> None:
        try:
            self.post_message(self.Listed(list(self.backend.runs()), None))
        except Exception as exc:  # a broken run store should be reported, not crash the app
            self.post_message(self.Listed([], f"{type(exc).__name__}: {exc}"))

    def on_runs_screen_listed(self, message: Listed) -> None:
        now = self.xl.clock()
        table = self.query_one(DataTable)
        summary = self.query_one("#runs-summary", Static)
        if message.error:
            summary.update(f"Cannot list runs: {message.error}")
        else:
            running = sum(1 for r in message.runs if r.status == "running")
            summary.update(
                f"{len(message.runs)} run{'' if len(message.runs) == 1 else 's'}, {running} "
                f"running.  enter: open in the monitor"
                if message.runs
                else "No runs yet: start one from Launch (3) or with `xl launch`."
            )
        ordered = sorted(message.runs, key=lambda r: r.started_at or 0, reverse=True)
        keys = [r.run_id for r in ordered]
        rows = [
            self._with_mark(key, run_cells(info, now))
            for key, info in zip(keys, ordered, strict=True)
        ]
        columns = self._shown_columns()
        if keys != list(self._cells) or columns != self._columns:
            # New or removed runs change the order; rebuild the (short) list only then, with
            # columns as wide as their longest value. (Left to DataTable, the widths followed the
            # rows only once the table next went idle, and in a terminal that could be never:
            # run ids stayed cut to their label's width, "202605".)
            table.clear(columns=True)
            self._columns = columns
            for col, label in columns:
                width = max(
                    [len(label), MIN_WIDTH.get(col, 0), *(Text(str(r[col])).cell_len for r in rows)]
                )
                table.add_column(label, key=col, width=width)
            self._cells = {}
        for key, info, cells in zip(keys, ordered, rows, strict=True):
            self.runs[key] = info
            old = self._cells.get(key)
            if old is None:
                table.add_row(*(cells[c] for c, _ in columns), key=key)
            else:
                for col, _ in columns:
                    if old[col] != cells[col]:
                        table.update_cell(key, col, cells[col])
            self._cells[key] = cells
        # One refresh loop: `r` or coming back to the screen lists at once and replaces the
        # pending timer rather than starting another loop beside it.
        if self._next_list is not None:
            self._next_list.stop()
            self._next_list = None
        if self._active:
            self._next_list = self.set_timer(self.interval, self._list)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self._open(event.row_key.value)

    def action_open(self) -> None:
        table = self.query_one(DataTable)
        if table.row_count:
            row_key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
            self._open(row_key.value)

    def _open(self, key: str | None) -> None:
        if not key or (info := self.runs.get(key)) is None:
            return
        self.xl.open_monitor(info.run_dir)

    # -- marking two runs and comparing them (docs/compare.md) -------------------------------

    def _with_mark(self, key: str, cells: dict[str, Any]) -> dict[str, Any]:
        """A marked run's id shown reversed, with its letter in the comparison."""
        if key in self.marked:
            cells["id"] = Text(f"{cells['id']}", style="reverse bold")
        return cells

    def action_mark(self) -> None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return
        key = str(table.coordinate_to_cell_key(table.cursor_coordinate)[0].value)
        if key in self.marked:
            self.marked.remove(key)
        else:
            self.marked = [*self.marked, key][-2:]  # a third mark lets go of the first
        for k, cells in self._cells.items():
            shown = self._with_mark(k, {**cells, "id": k})["id"]
            if cells["id"] != shown:
                cells["id"] = shown
                table.update_cell(k, "id", shown)
        which = " and ".join(self.marked) or "none"
        self.notify(
            f"marked: {which}"
            + ("; c compares them" if len(self.marked) == 2 else "; mark another with space"),
            timeout=3,
        )

    def action_compare(self) -> None:
        if len(self.marked) != 2 or any(k not in self.runs for k in self.marked):
            self.notify("Mark two runs with space, then c compares them", severity="warning")
            return
        from xl.tui.screens.compare import CompareScreen  # noqa: PLC0415 - the screen loads when two runs are compared

        a, b = (self.runs[k].run_dir for k in self.marked)
        self.app.push_screen(CompareScreen(a, b, lambda: self.backend.compare(a, b)))
