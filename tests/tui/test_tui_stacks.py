"""The Monitor's hang banner and the chosen rank's stacks screen, fed a stacks document."""

from __future__ import annotations

from typing import Any

from textual.app import App, ComposeResult
from textual.widgets import Static

from xl.launcher.rundir.events import parse_event
from xl.launcher.stacks.model import StacksDoc
from xl.launcher.view.runview import Hang, HangRule
from xl.tui.screens.stacks import StacksScreen
from xl.tui.widgets.verdict import VerdictBanner, verdict_text

DOC: dict[str, Any] = {
    "run_id": "r",
    "t": 1.0,
    "ranks": [
        {
            "rank": 0,
            "node": 0,
            "pid": 10,
            "threads": [
                {
                    "name": "MainThread",
                    "frames": [{"file": "/x/train.py", "line": 41, "function": "main"}],
                }
            ],
            "collectives": [
                {"pg": "default_pg", "seq": 12, "op": "all_reduce", "state": "scheduled"}
            ],
        },
        {
            "rank": 1,
            "node": 0,
            "pid": 11,
            "threads": [
                {
                    "name": "MainThread",
                    "frames": [{"file": "/x/data.py", "line": 30, "function": "load"}],
                }
            ],
            "collectives": [
                {"pg": "default_pg", "seq": 11, "op": "all_reduce", "state": "completed"}
            ],
        },
    ],
    "verdict": {
        "ranks": [1],
        "message": "rank 1 never entered all_reduce #12: it is in load at data.py:30",
    },
}
HANG = {
    "t": 5.0,
    "kind": "hang",
    "rank": 1,
    "ranks": [1],
    "message": DOC["verdict"]["message"],
    "stacks": "stacks/1.json",
}


def _hang(*events: dict[str, Any]) -> Hang | None:
    rule = HangRule()
    for event in events:
        read = parse_event(event)
        assert read is not None
        rule.see(read)
    return rule.hang


def test_the_banner_shows_the_verdict_until_the_culprit_moves() -> None:
    """Whether the hang is over is the model's (tests/launcher/rundir/test_runview.py); the
    banner draws the hang in force."""
    assert verdict_text(None) is None
    shown = verdict_text(_hang(HANG))
    assert shown is not None and "rank 1 never entered all_reduce #12" in shown.plain
    assert shown.plain.startswith("hang: ")
    # A culprit that was working on the CPU (an evaluation, or an endless loop): a stall, said so.
    working = verdict_text(_hang({**HANG, "busy": [1]}))
    assert working is not None and working.plain.startswith("stalled: rank 1 never entered")
    # a victim moving
    assert verdict_text(_hang(HANG, {"kind": "recovered", "of": "stalled", "rank": 0})) is not None
    assert verdict_text(_hang(HANG, {"kind": "recovered", "of": "stalled", "rank": 1})) is None


class _Host(App[None]):
    def compose(self) -> ComposeResult:
        yield VerdictBanner(id="verdict")


async def test_the_stacks_screen_shows_the_chosen_rank_and_asks_again() -> None:
    asked: list[int] = []

    def fetch() -> StacksDoc:
        asked.append(1)
        return StacksDoc.from_json(DOC)

    app = _Host()
    async with app.run_test(size=(120, 40)) as pilot:
        banner = app.query_one(VerdictBanner)
        assert not banner.display
        banner.show(_hang(HANG))
        assert banner.display
        await app.push_screen(StacksScreen(1, fetch))
        await app.workers.wait_for_complete()
        await pilot.pause()
        text = str(app.screen.query_one("#stacks-text", Static).render())
        assert (
            "rank 1  pid 11" in text
            and "/x/data.py:30 in load" in text
            and "default_pg #11 all_reduce: completed" in text
        )
        assert "/x/train.py" not in text  # only the chosen rank
        await pilot.press("r")
        await app.workers.wait_for_complete()
        assert len(asked) == 2
        await pilot.press("escape")
        assert not isinstance(app.screen, StacksScreen)
