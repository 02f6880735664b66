"""The Monitor's per-rank table: one keyed row per rank, only changed cells are re-rendered."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from textual.message import Message
from textual.widgets import DataTable

from xl.tui import fmt
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
        "node": str(getattr(rv, "node", None) or "-"),
        "gpu": "cpu" if gpu is None else str(gpu),
        "util": fmt.meter(None if util is None else util / 100, 4, "-" if util is None else f"{util:3.0f}%"),
        "mem": mem,
        "step": "-" if step is None else (f"{step:.0f}/{total_steps:.0f}" if total_steps else f"{step:.0f}"),
        "sps": fmt.number(getattr(rv, "samples_per_s", None), 3),
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

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            self.add_column(label, key=key, width=width)

    def update_ranks(self, ranks: Mapping[int, Any], now: float) -> None:
        pending: dict[str, dict[str, Any]] = {}
        for rank in sorted(ranks):
            cells = rank_cells(ranks[rank], now)
            old = self._cells.get(rank)
            if old is None:
                self.add_row(*(cells[c] for c, _, _ in COLUMNS), key=str(rank))
            else:
                changed = {col: value for col, value in cells.items() if old[col] != value}
                if changed:
                    pending[str(rank)] = changed
            self._cells[rank] = cells
        if pending:
            # Only the changed cells are re-rendered, and only the changed rows repainted.
            self._set_cells(pending)

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
