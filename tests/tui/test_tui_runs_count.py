"""The Runs screen's summary counts runs as a person reads them: "1 run", "2 runs"."""

from __future__ import annotations

from pathlib import Path

import pytest
from pilotwait import until
from runfixtures import make_run
from textual.widgets import Static

from xl.tui.app import build_app


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [(["healthy"], "1 run, 0 running."), (["healthy", "failed"], "2 runs, 0 running.")],
)
async def test_the_summary_says_run_or_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kinds: list[str], expected: str
) -> None:
    home = tmp_path / "home"
    for i, kind in enumerate(kinds):
        make_run(home / "runs", kind, run_id=f"2026053{i}-{kind}")
    monkeypatch.setenv("XL_HOME", str(home))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    app = build_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("4")

        def summary() -> str:
            return (
                str(app.screen.query_one("#runs-summary", Static).render())
                if app.screen.query("#runs-summary")
                else ""
            )

        await until(pilot, lambda: summary().startswith(expected), f"the summary {expected!r}")
