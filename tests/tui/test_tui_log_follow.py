"""The Monitor's log pane shows the newest line of the chosen rank's log however long the log
already is when it opens, and as lines come, while its title says "(following)"; a person who
scrolled back stays where they are (the title says so) until they scroll to the end or press `f`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import runfixtures
from pilotwait import until
from where import FIXTURES

from xl.tui.app import build_app
from xl.tui.widgets.rank_log import MAX_LINES, RankLog

NOW = runfixtures.T0 + 130


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    runs = tmp_path / "xlhome" / "runs"
    shutil.copytree(FIXTURES / "runs" / "20260530-healthy", runs / "20260530-healthy")
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    return runs / "20260530-healthy"


def write_steps(run_dir: Path, start: int, count: int) -> str:
    """``count`` numbered lines appended to rank 0's log; the last one."""
    lines = [f"[rank 0] step {i:06d} loss 2.2470" for i in range(start, start + count)]
    with open(run_dir / "logs" / "rank-0.log", "a") as fh:
        fh.write("".join(line + "\n" for line in lines))
    return lines[-1]


def on_screen(log: RankLog) -> list[str]:
    """The log's rows as the screen draws them now."""
    return [
        "".join(s.text for s in log.render_line(y)).rstrip()
        for y in range(log.scrollable_content_region.height)
    ]


def title(app) -> str:
    return str(app.screen.query_one("#log-title").render())


def shows(log: RankLog, line: str) -> bool:
    return line in on_screen(log)


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
async def test_a_log_already_long_when_the_monitor_opens_shows_its_newest_line(run_dir, size):
    last = write_steps(run_dir, 0, 3000)
    app = build_app(monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=size) as pilot:
        log = app.screen.query_one(RankLog)
        await until(pilot, lambda: log.rank == 0 and shows(log, last), f"{last!r} on screen")
        assert "(following)" in title(app)
        for start in (3000, 3050):  # and it goes on following
            last = write_steps(run_dir, start, 50)
            await until(pilot, lambda last=last: shows(log, last), f"{last!r} on screen")
        assert "(following)" in title(app)


async def test_a_short_log_follows_as_lines_come(run_dir):
    app = build_app(monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        log = app.screen.query_one(RankLog)
        await until(pilot, lambda: log.rank == 0 and log.line_count > 0, "rank 0's log")
        for start in range(0, 9, 3):  # the view fills, then scrolls
            last = write_steps(run_dir, start, 3)
            await until(pilot, lambda last=last: shows(log, last), f"{last!r} on screen")
        assert "(following)" in title(app)


async def test_a_person_who_scrolled_back_stays_there_until_the_end_or_f(run_dir):
    write_steps(run_dir, 0, 600)
    app = build_app(monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        log = app.screen.query_one(RankLog)
        await until(pilot, lambda: shows(log, "[rank 0] step 000599 loss 2.2470"), "the end")
        log.focus()
        await pilot.press("pageup", "pageup")
        await until(pilot, lambda: "scrolled back: f follows" in title(app), "the title says so")
        read = on_screen(log)
        assert "[rank 0] step 000599 loss 2.2470" not in read
        last = write_steps(run_dir, 600, 40)
        await until(pilot, lambda: log.lines[-1] == last, "the new lines read")
        await pilot.pause(0.5)
        assert on_screen(log) == read  # not pulled to the bottom
        await pilot.press("f")
        await until(pilot, lambda: shows(log, last), "`f`: the newest line")
        await until(pilot, lambda: "(following)" in title(app), "the title says following")
        last = write_steps(run_dir, 640, 40)
        await until(pilot, lambda: shows(log, last), "following again")
        # Back once more, then down to the end by hand: following again, no key needed.
        await pilot.press("pageup")
        await until(pilot, lambda: "scrolled back" in title(app), "scrolled back again")
        await pilot.press("end")
        await until(pilot, lambda: "(following)" in title(app), "at the end: following")
        last = write_steps(run_dir, 680, 40)
        await until(pilot, lambda: shows(log, last), "following after scrolling to the end")


async def test_a_person_reading_back_keeps_their_lines_when_the_oldest_are_dropped(run_dir):
    """Past MAX_LINES the view drops its oldest lines as new ones come (and draws again): a
    person reading back still sees the lines they were reading, not the top or the end."""
    app = build_app(monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        log = app.screen.query_one(RankLog)
        await until(pilot, lambda: log.rank == 0 and log.line_count > 0, "rank 0's log")
        last = write_steps(run_dir, 0, MAX_LINES)
        await until(pilot, lambda: shows(log, last), "the view full")
        log.focus()
        await pilot.press("pageup", "pageup")
        await until(pilot, lambda: "scrolled back" in title(app), "scrolled back")
        read = on_screen(log)
        skipped = log.skipped
        last = write_steps(run_dir, MAX_LINES, 100)
        await until(pilot, lambda: log.lines[-1] == last and log.skipped > skipped, "lines dropped")
        await pilot.pause(0.5)
        assert on_screen(log) == read and "scrolled back" in title(app)
