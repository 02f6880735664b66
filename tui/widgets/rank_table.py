"""The Monitor's per-rank table: one line per rank, drawn through Textual's line API.

A run on more than one node is grouped by node: the Node column comes first, rows are ordered by
node (nodes in the order of their lowest rank, as torch numbers them) then rank, and each node's
first row names it in bold (the rest in dim), so 4 nodes x 16 ranks read as four blocks.

Why not a DataTable: with 64 ranks nearly every visible cell changes each second, and DataTable
renders each changed cell through Rich (Styled(Padding(Text))) and reassembles its rows; that is
the biggest share of the Monitor's CPU (bench/bench_tui.py). Here a cell value becomes segments
once (rank_cells.py; values such as states, meters and "0s ago" recur, so most come from a cache),
a row is its cells' segments under the row's style, and only rows whose cells changed are repainted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import BindingType
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from xl.launcher.view.runview import node_order
from xl.tui.fmt import Cell
from xl.tui.widgets.cursor_keys import CursorKeys
from xl.tui.widgets.gpu_table import value_key
from xl.tui.widgets.rank_cells import (
    PADDING,
    TIME_WIDTH,
    RankValues,
    cell_segments,
    format_cells,
    join_row,
    rank_values,
)

if TYPE_CHECKING:
    from xl.launcher.view.runview import RankView

# Columns in the order shown, at fixed widths (a value that outgrows its column is cut with an
# ellipsis): no update changes the table's layout, only the terminal's width does. What does not
# fit the width is left out, least needed first (PRIORITY), so that 80 columns show the rank, its
# GPU, state, step, loss, step time with its split, samples/s and memory, and nothing scrolls off
# sideways. The step's split bar is no figure: it shrinks (to nothing) before a figure goes.
# One node: no Node column (the same host on every row; the Monitor's header names it).
COLUMNS = (
    ("rank", "Rank", 4),
    ("gpu", "GPU", 3),
    ("state", "State", 9),
    ("step", "Step", 11),
    ("loss", "Loss", 8),
    ("time", "Step time", 12),
    ("sps", "Samples/s", 9),
    ("util", "Util", 9),
    ("mem", "Memory", 11),
    ("seen", "Last seen", 12),
)
# Once any rank has evaluated: its latest eval loss (and epoch) last; a run without evaluations
# never has this column.
EVAL_COLUMN = ("eval", "Eval loss (ep)", 14)
# Grouped by node: the node first (as wide as the longest name, within NODE_WIDTH), then these.
AFTER_NODE = COLUMNS
NODE_WIDTH = (4, 24)
# Lower is kept longer; the first four are kept whatever the width (the table then scrolls).
PRIORITY = {
    "node": 0,
    "rank": 0,
    "state": 1,
    "step": 2,
    "loss": 3,
    "time": 4,
    "sps": 5,
    "mem": 6,
    "gpu": 7,
    "util": 8,
    "eval": 9,
    "seen": 10,
}
KEPT = 4
# The step-time column grows with a wide terminal (a longer bar), up to this many columns.
TIME_WIDEST = 24
TIME_HEADER_WIDE = "Step time  d c n o"  # the bar's letters: data, compute, comm, other

Columns = tuple[tuple[str, str, int], ...]


def node_column(nodes: list[str], had: int) -> Columns:
    """The Node column for a run on more than one node, as wide as its longest name (within
    NODE_WIDTH) and never narrower than it ``had`` (a shorter new name needs no new layout)."""
    if len(nodes) < 2:
        return ()
    width = min(max(NODE_WIDTH[0], *(len(n) for n in nodes)), NODE_WIDTH[1])
    return (("node", "Node", max(width, had)),)


def fit(columns: Columns, width: int) -> Columns:
    """The columns that fit ``width`` (0: not laid out yet: all), least needed left out first,
    the step-time column at its narrowest (the time alone) meanwhile, then widened with what is
    left over (its bar)."""
    if width <= 0:
        return columns
    narrow = {k: (TIME_WIDTH if k == "time" else w) + 2 * PADDING for k, _, w in columns}
    by_need = sorted(narrow, key=lambda k: PRIORITY.get(k, 99))
    kept = set(by_need)
    for key in reversed(by_need):
        if sum(narrow[k] for k in kept) <= width or PRIORITY.get(key, 99) < KEPT:
            break
        kept.discard(key)
    # A narrow column left out on the way (the GPU's index) comes back where there is room.
    for key in by_need:
        if key not in kept and sum(narrow[k] for k in kept) + narrow[key] <= width:
            kept.add(key)
    spare = max(0, width - sum(narrow[k] for k in kept))
    out = []
    for key, label, w in columns:
        if key not in kept:
            continue
        if key == "time":
            w = min(TIME_WIDEST, TIME_WIDTH + spare)
            label = TIME_HEADER_WIDE if w >= len(TIME_HEADER_WIDE) else label
            label = label if w >= len(label) else "Time"
        out.append((key, label, w))
    return tuple(out)


def row_order(
    ranks: Iterable[int], labels: Mapping[int, str | None], nodes: list[str], grouped: bool
) -> tuple[list[int], dict[str | None, int]]:
    """Ranks in row order, and each node's first rank: grouped, by node (in ``nodes`` order)
    then rank; otherwise by rank alone."""
    if not grouped:
        return sorted(ranks), {}
    place = {node: i for i, node in enumerate(nodes)}
    order = sorted(ranks, key=lambda r: (place.get(labels[r] or "", len(place)), r))
    firsts: dict[str | None, int] = {}
    for r in order:
        firsts.setdefault(labels[r], r)
    return order, firsts


def row_styles(table: RankTable) -> dict[str, tuple[Style, Style]]:
    """(style under the cells, style over them) of each kind of row: zebra, or the cursor's."""
    base = table.visual_style.rich_style
    cursor = table.get_component_rich_style("rank-table--cursor")
    # As DataTable does by default: the cursor's colour wins over the cell's own.
    over = Style.from_color(cursor.color) if cursor.color else Style.null()
    even = base + table.get_component_rich_style("rank-table--even-row")
    none = Style.null()
    return {"odd": (base, none), "even": (even, none), "cursor": (base + cursor, over)}


class RankTable(CursorKeys, ScrollView, can_focus=True):
    """Ranks as rows under a header that stays put; the cursor row is the rank being followed.

    Keys move the cursor (up/down, page up/down, home/end), left/right scroll a table wider than
    the terminal, a click picks a row. Moving to another rank posts RankChosen.
    """

    BINDINGS: ClassVar[list[BindingType]] = CursorKeys.CURSOR_BINDINGS
    # Styled in the app's stylesheet (tui/xl.tcss), like every other widget of the app.
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "rank-table--header",
        "rank-table--cursor",
        "rank-table--even-row",
    }

    class RankChosen(Message):
        """The cursor moved to another rank (its log and charts follow)."""

        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._columns: Columns = COLUMNS
        self._rows: list[int] = []  # ranks in row order
        self._index: dict[int, int] = {}  # rank -> row
        # rank -> (rank_values, whether it is the first row of its node)
        self._values: dict[int, tuple[RankValues, bool]] = {}
        self._cells: dict[int, dict[str, Cell]] = {}  # rank -> formatted cells, once drawn
        self._cell_keys: dict[int, dict[str, Any]] = {}  # rank -> column -> value_key of its cell
        self._version: dict[int, int] = {}  # rank -> bumped whenever one of its cells changes
        self._strips: dict[int, tuple[Any, Strip]] = {}  # rank -> (what it was drawn from, line)
        self._segments: LRUCache[tuple[Any, ...], list[Segment]] = LRUCache(4096)
        self._header: tuple[Any, Strip] | None = None
        self._node_names: list[str] = []  # the last update's, for a layout on resize
        self._evals = False
        self._timed = False
        self._row_styles: dict[str, tuple[Style, Style]] | None = None
        self.cursor_row = 0
        self._chosen: int | None = None  # the rank RankChosen last named

    # -- what the Monitor and tests use ------------------------------------------------------

    @property
    def grouped(self) -> bool:
        """True when the table groups ranks by node (the run spans more than one node)."""
        return self._columns[0][0] == "node"

    @property
    def row_count(self) -> int:
        return len(self._rows)

    @property
    def column_keys(self) -> list[str]:
        return [key for key, _, _ in self._columns]

    @property
    def current_rank(self) -> int | None:
        return self._rows[self.cursor_row] if self._rows else None

    def cell(self, rank: int, column: str) -> Cell:
        """What the row of ``rank`` shows in ``column`` (a str or a rich Text)."""
        return self._cells_of(rank)[column]

    def column(self, column: str) -> list[Cell]:
        """Every row's value in ``column``, top to bottom."""
        return [self._cells_of(rank)[column] for rank in self._rows]

    def _cells_of(self, rank: int) -> dict[str, Cell]:
        cells = self._cells.get(rank)
        if cells is None:
            values, first = self._values[rank]
            time = next((w for key, _, w in self._columns if key == "time"), 12)
            cells = self._cells[rank] = format_cells(values, bar=time - TIME_WIDTH - 1)
            if self.grouped:
                cells["node"] = Text(str(cells["node"]), style="bold" if first else "dim")
            self._cell_keys[rank] = {col: value_key(value) for col, value in cells.items()}
        return cells

    def move_cursor(self, row: int) -> None:
        if not self._rows:
            return
        row = max(0, min(row, len(self._rows) - 1))
        old = self.cursor_row
        self.cursor_row = row
        if old != row:
            for moved in (old, row):
                if moved < len(self._rows):
                    self.refresh_lines(moved + 1)
        self._scroll_to_cursor()
        self._announce()

    # -- keys and mouse ----------------------------------------------------------------------

    def on_click(self, event: events.Click) -> None:
        if event.y >= 1:  # the header is line 0
            row = self.scroll_offset.y + event.y - 1
            if row < len(self._rows):
                self.move_cursor(row)

    def _visible_rows(self) -> int:
        return self.scrollable_content_region.height - 1

    def _scroll_to_cursor(self) -> None:
        top = self.scroll_offset.y
        visible = self._visible_rows()
        if visible <= 0:
            return
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= top + visible:
            self.scroll_to(y=self.cursor_row - visible + 1, animate=False)

    def _announce(self) -> None:
        rank = self.current_rank
        if rank is not None and rank != self._chosen:
            self._chosen = rank
            self.post_message(self.RankChosen(rank))

    # -- updates -----------------------------------------------------------------------------

    def _layout(self, nodes: list[str], evals: bool, timed: bool) -> Columns:
        # Once shown, the eval and step-time columns stay (no new layout each time a value comes);
        # a run whose steps are not timed (--no-instrument, an older xl) keeps its columns.
        self._evals, self._timed = self._evals or evals, self._timed or timed
        self._node_names = nodes
        head = node_column(nodes, self._columns[0][2] if self.grouped else 0)
        body = AFTER_NODE if self._timed else tuple(c for c in AFTER_NODE if c[0] != "time")
        return fit((*head, *body, *((EVAL_COLUMN,) if self._evals else ())), self.size.width)

    def on_resize(self) -> None:
        # Another width shows other columns: every line is drawn again, once.
        if self._rows and self._relayout(self._layout(self._node_names, self._evals, self._timed)):
            self.refresh()

    def _relayout(self, columns: Columns) -> bool:
        if columns == self._columns:
            return False
        self._columns = columns
        self._cells.clear()
        self._strips.clear()
        self._header = None
        self._resize()
        return True

    def update_ranks(
        self, ranks: Mapping[int, RankView], now: float, labels: Mapping[int, str | None]
    ) -> None:
        """Show ``ranks`` (the RunView's) as of ``now``, each on the node ``labels`` names
        (RunView.node_labels)."""
        nodes = node_order(labels)
        timed = any(rv.step_s is not None for rv in ranks.values())
        columns = self._layout(nodes, any(rv.eval_loss is not None for rv in ranks.values()), timed)
        # A second node appeared (or a longer node name, or an eval): every line drawn again, once.
        relayout = self._relayout(columns)
        grouped = self.grouped
        order, firsts = row_order(ranks, labels, nodes, grouped)
        changed: list[int] = []
        for rank in order:
            node = labels[rank]
            values = rank_values(ranks[rank], now, node)
            # Grouped, the node's first row names it in bold, the others in dim.
            row = (values, grouped and node is not None and firsts.get(node) == rank)
            if row != self._values.get(rank):
                # Formatted when the row is drawn or asked for: off-screen rows of a wide run
                # cost a comparison per refresh, not a formatting.
                self._values[rank] = row
                self._cells.pop(rank, None)
                self._version[rank] = self._version.get(rank, 0) + 1
                changed.append(rank)
        if order != self._rows:
            # New ranks, or ranks on an earlier node reported late: rows in place, cursor kept.
            keep = self.current_rank
            self._rows = order
            self._index = {rank: i for i, rank in enumerate(order)}
            self.cursor_row = self._index.get(keep, 0) if keep is not None else 0
            self._resize()
            self.refresh()
            self._scroll_to_cursor()
            self._announce()
            return
        if relayout:
            self._resize()
            self.refresh()
            return
        if changed:
            # One repaint from the first to the last changed row that is on screen (unchanged
            # rows between them come from the line cache): cheaper than a refresh per row.
            rows = sorted(self._index[rank] for rank in changed)
            top = max(rows[0], self.scroll_offset.y)
            bottom = min(rows[-1], self.scroll_offset.y + self._visible_rows() - 1)
            if bottom >= top:
                self.refresh_lines(top + 1, bottom - top + 1)

    def _resize(self) -> None:
        width = sum(w + 2 * PADDING for _, _, w in self._columns)
        self.virtual_size = Size(width, len(self._rows) + 1)

    # -- drawing -----------------------------------------------------------------------------

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._row_styles = None
        self._strips.clear()
        self._header = None

    def on_focus(self) -> None:
        self._restyle()

    def on_blur(self) -> None:
        self._restyle()

    def _restyle(self) -> None:
        # The cursor's style depends on focus (see xl.tcss).
        self._row_styles = None
        self._strips.clear()
        self.refresh()

    def _styles_for(self, row: int) -> tuple[Style, Style]:
        """(style under the cells, style over them) for a row: zebra, or the cursor's."""
        if self._row_styles is None:
            self._row_styles = row_styles(self)
        kind = "cursor" if row == self.cursor_row else ("even" if row % 2 else "odd")
        return self._row_styles[kind]

    def _cell_segments(
        self, value: Any, key: Any, width: int, under: Style, over: Style
    ) -> list[Segment]:
        """A cell as drawn in a row: padding, then its text cut or padded to ``width``, in the
        row's style under the cell's own and the cursor's colour over both."""
        cache_key = (key, width, under, over)
        segments = self._segments.get(cache_key)
        if segments is None:
            segments = cell_segments(value, width, under, over, self.app.console)
            self._segments.set(cache_key, segments)
        return segments

    def _row_strip(self, row: int, width: int) -> Strip:
        rank = self._rows[row]
        under, over = self._styles_for(row)
        key = (self._version.get(rank), under, width)
        drawn = self._strips.get(rank)
        if drawn is not None and drawn[0] == key:
            return drawn[1]
        cells = self._cells_of(rank)
        keys = self._cell_keys[rank]
        used = self.virtual_size.width
        drawn_cells = (
            self._cell_segments(cells[col], keys[col], w, under, over)
            for col, _, w in self._columns
        )
        strip = Strip(join_row(drawn_cells, under, width - used), max(width, used))
        self._strips[rank] = (key, strip)
        return strip

    def _header_strip(self, width: int) -> Strip:
        style = self.visual_style.rich_style + self.get_component_rich_style("rank-table--header")
        key = (self._columns, style, width)
        if self._header is not None and self._header[0] == key:
            return self._header[1]
        pad = " " * PADDING
        text = "".join(f"{pad}{label[:w].ljust(w)}{pad}" for _, label, w in self._columns)
        strip = Strip([Segment(text.ljust(width), style)])
        self._header = (key, strip)
        return strip

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        scroll_x, scroll_y = self.scroll_offset
        base = self.visual_style.rich_style
        if y == 0:
            strip = self._header_strip(width + scroll_x)
        else:
            row = scroll_y + y - 1
            if not 0 <= row < len(self._rows):
                return Strip.blank(width, base)
            strip = self._row_strip(row, width + scroll_x)
        return strip.crop_extend(scroll_x, scroll_x + width, base)
