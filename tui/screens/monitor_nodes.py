"""The Monitor past BIG_RUN ranks: nodes and outliers first, a node's ranks on demand.

Up to node_summary.BIG_RUN ranks the Monitor is a row per rank, as it always was. Past it, a row
per rank is more than a person reads and more than a refresh should cost at 4,096 ranks, so the
Monitor leads with the outliers (the slowest ranks, slow nodes, every rank not running) and a row
per node (NodeTable); `enter` on a node shows that node's ranks in the usual rank table and
`escape` comes back. The rank table always holds the chosen node's ranks (hidden until then), so
the log follows a rank of the node under the cursor, and `k` asks about it. The charts show the
spread of every rank's latest point, one point a poll (Spread), not bands over every history.
docs/app.md, 'Past 64 ranks'.

``NodesView`` owns the tables it shows (the outliers, the node table, the node's title and the rank
table) and tells its screen what changed by message: the screen hands it each poll's view and
draws the charts from the spreads it keeps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message

from xl.textsafe import visible
from xl.tui.widgets.charts import RUN_CHARTS
from xl.tui.widgets.node_summary import Summary, is_big, summarise
from xl.tui.widgets.node_table import NodeTable, outliers_text
from xl.tui.widgets.rank_table import RankTable
from xl.tui.widgets.spread import Spread
from xl.tui.widgets.text_lines import TextLines

if TYPE_CHECKING:
    from xl.launcher.view.runview import RankView, RunView

class NodesView(Vertical):
    """The Monitor's ranks: a row per rank for a small run; past BIG_RUN ranks the outliers and a
    row per node, a node's ranks on `enter`. ``clock`` gives the time a rank's row is drawn at
    when the node cursor moves between polls."""

    class Drilled(Message):
        """The rank table now shows ``node``'s ranks, or (None) the nodes lead again: the keys
        the screen offers change (`escape` goes back to the nodes)."""

        def __init__(self, node: str | None) -> None:
            super().__init__()
            self.node = node

    class RankChosen(Message):
        """The rank under the rank table's cursor is ``rank`` (the log and charts follow it),
        whether the person moved it or a node's ranks filled the table."""

        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    def __init__(self, clock: Callable[[], float], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.clock = clock
        self.active = False  # the run is past BIG_RUN ranks: nodes lead
        self.drilled: str | None = None  # the node whose ranks the rank table shows
        self.summary: Summary | None = None
        self.spreads = {key: Spread() for key, _, _ in RUN_CHARTS}
        self._view: RunView | None = None  # the last poll's, for a node cursor moved meanwhile

    def compose(self) -> ComposeResult:
        yield TextLines("", id="outliers")
        yield NodeTable(id="node-table")
        yield TextLines("", id="node-title")
        yield RankTable(id="rank-table")

    def on_mount(self) -> None:
        self._show(False)

    def _show(self, nodes: bool) -> None:
        self.query_one("#outliers").display = nodes
        self.query_one(NodeTable).display = nodes
        self.query_one(RankTable).display = not nodes
        self.query_one("#node-title").display = self.active and not nodes

    # -- each poll ---------------------------------------------------------------------------

    def show_view(self, view: RunView, now: float) -> None:
        """Draw the tables from one poll's view: every rank's row for a small run; for a big
        one the outliers and the node rows, and the chosen node's ranks in the rank table."""
        self._view = view
        ranks = view.ranks
        table = self.query_one(RankTable)
        if not is_big(ranks):
            if self.active:  # ranks gone from the view (a reader started over): a row each again
                self.active, self.drilled = False, None
                self._show(False)
                self.screen.set_focus(table)
            table.update_ranks(ranks, now, view.node_labels)
            return
        labels = view.node_labels
        nodes = self.query_one(NodeTable)
        if not self.active:
            self.active = True
            focused = table.has_focus or self.screen.focused is None
            self._show(self.drilled is None)
            if focused and self.drilled is None:
                self.screen.set_focus(nodes)
        self.summary = summary = summarise(ranks, labels, view.nodes, run_over=view.final)
        self.query_one("#outliers", TextLines).update(outliers_text(summary))
        nodes.update_nodes(summary.nodes)
        self._fill_ranks(view, now)

    def _fill_ranks(self, view: RunView, now: float) -> None:
        name = self.drilled
        if name is None:
            current = self.query_one(NodeTable).current
            name = current.node if current is not None else None
        if name is None:
            return
        labels = view.node_labels
        row = (
            next((r for r in self.summary.nodes if r.node == name), None) if self.summary else None
        )
        if row is None:
            return
        subset: dict[int, RankView] = {r: view.ranks[r] for r in row.ranks if r in view.ranks}
        self.query_one(RankTable).update_ranks(subset, now, {r: labels[r] for r in subset})

    def update_spreads(self, view: RunView) -> bool:
        """A big run's chart points, one a poll (True: the screen draws ``spreads``), or False:
        the run is small and the screen draws a line per rank."""
        if not is_big(view.ranks):
            return False
        for key, value, history in RUN_CHARTS:
            self.spreads[key].update(view.ranks, value, history)
        return True

    # -- keys --------------------------------------------------------------------------------

    def on_rank_table_rank_chosen(self, message: RankTable.RankChosen) -> None:
        # Said again as this widget's own: a message the table posts while this widget handles
        # the node cursor goes no further than this widget (Textual stops a message at the
        # parent that caused it).
        message.stop()
        self.post_message(self.RankChosen(message.rank))

    def on_node_table_node_moved(self, message: NodeTable.NodeMoved) -> None:
        """The node cursor moved: the (hidden) rank table takes that node's ranks; chosen
        (`enter`, a click): they are shown."""
        message.stop()
        if message.chosen:
            self.drill(message.node)
        elif self.drilled is None and self._view is not None:
            self._fill_ranks(self._view, self.clock())

    def drill(self, node: str) -> None:
        """Show ``node``'s ranks (the rank table), `escape` back to the nodes."""
        self.drilled = node
        if self._view is not None:
            self._fill_ranks(self._view, self.clock())
        table = self.query_one(RankTable)
        self.query_one("#node-title", TextLines).update(
            Text.assemble(
                ("node ", "bold"),
                (visible(node), "bold"),
                f": its {table.row_count} ranks",
                ("   esc: every node", "dim"),
            )
        )
        self._show(False)
        table.move_cursor(0)
        self.screen.set_focus(table)
        self.post_message(self.Drilled(node))

    def back(self) -> bool:
        """Back from a node's ranks to the nodes; False when there was nothing to go back from."""
        if not self.active or self.drilled is None:
            return False
        self.drilled = None
        self._show(True)
        self.screen.set_focus(self.query_one(NodeTable))
        self.post_message(self.Drilled(None))
        return True
