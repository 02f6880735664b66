"""The Monitor's view of a big run: its outliers in a few lines, then a row per node.

Past node_summary.BIG_RUN ranks the Monitor shows these in place of the rank table (docs/app.md,
'Past 64 ranks'); `enter` on a node shows that node's ranks in the rank table, `escape` comes back.
Like the rank table, a line-API widget: only rows on screen are drawn, and a row only when what
it shows changed (NodeRow.key), so 512 nodes cost a comparison each per refresh.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from xl.textsafe import visible
from xl.tui.widgets.cursor_keys import CursorKeys
from xl.tui.widgets.node_summary import NAMED_PER_STATE, NodeRow, Summary
from xl.tui.widgets.rank_cells import step_time
from xl.tui.widgets.text_lines import text_segments
from xl.tui.widgets.verdict import PHASE_STYLE
from xl.units import ranges

PADDING = 1
NODE_WIDTH = (4, 20)
# (key, header, width); the node's width follows its names, the status takes what is left.
# At 80 columns (a scrollbar's 2 taken) the status keeps 12: "slow ×2.2", "1 failed".
COLUMNS = (
    ("ranks", "Ranks", 5),
    ("step", "Step", 7),
    ("time", "Step min/med/max", 17),
    ("phase", "Phase", 11),
)
STATUS_MIN = 8
DOWN_WORDS = {"failed": "failed", "stalled": "stalled", "stopped": "stopped", "exited": "exited"}


def node_cells(row: NodeRow) -> dict[str, Text]:
    """What a node's row shows, column by column."""
    ranks = Text(f"{row.running}/{len(row.ranks)}")
    step = Text("-" if row.step is None else f"{row.step:.0f}")
    time = Text(
        " ".join(step_time(t).rjust(5) for t in (row.time_min, row.time_median, row.time_max))
    )
    phase = Text()
    if row.phase is not None and row.phase_share is not None:
        phase.append(f"{row.phase} {row.phase_share:.0%}")
    status = Text()
    if row.slow is not None:
        status.append(f"slow ×{row.slow:.1f}", style="bold yellow")
    for state, n in sorted(row.down.items()):
        if status:
            status.append(" · ")
        status.append(
            f"{n} {DOWN_WORDS.get(state, state)}",
            style="bold red" if state in ("failed", "stalled") else "dim",
        )
    return {
        "node": Text(visible(row.node)),
        "ranks": ranks,
        "step": step,
        "time": time,
        "phase": phase,
        "status": status,
    }


def outliers_text(summary: Summary) -> Text:
    """The lines above the node rows: the slowest ranks (slow only when they are), slow nodes,
    and every rank not running."""
    text = Text()
    if summary.slowest:
        text.append("slowest", style="bold")
        if summary.median_s is not None:
            text.append(f" (median rank {step_time(summary.median_s)})", style="dim")
        text.append(":")
        for s in summary.slowest:
            text.append(f"  rank {s.rank}", style="bold yellow" if s.flagged else "bold")
            text.append(f" {step_time(s.step_s)}")
            if s.flagged and s.ratio is not None:
                text.append(f" ×{s.ratio:.1f}", style="bold yellow")
            if s.phase in PHASE_STYLE:
                text.append(" ")
                text.append(s.phase, style=PHASE_STYLE[s.phase])
            if s.node:
                text.append(f" on {visible(s.node)}", style="dim")
    slow_nodes = summary.slow_nodes
    if slow_nodes:
        text.append("\n" if text else "")
        text.append("slow nodes:", style="bold yellow")
        for row in slow_nodes[:NAMED_PER_STATE]:
            text.append(f"  {visible(row.node)} ×{row.slow:.1f}")
            if row.phase:
                text.append(f" {row.phase}", style="dim")
        if len(slow_nodes) > NAMED_PER_STATE:
            text.append(f"  and {len(slow_nodes) - NAMED_PER_STATE} more")
    by_state: dict[str, list[Any]] = {}
    for down in summary.down:
        by_state.setdefault(down.state, []).append(down)
    for state, downs in by_state.items():
        text.append("\n" if text else "")
        style = "bold red" if state in ("failed", "stalled") else "bold"
        text.append(f"{DOWN_WORDS.get(state, state)}:", style=style)
        if len(downs) <= NAMED_PER_STATE:
            for d in downs:
                text.append(f"  rank {d.rank}")
                if d.node:
                    text.append(f" on {visible(d.node)}", style="dim")
                if d.exit_code is not None:
                    text.append(f" exit {d.exit_code}")
                elif d.diagnosis:
                    # The diagnosis names its rank first ("rank 100 has not stepped ..."): said
                    # once already on this line.
                    note = visible(d.diagnosis).removeprefix(f"rank {d.rank} ")
                    text.append(f": {note[:60]}", style="dim")
        else:
            nodes = {d.node for d in downs}
            text.append(f"  {len(downs)} ranks on {len(nodes)} node{'s' * (len(nodes) != 1)}: ")
            text.append(ranges(d.rank for d in downs)[:200])
    return text


class NodeTable(CursorKeys, ScrollView, can_focus=True):
    """A row per node under a header that stays put (styled in tui/xl.tcss); moving the cursor
    posts NodeMoved, `enter` (or a click on the cursor's row) too, as chosen."""

    BINDINGS: ClassVar[list[BindingType]] = [
        *CursorKeys.CURSOR_BINDINGS,
        Binding("enter", "choose", "Node's ranks"),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {"node-table--header", "node-table--cursor"}

    class NodeMoved(Message):
        """The cursor moved to ``node`` (``chosen``: `enter` or a click on it: show its ranks)."""

        def __init__(self, node: str, chosen: bool) -> None:
            super().__init__()
            self.node = node
            self.chosen = chosen

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rows: list[NodeRow] = []
        self.cursor_row = 0
        self._node_width = NODE_WIDTH[0]
        self._strips: dict[int, tuple[Any, Strip]] = {}  # row -> (what it was drawn from, line)
        self._announced: str | None = None

    # -- what the Monitor and tests use ------------------------------------------------------

    @property
    def row_count(self) -> int:
        return len(self.rows)

    @property
    def current(self) -> NodeRow | None:
        return self.rows[self.cursor_row] if self.rows else None

    def row_text(self, node: str) -> str:
        """The row of ``node`` as plain text, cells separated by two spaces."""
        row = next(r for r in self.rows if r.node == node)
        cells = node_cells(row)
        return "  ".join(
            cells[k].plain for k in ("node", "ranks", "step", "time", "phase", "status")
        )

    def update_nodes(self, rows: list[NodeRow]) -> None:
        keep = self.current.node if self.current else None
        width = min(max(NODE_WIDTH[0], *(len(r.node) for r in rows), 0), NODE_WIDTH[1])
        relayout = width > self._node_width or len(rows) != len(self.rows)
        self._node_width = max(self._node_width, width)
        old = self.rows
        self.rows = rows
        if keep is not None:
            self.cursor_row = next((i for i, r in enumerate(rows) if r.node == keep), 0)
        self.cursor_row = min(self.cursor_row, max(0, len(rows) - 1))
        if relayout:
            self._strips.clear()
            self.virtual_size = Size(self.size.width, len(rows) + 1)
            self.refresh(layout=True)
        else:
            changed = [i for i, (a, b) in enumerate(zip(old, rows, strict=True)) if a.key != b.key]
            if changed:
                top = max(changed[0], self.scroll_offset.y)
                bottom = min(changed[-1], self.scroll_offset.y + self._visible_rows() - 1)
                if bottom >= top:
                    self.refresh_lines(top + 1, bottom - top + 1)
        self._announce()

    def move_cursor(self, row: int) -> None:
        if not self.rows:
            return
        row = max(0, min(row, len(self.rows) - 1))
        old, self.cursor_row = self.cursor_row, row
        for moved in {old, row}:
            self._strips.pop(moved, None)
            self.refresh_lines(moved + 1)
        top, visible_rows = self.scroll_offset.y, self._visible_rows()
        if visible_rows > 0:
            if row < top:
                self.scroll_to(y=row, animate=False)
            elif row >= top + visible_rows:
                self.scroll_to(y=row - visible_rows + 1, animate=False)
        self._announce()

    # -- keys and mouse ----------------------------------------------------------------------

    def action_choose(self) -> None:
        if self.current is not None:
            self.post_message(self.NodeMoved(self.current.node, chosen=True))

    def on_click(self, event: events.Click) -> None:
        if event.y >= 1:
            row = self.scroll_offset.y + event.y - 1
            if row == self.cursor_row:
                self.action_choose()
            elif row < len(self.rows):
                self.move_cursor(row)

    def _visible_rows(self) -> int:
        return self.scrollable_content_region.height - 1

    def _announce(self) -> None:
        node = self.current.node if self.current else None
        if node is not None and node != self._announced:
            self._announced = node
            self.post_message(self.NodeMoved(node, chosen=False))

    # -- drawing -----------------------------------------------------------------------------

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.rows) + 1

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()

    def on_focus(self) -> None:
        self._strips.clear()
        self.refresh()

    def on_blur(self) -> None:
        self._strips.clear()
        self.refresh()

    def on_resize(self) -> None:
        self._strips.clear()

    def _widths(self, width: int) -> list[tuple[str, str, int]]:
        cols = [("node", "Node", self._node_width), *COLUMNS]
        used = sum(w + 2 * PADDING for _, _, w in cols)
        cols.append(("status", "Status", max(STATUS_MIN, width - used - 2 * PADDING)))
        return cols

    def _line(self, cells: dict[str, Text], width: int, style: Style) -> Strip:
        line = Text(no_wrap=True, overflow="ellipsis")
        pad = " " * PADDING
        for key, _, w in self._widths(width):
            cell = cells[key].copy()
            cell.truncate(w, overflow="ellipsis", pad=True)
            line.append(pad)
            line.append_text(cell)
            line.append(pad)
        line.truncate(width, pad=True)
        return Strip(text_segments(line, self.app.console, style))

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self.visual_style.rich_style
        if y == 0:
            header = {k: Text(label) for k, label, _ in self._widths(width)}
            style = base + self.get_component_rich_style("node-table--header")
            return self._line(header, width, style)
        row = self.scroll_offset.y + y - 1
        if not 0 <= row < len(self.rows):
            return Strip.blank(width, base)
        cursor = row == self.cursor_row
        style = base + self.get_component_rich_style("node-table--cursor") if cursor else base
        key = (self.rows[row].key, cursor, width, self.has_focus)
        drawn = self._strips.get(row)
        if drawn is not None and drawn[0] == key:
            return drawn[1]
        strip = self._line(node_cells(self.rows[row]), width, style)
        self._strips[row] = (key, strip)
        return strip
