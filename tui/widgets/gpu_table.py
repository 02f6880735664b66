"""The live GPU table of the home screen: one keyed row per GPU, cells updated in place."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual.cache import LRUCache
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

from xl.tui import fmt
from xl.tui.fmt import Cell

if TYPE_CHECKING:
    from xl.gpu.inventory import GPU

COLUMNS = (
    ("sel", "Use"),
    ("gpu", "GPU"),
    ("name", "Model"),
    ("util", "Util"),
    ("mem", "Memory"),
    ("temp", "Temp"),
    ("power", "Power"),
    ("procs", "Processes"),  # "r0 RUN" (a rank and its run) or "pid 4242": each says what it is
)
# A run id's date and time (new_run_id's "20260530-142501-"): left out at 80 columns, where the
# rest (the script's name and a random tag) tells the runs apart and the ranks still show.
_RUN_STAMP = re.compile(r"^\d{8}-\d{6}-(?=.)")
# Narrower than this, the table drops Temp and Power and draws shorter names and meters, so the
# processes column (which rank runs where) still shows at 80 columns.
FULL_WIDTH = 110
COMPACT_COLUMNS = tuple(c for c in COLUMNS if c[0] not in ("temp", "power"))


# Columns that grow to fit a longer value; the others keep the width their first value gave them.
WIDENING = frozenset({"procs", "name"})

# DataTable's private render caches, keyed by row (see _set_cells). Checked once: should a Textual
# release rename them, the table falls back to update_cell (correct, only slower).
_CACHES = (
    "_data",
    "_row_renderable_cache",
    "_cell_render_cache",
    "_row_render_cache",
    "_line_cache",
)


def value_key(value: Cell) -> tuple[object, ...]:
    """A hashable stand-in for a cell value (rich Text is mutable, so not hashable)."""
    if isinstance(value, Text):
        spans = tuple((sp.start, sp.end, str(sp.style)) for sp in value.spans)
        return (value.plain, str(value.style), spans, value.justify, value.no_wrap, value.overflow)
    return ("str", str(value))


def _procs(gpu: GPU, compact: bool = False) -> str:
    """Who uses the GPU: an xl rank by its rank and run (``r0,r1 RUN``, the ranks of one run
    together; ``compact``: the run id without its date and time), any other process by its pid."""
    runs: dict[str, list[str]] = {}
    parts = []
    for p in gpu.processes:
        rank, run = p.rank, p.run_id
        if rank is None:
            parts.append(f"pid {p.pid}")
        elif run:
            run = _RUN_STAMP.sub("…", run) if compact else run
            if run not in runs:
                runs[run] = []
                parts.append(run)  # filled in below, in the place of the run's first rank
            runs[run].append(f"r{rank}")
        else:
            parts.append(f"r{rank} pid {p.pid}")  # a rank outside xl (plain torchrun)
    parts = [f"{','.join(runs[part])} {part}" if part in runs else part for part in parts]
    if len(parts) > 4:
        parts = [*parts[:4], f"+{len(parts) - 4}"]
    return " ".join(parts) or "-"


def gpu_cells(gpu: GPU, position: int | None, compact: bool = False) -> dict[str, Cell]:
    """A GPU's row; ``compact``: the model without "NVIDIA " and half-width meters."""
    bar = 4 if compact else 8
    if gpu.lost:
        lost = Text("lost", style="bold red")
        return {
            "sel": Text(f"[{position + 1}]" if position is not None else "[ ]"),
            "gpu": str(gpu.index),
            "name": gpu.name,
            "util": lost,
            "mem": lost,
            "temp": "-",
            "power": "-",
            "procs": "-",
        }
    total = gpu.memory_total_mib
    used = gpu.memory_used_mib
    mem_frac = used / total if used is not None and total else None
    util = gpu.util_gpu
    name = gpu.name.removeprefix("NVIDIA ") if compact else gpu.name
    name += " (MIG)" if gpu.mig_mode else ""
    power = "-"
    if gpu.power_w is not None:
        power = f"{gpu.power_w:.0f}W"
        if gpu.power_limit_w:
            power += f"/{gpu.power_limit_w:.0f}"
    return {
        "sel": Text(f"[{position + 1}]", style="bold reverse")
        if position is not None
        else Text("[ ]", style="dim"),
        "gpu": str(gpu.index),
        "name": name,
        "util": fmt.meter(
            None if util is None else util / 100, bar, "-" if util is None else f"{util:3d}%"
        ),
        "mem": fmt.meter(mem_frac, bar, f"{fmt.mib(used)}/{fmt.mib(total)}"),
        "temp": "-" if gpu.temperature_c is None else f"{gpu.temperature_c}C",
        "power": power,
        "procs": _procs(gpu, compact),
    }


class LiveTable(DataTable):
    """A DataTable for values that change every poll: only changed cells are re-rendered.

    Shared by the GPUs table and the Monitor's rank table. Columns named in ``widening`` grow to
    fit a longer value (through update_cell); the others keep their width.
    """

    widening: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._fast = all(hasattr(self, name) for name in _CACHES)
        # Rendered cells by value: utilization, memory, states keep coming back to values drawn
        # before.
        self._by_value: LRUCache[tuple[Any, ...], Any] = LRUCache(4096)
        self._paint_style: Style | None = None

    def _set_cells(self, pending: dict[str, dict[str, Any]]) -> None:
        """Put new values in some rows' cells and repaint just those rows.

        DataTable.update_cell bumps a table-wide counter that voids every cached cell and repaints
        the whole table: at one poll a second that is most of the GPUs screen's CPU. Here only the
        changed cells' cache entries go and only the changed rows' lines are repainted.
        ``pending`` maps row key -> {column key: new value}.
        """
        widening = self.widening
        if not self._fast or any(
            col in widening for changed in pending.values() for col in changed
        ):
            for key, changed in pending.items():
                for col, value in changed.items():
                    self.update_cell(key, col, value, update_width=col in widening)
            return
        stale_cells = set()
        stale_rows = set()
        for key, changed in pending.items():
            row_key = RowKey(key)
            row = self._data[row_key]
            for col, value in changed.items():
                column_key = ColumnKey(col)
                row[column_key] = value
                stale_cells.add((row_key, column_key))
            stale_rows.add(row_key)
            self._row_renderable_cache.discard((self._update_count, self.get_row_index(row_key)))
        cells = self._cell_render_cache
        # An LRUCache has keys() but no __iter__.
        for cell_key in [k for k in cells.keys() if (k[0], k[1]) in stale_cells]:  # noqa: SIM118
            cells.discard(cell_key)
        rows = self._row_render_cache
        for row_cache_key in [k for k in rows.keys() if k[0] in stale_rows]:  # noqa: SIM118
            rows.discard(row_cache_key)
        # Keyed by screen line, not by row: cheap to rebuild from the row cache kept above.
        self._line_cache.clear()
        # One repaint region from the first to the last changed row (rows between them come from
        # the row cache): a refresh per row costs more than the rows it spares.
        indexes = [self.get_row_index(row_key) for row_key in stale_rows]
        top = self._get_row_region(min(indexes))
        bottom = self._get_row_region(max(indexes))
        self._refresh_region(Region.union(top, bottom))

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Any,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> Any:
        # A changed cell is rendered through Rich (Styled(Padding(Text))) which is the costly part
        # of repainting a row; the same value in the same place and style renders the same lines.
        if row_index < 0 or column_index < 0 or not self._fast:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        row_key = self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        if row_key is None or column_key is None:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        value = self._data[row_key][column_key]
        memo_key = (
            row_index,
            column_index,
            value_key(value),
            base_style,
            width,
            cursor,
            hover,
            self._show_hover_cursor,
            self._pseudo_class_state,
            self.cell_padding,
        )
        lines = self._by_value.get(memo_key)
        if lines is None:
            lines = super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
            self._by_value.set(memo_key, lines)
        return lines

    def render_lines(self, crop: Region) -> list[Strip]:
        # DataTable asks for rich_style once per line and DOMNode computes it afresh each time by
        # walking every ancestor: compute it once per paint instead.
        self._paint_style = super().rich_style
        try:
            return super().render_lines(crop)
        finally:
            self._paint_style = None

    @property
    def rich_style(self) -> Style:
        style = getattr(self, "_paint_style", None)
        return style if style is not None else super().rich_style

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._forget_renders()

    def _clear_caches(self) -> None:
        super()._clear_caches()
        self._forget_renders()

    def _forget_renders(self) -> None:
        by_value = getattr(
            self, "_by_value", None
        )  # DataTable.__init__ may clear before ours exists
        if by_value is not None:
            by_value.clear()


class GPUTable(LiveTable):
    """Rows keyed by GPU index; space/enter/click toggles, shift+up/down reorders."""

    widening = WIDENING

    class Toggled(Message):
        """The person asked to (de)select the GPU under the cursor."""

        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._cells: dict[str, dict[str, Any]] = {}
        self._shown: dict[str, tuple[Any, int | None]] = {}
        self.compact = False
        self._last: tuple[Sequence[Any], Sequence[int]] = ((), ())

    @property
    def columns_shown(self) -> tuple[tuple[str, str], ...]:
        return COMPACT_COLUMNS if self.compact else COLUMNS

    def on_mount(self) -> None:
        for key, label in self.columns_shown:
            self.add_column(label, key=key)

    def on_resize(self) -> None:
        compact = self.size.width < FULL_WIDTH
        if compact == self.compact:
            return
        # Another set of columns: rebuild the table (a resize, not a poll; rare).
        self.compact = compact
        cursor = self.cursor_row
        self.clear(columns=True)
        self._cells.clear()
        self._shown.clear()
        for key, label in self.columns_shown:
            self.add_column(label, key=key)
        self.update_gpus(*self._last)
        if self.row_count:
            self.move_cursor(row=min(cursor, self.row_count - 1))

    def update_gpus(self, gpus: Sequence[GPU], order: Sequence[int]) -> None:
        self._last = (gpus, list(order))
        present = {str(g.index) for g in gpus}
        for key in [k for k in self._cells if k not in present]:
            self.remove_row(key)
            del self._cells[key]
            self._shown.pop(key, None)
        pending: dict[str, dict[str, Any]] = {}
        for gpu in gpus:
            key = str(gpu.index)
            pos = order.index(gpu.index) if gpu.index in order else None
            if self._shown.get(key) == (gpu, pos):
                continue  # same record, same place in the order: the row already shows it
            self._shown[key] = (gpu, pos)
            cells = gpu_cells(gpu, pos, self.compact)
            if self.compact:
                cells = {c: cells[c] for c, _ in COMPACT_COLUMNS}
            old = self._cells.get(key)
            if old is None:
                self.add_row(*(cells[c] for c, _ in self.columns_shown), key=key)
            else:
                changed = {col: value for col, value in cells.items() if old.get(col) != value}
                if changed:
                    pending[key] = changed
            self._cells[key] = cells
        if pending:
            self._set_cells(pending)

    def cursor_index(self) -> int | None:
        if not self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return int(row_key.value) if row_key.value is not None else None

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.Toggled(int(event.row_key.value)))
