"""Two runs side by side (Runs: ``space`` marks two, ``c`` opens this): the table `xl compare`
prints, and one chart of both runs over steps, loss above and samples/s below.

The comparison comes from the backend on a thread worker (a run without its digest is read
whole, which takes a moment on a long run). At 80x24 the chart keeps its rows and the table
scrolls above it; ``escape`` goes back to Runs. docs/compare.md says what each figure means.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Footer, Header, Static

from xl.tui.screens.base import XLScreen
from xl.tui.widgets.charts import draw

if TYPE_CHECKING:
    from xl.launcher.view.comparison import Comparison

COLOURS = {"a": "cyan", "b": "magenta"}  # run A and run B, in the table's header and the chart
Rows = Sequence[tuple[str, str, str]]


def _cell(text: str, width: int) -> str:
    return text.ljust(width) if len(text) <= width else text[: max(0, width - 1)] + "…"


def table_text(rows: Rows, width: int) -> Text:
    """The side-by-side table fitted to ``width`` cells: a label column, then A's and B's (a value
    too long for its column is cut with "…"); a section's title row in bold."""
    label_w = min(max((len(r[0]) for r in rows), default=0), max(8, width // 4))
    col_w = min(40, max(6, (width - label_w - 4) // 2))
    out = Text(no_wrap=True, overflow="crop")
    out.append(_cell("", label_w) + "  ")
    out.append(_cell("A", col_w), style=f"bold {COLOURS['a']}")
    out.append("  ")
    out.append(_cell("B", col_w).rstrip(), style=f"bold {COLOURS['b']}")
    for label, a, b in rows:
        section = not label.startswith(" ")
        out.append("\n")
        out.append(_cell(label, label_w), style="bold" if section else "")
        out.append("  " + _cell(a, col_w) + "  " + _cell(b, col_w).rstrip())
    return out


Point = tuple[float, float]


def points(series: Mapping[str, Sequence[object]], key: str) -> list[Point]:
    """(step, value) of one run's series, the steps that have a value."""
    return [
        (float(s), float(v))
        for s, v in zip(series.get("steps") or [], series.get(key) or [], strict=False)
        if isinstance(v, (int, float)) and isinstance(s, (int, float))
    ]


class CompareChart(Widget):
    """One chart over steps: both runs' loss in the upper half, both runs' samples/s in the
    lower."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.panes: list[tuple[str, list[tuple[str, str, list[Point]]]]] = []
        self._strips: list[Strip] | None = None

    def show(
        self, series: Mapping[str, Mapping[str, Sequence[object]]], names: Mapping[str, str]
    ) -> None:
        self.panes = [
            (
                title,
                [(names[side], COLOURS[side], points(series[side], key)) for side in ("a", "b")],
            )
            for title, key in (("loss", "loss"), ("samples/s", "samples_per_s"))
        ]
        self._strips = None
        self.refresh()

    def on_resize(self) -> None:
        self._strips = None

    def render_line(self, y: int) -> Strip:
        width, base = self.size.width, self.visual_style.rich_style
        if self._strips is None:
            self._strips = self._draw(width, self.size.height, base)
        return (
            self._strips[y].crop_extend(0, width, base)
            if y < len(self._strips)
            else Strip.blank(width, base)
        )

    def _draw(self, width: int, height: int, base: Style) -> list[Strip]:
        if not self.panes:
            return []
        upper = max(2, (height - 1) // 2)
        out: list[Strip] = []
        for (title, lines), h in zip(self.panes, (upper, max(2, height - 1 - upper)), strict=True):
            drawn = [ln for ln in lines if ln[2]]
            strips = draw(title, drawn, base, width, h + 1)
            out += (
                strips[:h] if len(strips) > h else strips
            )  # the x axis (in seconds) is ours below
        steps = [x for _, lines in self.panes for _, _, pts in lines for x, _ in pts]
        if steps:
            left, right = f"step {min(steps):g}", f"step {max(steps):g}"
            out.append(
                Strip(
                    [
                        Segment(
                            " " + left + " " * max(1, width - len(left) - len(right) - 2) + right,
                            base + Style(dim=True),
                        )
                    ]
                )
            )
        return out


class CompareScreen(XLScreen):
    """``fetch`` makes the comparison (the backend's, in a thread worker)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("r", "refresh", "Again"),
    ]

    class Made(Message):
        def __init__(self, comparison: Comparison | None, error: str | None) -> None:
            super().__init__()
            self.comparison = comparison
            self.error = error

    def __init__(self, run_a: Path, run_b: Path, fetch: Callable[[], Comparison]) -> None:
        super().__init__(id="compare")
        self.run_a, self.run_b = run_a, run_b
        self._fetch = fetch
        self.comparison: Comparison | None = None
        self._rows: list[tuple[str, str, str]] = []

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Static(self._heading(), id="compare-runs")
        with VerticalScroll(id="compare-scroll"):
            yield Static(
                Text(f"Comparing {self.run_a.name} and {self.run_b.name}…"), id="compare-table"
            )
        yield CompareChart(id="compare-chart")
        yield Footer()

    def _heading(self) -> Text:
        out = Text(no_wrap=True, overflow="ellipsis")
        for side, run in (("a", self.run_a), ("b", self.run_b)):
            out.append(f"{side.upper()} ", style=f"bold {COLOURS[side]}")
            out.append(run.name + ("   " if side == "a" else ""))
        return out

    def on_mount(self) -> None:
        self.title = "xl — Compare"
        self._make()

    @work(thread=True, exclusive=True, group="compare")
    def _make(self) -> None:
        try:
            self.post_message(self.Made(self._fetch(), None))
        except Exception as exc:  # shown on the screen: a damaged run is news, not a crash
            self.post_message(self.Made(None, str(exc) or type(exc).__name__))

    def on_compare_screen_made(self, message: Made) -> None:
        table = self.query_one("#compare-table", Static)
        if message.comparison is None:
            table.update(Text(f"Cannot compare: {message.error}", style="bold red"))
            return
        self.comparison = message.comparison
        self._rows = self.backend.comparison_rows(message.comparison)[
            1:
        ]  # the runs are named in the line above
        table.update(table_text(self._rows, max(40, self.size.width - 2)))
        self.query_one(CompareChart).show(message.comparison.series, {"a": "A", "b": "B"})

    def on_resize(self) -> None:
        if self._rows:
            self.query_one("#compare-table", Static).update(
                table_text(self._rows, max(40, self.size.width - 2))
            )

    def action_refresh(self) -> None:
        self._make()

    def action_back(self) -> None:
        self.app.pop_screen()
