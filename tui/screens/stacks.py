"""The stacks and collectives of the Monitor's chosen rank, asked live (the Monitor's ``k``).

The document comes from ``fetch`` (the backend's stacks of the whole run: every rank is asked at
once, which may take a few seconds), on a thread worker. Its verdict is the whole run's, whatever
rank is shown; ``[``/``]`` show another rank of the same document, ``r`` asks again, ``escape``
closes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from xl.textsafe import visible

if TYPE_CHECKING:
    from xl.launcher.stacks.model import StacksDoc

Fetch = Callable[[], "StacksDoc"]


def doc_ranks(doc: StacksDoc) -> list[int]:
    """The ranks the document has an entry for, in rank order."""
    return sorted(e.rank for e in doc.ranks if e.rank is not None)


def stacks_text(doc: StacksDoc, rank: int) -> Text:
    """The whole run's verdict, then ``rank``'s collectives and each thread's frames, innermost
    last."""
    out = Text()
    verdict = doc.verdict.message
    if verdict:
        asked = len(doc_ranks(doc))
        out.append(
            f"verdict (all {asked} rank{'s' if asked != 1 else ''}): {verdict}\n\n",
            style="bold yellow",
        )
    entry = next((e for e in doc.ranks if e.rank == rank), None)
    if entry is None:
        out.append(f"rank {rank} is not running here", style="bold")
        return out
    out.append(f"rank {rank}  pid {entry.pid}\n", style="bold")
    if entry.error:
        out.append(f"no stacks: {entry.error}\n", style="red")
        return out
    if entry.note:
        out.append(f"({entry.note})\n", style="dim")
    for c in entry.collectives:
        style = "" if c.done else "bold"
        out.append(f"  {c.pg} #{c.seq} {c.op}: {c.stage}\n", style=style)
    for thread in entry.threads or ():
        # the rank's own names: control characters drawn
        out.append(visible(f"\nthread {thread.name}\n", lines=True), style="bold")
        for f in thread.frames:
            out.append(visible(f"  {f.file}:{f.line} in {f.function}\n", lines=True))
    return out


RANK_KEYS = Binding.Group("Rank", compact=True)


class StacksScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "refresh", "Ask again"),
        Binding("left_square_bracket", "rank(-1)", "Prev rank", group=RANK_KEYS),
        Binding("right_square_bracket", "rank(1)", "Next rank", group=RANK_KEYS),
        Binding("escape,k", "close", "Close"),
        # A dialog takes no key of the app's own: help is this screen's.
        Binding("question_mark,f1", "app.help", "Help"),
    ]

    class Fetched(Message):
        def __init__(self, doc: StacksDoc | None, error: str | None) -> None:
            super().__init__()
            self.doc = doc
            self.error = error

    def __init__(self, rank: int, fetch: Fetch) -> None:
        super().__init__(id="stacks")
        self.rank = rank
        self._fetch = fetch
        self.doc: StacksDoc | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="stacks-scroll"):
            yield Static(self._asking(), id="stacks-text")
        yield Footer()

    def _where(self, *_: object) -> None:
        """Which lines show, in the frame's bottom edge, when not all of them do: the popup has
        no scrollbar (its thumb read as a stray "▇▇" over the text at 80x24)."""
        box = self.query_one("#stacks-scroll", VerticalScroll)
        total, shown = box.virtual_size.height, box.scrollable_content_region.height
        if total <= shown or shown <= 0:
            box.border_subtitle = ""
            return
        top = round(box.scroll_y)
        box.border_subtitle = f"lines {top + 1}-{min(total, top + shown)} of {total} (↑↓ PgUp PgDn)"

    def _asking(self) -> Text:
        return Text(f"Asking every rank where it is (showing rank {self.rank})…")

    def on_mount(self) -> None:
        box = self.query_one("#stacks-scroll", VerticalScroll)
        self.watch(box, "scroll_y", self._where)
        self.watch(box, "virtual_size", self._where)
        self._ask()

    @work(thread=True, exclusive=True, group="stacks")
    def _ask(self) -> None:
        try:
            self.post_message(self.Fetched(self._fetch(), None))
        except Exception as exc:  # shown on the screen: the person can ask again
            self.post_message(self.Fetched(None, f"{type(exc).__name__}: {exc}"))

    def on_stacks_screen_fetched(self, message: Fetched) -> None:
        body = self.query_one("#stacks-text", Static)
        self.doc = message.doc
        if message.doc is None:
            body.update(Text(f"Could not ask the ranks: {message.error}", style="bold red"))
        else:
            body.update(stacks_text(message.doc, self.rank))

    def action_rank(self, delta: int) -> None:
        ranks = doc_ranks(self.doc) if self.doc is not None else []
        if not ranks or self.doc is None:
            return
        at = ranks.index(self.rank) if self.rank in ranks else -delta
        self.rank = ranks[(at + delta) % len(ranks)]
        self.query_one("#stacks-text", Static).update(stacks_text(self.doc, self.rank))

    def action_refresh(self) -> None:
        self.query_one("#stacks-text", Static).update(self._asking())
        self._ask()

    def action_close(self) -> None:
        self.dismiss(None)
