"""The Monitor past BIG_RUN ranks: nodes and outliers first, a node's ranks on demand.

Up to node_summary.BIG_RUN ranks the Monitor is a row per rank, as it always was. Past it, a row
per rank is more than a person reads and more than a refresh should cost at 4,096 ranks, so the
Monitor leads with the outliers (the slowest ranks, slow nodes, every rank not running) and a row
per node (NodeTable); `enter` on a node shows that node's ranks in the usual rank table and
`escape` comes back. The rank table always holds the chosen node's ranks (hidden until then), so
the log follows a rank of the node under the cursor, and `k` asks about it. The charts show the
spread of every rank's latest point, one point a poll (Spread), not bands over every history.
docs/tui.md, 'Big runs'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult

from xl.textsafe import visible
from xl.tui.widgets.charts import MetricChart
from xl.tui.widgets.node_summary import Summary, is_big, summarise
from xl.tui.widgets.node_table import NodeTable, outliers_text
from xl.tui.widgets.rank_table import RankTable
from xl.tui.widgets.spread import Spread
from xl.tui.widgets.text_lines import TextLines

if TYPE_CHECKING:
    from textual.screen import Screen

    from xl.launcher.view.runview import RankView, RunView


class NodesView:
    """The nodes-and-outliers half of a Monitor screen (``screen``)."""

    def __init__(self, screen: Screen[Any]) -> None:
        self.screen = screen
        self.active = False  # the run is past BIG_RUN ranks: nodes lead
        self.drilled: str | None = None  # the node whose ranks the rank table shows
        self.summary: Summary | None = None
        self.spreads = {"loss": Spread(), "sps": Spread()}

    def compose(self) -> ComposeResult:
        yield TextLines("", id="outliers")
        yield NodeTable(id="node-table")
        yield TextLines("", id="node-title")

    def on_mount(self) -> None:
        self._show(False)

    def _show(self, nodes: bool) -> None:
        s = self.screen
        s.query_one("#outliers").display = nodes
        s.query_one(NodeTable).display = nodes
        s.query_one(RankTable).display = not nodes
        s.query_one("#node-title").display = self.active and not nodes

    # -- each poll ---------------------------------------------------------------------------

    def render(self, view: RunView, now: float) -> None:
        """Draw the tables from one poll's view: every rank's row for a small run; for a big
        one the outliers and the node rows, and the chosen node's ranks in the rank table."""
        ranks = view.ranks
        table = self.screen.query_one(RankTable)
        if not is_big(ranks):
            if self.active:  # ranks gone from the view (a reader started over): a row each again
                self.active, self.drilled = False, None
                self._show(False)
                self.screen.set_focus(table)
            table.update_ranks(ranks, now, view.node_labels)
            return
        labels = view.node_labels
        if not self.active:
            self.active = True
            focused = self.screen.focused is table or self.screen.focused is None
            self._show(self.drilled is None)
            if focused and self.drilled is None:
                self.screen.set_focus(self.screen.query_one(NodeTable))
        self.summary = summary = summarise(ranks, labels, view.nodes, run_over=view.final)
        self.screen.query_one("#outliers", TextLines).update(outliers_text(summary))
        nodes = self.screen.query_one(NodeTable)
        nodes.update_nodes(summary.nodes)
        self._fill_ranks(view, now)

    def _fill_ranks(self, view: RunView, now: float) -> None:
        name = self.drilled
        if name is None:
            current = self.screen.query_one(NodeTable).current
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
        self.screen.query_one(RankTable).update_ranks(subset, now, {r: labels[r] for r in subset})

    def charts(self, view: RunView, t0: float, followed: int | None) -> bool:
        """A big run's charts (True), or False: the caller draws a small run's as it always did."""
        if not is_big(view.ranks):
            return False
        ranks = view.ranks
        rv = ranks.get(followed) if followed is not None else None
        for key, value, attr in (
            ("loss", "loss", "loss_history"),
            ("sps", "samples_per_s", "samples_history"),
        ):
            spread = self.spreads[key]
            spread.update(ranks, value, attr)
            self.screen.query_one(f"#chart-{key}", MetricChart).set_spread(
                spread,
                t0=t0,
                highlight=followed,
                followed=list(getattr(rv, attr)) if rv is not None else (),
            )
        return True

    # -- keys --------------------------------------------------------------------------------

    def moved(self, node: str, chosen: bool) -> None:
        """The node cursor moved: the (hidden) rank table takes that node's ranks; ``chosen``:
        they are shown."""
        if chosen:
            self.drill(node)
            return
        view = getattr(self.screen, "view", None)
        if self.drilled is None and view is not None:
            self._fill_ranks(view, self.screen.xl.clock())  # type: ignore[attr-defined]

    def drill(self, node: str) -> None:
        """Show ``node``'s ranks (the rank table), `escape` back to the nodes."""
        self.drilled = node
        view = getattr(self.screen, "view", None)
        if view is not None:
            self._fill_ranks(view, self.screen.xl.clock())  # type: ignore[attr-defined]
        count = self.screen.query_one(RankTable).row_count
        self.screen.query_one("#node-title", TextLines).update(
            Text.assemble(
                ("node ", "bold"),
                (visible(node), "bold"),
                f": its {count} ranks",
                ("   esc: every node", "dim"),
            )
        )
        self._show(False)
        table = self.screen.query_one(RankTable)
        table.move_cursor(0)
        self.screen.set_focus(table)
        self.screen.refresh_bindings()

    def back(self) -> bool:
        """Back from a node's ranks to the nodes; False when there was nothing to go back from."""
        if not self.active or self.drilled is None:
            return False
        self.drilled = None
        self._show(True)
        self.screen.set_focus(self.screen.query_one(NodeTable))
        self.screen.refresh_bindings()
        return True
