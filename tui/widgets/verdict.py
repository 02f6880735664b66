"""The Monitor's hang banner: who the other ranks wait for, from the run's latest ``hang`` event.

The supervisor writes one ``hang`` event when a stall is diagnosed (with the stacks it captured);
the banner shows its verdict until the culprit moves again or the run ends, and says which key
opens the chosen rank's stacks.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from xl.textsafe import visible


def verdict_text(events: list[dict[str, Any]], final: bool = False, key: str = "k") -> Text | None:
    """The banner's text for a run's events, or None when no hang is in force."""
    if final:
        return None
    at = next((i for i in range(len(events) - 1, -1, -1) if events[i].get("kind") == "hang"), None)
    if at is None:
        return None
    hang = events[at]
    culprits = set(hang.get("ranks") or [])
    for ev in events[at + 1 :]:
        if ev.get("kind") == "recovered" and ev.get("of") == "stalled" and (not culprits or ev.get("rank") in culprits):
            return None  # the rank everyone waited for moved again: the hang is over
    text = Text("hang: ", style="bold yellow")
    text.append(visible(str(hang.get("message") or "")))  # names the rank's own functions
    text.append(f"  ({key}: the chosen rank's stacks; `xl stacks` for every rank)", style="dim")
    return text


class VerdictBanner(Static):
    """Hidden while no hang is in force; ``show(events, final)`` after each poll."""

    def on_mount(self) -> None:
        self.display = False

    def show(self, events: list[dict[str, Any]], final: bool = False) -> None:
        text = verdict_text(events, final)
        self.display = text is not None
        if text is not None:
            self.update(text)
