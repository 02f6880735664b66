"""The Monitor's per-rank table: one keyed row per rank, only changed cells are re-rendered.

A run on more than one node is grouped by node: the Node column comes first, rows are ordered by
node (nodes in the order of their lowest rank, as torch numbers them) then rank, and each node's
first row names it in bold (the rest in dim), so 4 nodes x 16 ranks read as four blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from xl.tui import fmt
from xl.tui.runview import node_of, node_order
from xl.tui.widgets.gpu_table import LiveTable

# What matters most comes first: on an 80-column terminal the right end is scrolled off.
# Fixed widths: a cell that outgrows its column is cut, but no update ever triggers a re-layout
# (with 64 ranks changing every second, re-measuring columns was the Monitor's biggest cost).
COLUMNS = (
    ("rank", "Rank", 4),
    ("state", "State", 9),
    ("step", "Step", 13),
    ("loss", "Loss", 8),
    ("sps", "Samples/s", 9),
    ("util", "Util", 9),
    ("mem", "Memory", 11),
    ("node", "Node", 10),
    ("gpu", "GPU", 4),
    ("seen", "Last seen", 12),
)
# Grouped by node: the node first (as wide as the longest name, within NODE_WIDTH), then these.
AFTER_NODE = tuple(c for c in COLUMNS if c[0] != "node")
NODE_WIDTH = (4, 24)


def rank_cells(rv: Any, now: float) -> dict[str, Any]:
    util = getattr(rv, "gpu_util", None)
    used = getattr(rv, "gpu_mem_used_mib", None)
    total = getattr(rv, "gpu_mem_total_mib", None)
    if used is None and getattr(rv, "rss_mib", None) is not None:
        mem = f"{fmt.mib(rv.rss_mib)} rss"
    else:
        mem = fmt.meter(used / total if used is not None and total else None, 4, fmt.mib(used))
    step = getattr(rv, "step", None)
    total_steps = getattr(rv, "total_steps", None)
    gpu = getattr(rv, "gpu", None)
    return {
        "rank": str(rv.rank),
        "node": node_of(rv) or "-",
        "gpu": "cpu" if gpu is None else str(gpu),
        "util": fmt.meter(None if util is None else util / 100, 4, "-" if util is None else f"{util:3.0f}%"),
        "mem": mem,
        "step": "-" if step is None else (f"{step:.0f}/{total_steps:.0f}" if total_steps else f"{step:.0f}"),
        "sps": fmt.rate(getattr(rv, "samples_per_s", None)),
        "loss": fmt.number(getattr(rv, "loss", None)),
        "seen": fmt.ago(getattr(rv, "last_seen", None), now),
        "state": fmt.state(getattr(rv, "state", None)),
    }


class RankTable(LiveTable):
    class RankChosen(Message):
        """The cursor moved to another rank (its log and charts follow)."""

        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._cells: dict[int, dict[str, Any]] = {}
        self._columns: tuple[tuple[str, str, int], ...] = COLUMNS
        self._rows: list[int] = []  # ranks in row order

    @property
    def grouped(self) -> bool:
        """True when the table groups ranks by node (the run spans more than one node)."""
        return self._columns is not COLUMNS

    def on_mount(self) -> None:
        self._add_columns(COLUMNS)

    def _add_columns(self, columns: tuple[tuple[str, str, int], ...]) -> None:
        self._columns = columns
        for key, label, width in columns:
            self.add_column(label, key=key, width=width)

    def _layout(self, nodes: list[str]) -> tuple[tuple[str, str, int], ...]:
        if len(nodes) < 2:
            return COLUMNS
        width = min(max(NODE_WIDTH[0], *(len(n) for n in nodes)), NODE_WIDTH[1])
        if self.grouped and self._columns[0][2] >= width:
            return self._columns  # a shorter new name fits: no need to rebuild
        return (("node", "Node", width), *AFTER_NODE)

    def update_ranks(self, ranks: Mapping[int, Any], now: float) -> None:
        nodes = node_order(ranks)
        columns = self._layout(nodes)
        keep = None
        if columns != self._columns:
            # A second node appeared (or a longer node name): lay the table out again, once.
            keep = self.current_rank
            self.clear(columns=True)
            self._cells = {}
            self._rows = []
            self._add_columns(columns)
        grouped = self.grouped
        if grouped:
            place = {node: i for i, node in enumerate(nodes)}
            order = sorted(ranks, key=lambda r: (place.get(node_of(ranks[r]) or "", len(place)), r))
            firsts: dict[str | None, int] = {}
            for r in order:
                firsts.setdefault(node_of(ranks[r]), r)
        else:
            order = sorted(ranks)
        pending: dict[str, dict[str, Any]] = {}
        for rank in order:
            cells = rank_cells(ranks[rank], now)
            if grouped:
                node = node_of(ranks[rank])
                # Rich Text equality ignores the base style: the bold one carries a span instead.
                first = node is not None and firsts.get(node) == rank
                cells["node"] = Text.assemble((node or "-", "bold")) if first else Text(node or "-", style="dim")
            old = self._cells.get(rank)
            if old is None:
                self.add_row(*(cells[c] for c, _, _ in self._columns), key=str(rank))
                self._rows.append(rank)
            else:
                changed = {col: value for col, value in cells.items() if old[col] != value}
                if changed:
                    pending[str(rank)] = changed
            self._cells[rank] = cells
        if pending:
            # Only the changed cells are re-rendered, and only the changed rows repainted.
            self._set_cells(pending)
        if self._rows != order:
            # A rank reported after higher ones, or on an earlier node: put the rows in place.
            if keep is None:
                keep = self.current_rank
            where = {r: i for i, r in enumerate(order)}
            self.sort("rank", key=lambda cell: where.get(int(str(cell)), len(where)))
            self._rows = order
        if keep is not None:
            self.show_rank(keep)

    @property
    def current_rank(self) -> int | None:
        if not self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return int(row_key.value) if row_key.value is not None else None

    def show_rank(self, rank: int) -> None:
        if rank in self._cells:
            self.move_cursor(row=self.get_row_index(str(rank)))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.RankChosen(int(event.row_key.value)))
