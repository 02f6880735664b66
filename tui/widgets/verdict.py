"""The Monitor's hang banner: who the other ranks wait for, from the hang the RunView says is in
force.

The supervisor writes one ``hang`` event when a stall is diagnosed (with the stacks it captured);
whether it is still in force is the model's one rule (xl.launcher.view.runview.HangRule). The
banner shows its verdict and says which key opens the chosen rank's stacks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import Static

from xl.textsafe import visible

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xl.launcher.view.runview import Hang, RankView

# Where a straggler loses its time (its event's ``phase``), in the colour of its letter in the
# rank table's step bar (rank_cells.PHASES).
PHASE_STYLE = {
    "data": "black on yellow",
    "compute": "black on green",
    "comm": "black on magenta",
    "other": "black on bright_black",
}


def verdict_text(hang: Hang | None, key: str = "k") -> Text | None:
    """The banner's text for the hang in force, or None when there is none."""
    if hang is None:
        return None
    text = Text(f"{hang.label}: ", style="bold yellow")
    text.append(visible(hang.message))  # names the rank's own functions
    text.append(f"  ({key}: the chosen rank's stacks; `xl stacks` for every rank)", style="dim")
    return text


class VerdictBanner(Static):
    """Hidden while no hang is in force; ``show(view.hang)`` after each poll."""

    def on_mount(self) -> None:
        self.display = False

    def show(self, hang: Hang | None) -> None:
        text = verdict_text(hang)
        self.display = text is not None
        if text is not None:
            self.update(text)


def straggler_text(ranks: Iterable[RankView]) -> Text | None:
    """One line per straggler in force: its phase, then what its event said; None when none."""
    out = Text()
    for rv in sorted(
        (rv for rv in ranks if rv.state == "straggler" and rv.diagnosis), key=lambda rv: rv.rank
    ):
        if out:
            out.append("\n")
        out.append("straggler", style="bold yellow")
        phase = getattr(rv, "straggler_phase", None)
        if phase in PHASE_STYLE:
            out.append(" ")
            out.append(f" {phase} ", style=PHASE_STYLE[phase])
        out.append(": ")
        out.append(visible(str(rv.diagnosis)))
    return out or None
