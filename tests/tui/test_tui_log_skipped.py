"""The Monitor's log view holds a rank's last lines only; when it leaves some of the log out, its
first line says how many, exactly, and the file that has them all. A small log: no such line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import runfixtures
from pilotwait import until
from where import FIXTURES

from xl.tui.app import build_app
from xl.tui.screens.monitor import LOG_TAIL
from xl.tui.widgets.rank_log import MAX_LINES, RankLog
from xl.tui.widgets.rank_table import RankTable

RUNS_FIXTURES = FIXTURES / "runs"
NOW = runfixtures.T0 + 130


@pytest.fixture
def run_dir(tmp_path, monkeypatch) -> Path:
    runs = tmp_path / "xlhome" / "runs"
    shutil.copytree(RUNS_FIXTURES / "20260530-healthy", runs / "20260530-healthy")
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    return runs / "20260530-healthy"


def append_lines(path: Path, start: int, count: int) -> int:
    """``count`` numbered lines of ~70 bytes appended to a rank log; the log's lines now."""
    with open(path, "ab") as fh:
        fh.write(
            b"".join(
                b"[rank 1] step %07d loss 2.2470 lr 0.0003 samples/s 1234.5 ........\n" % i
                for i in range(start, start + count)
            )
        )
    return sum(1 for _ in open(path, "rb"))


def skipped_lines(log: RankLog) -> list[str]:
    return [line for line in log.lines if "skipped" in line]


def starts_with(log: RankLog, text: str) -> bool:
    """The view's first rows are ``text`` (wrapped to its width, as every line is)."""
    rows = log.lines[: len(text)]
    return "".join(rows).startswith(text) and all(
        len(row) <= log.scrollable_content_region.width for row in rows
    )


async def test_a_log_larger_than_the_view_reads_says_how_many_lines_it_skipped_and_where(run_dir):
    big = run_dir / "logs" / "rank-1.log"
    # ~2.8 MB: the view reads its last MiB, shows LOG_TAIL lines
    total = append_lines(big, 0, 40_000)
    app = build_app(monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(200, 60)) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "two ranks")
        log = app.screen.query_one(RankLog)
        # Rank 0's log is small: all of it, and no skipped line.
        await until(pilot, lambda: log.rank == 0 and log.line_count > 0, "rank 0's log")
        assert "[rank 0] step 100" in "\n".join(log.lines)
        assert skipped_lines(log) == []
        await pilot.press("]")
        await until(pilot, lambda: log.rank == 1 and log.line_count > 0, "rank 1's log")
        expected = f"… {total - LOG_TAIL:,} lines skipped: the whole output is in {big}"
        assert starts_with(log, expected) and len(skipped_lines(log)) == 1
        assert log.lines[-1].startswith("[rank 1] step 0039999")
        assert [line for line in log.lines if line.startswith("[rank 1] step ")] == [
            f"[rank 1] step {i:07d} loss 2.2470 lr 0.0003 samples/s 1234.5 ........"
            for i in range(total - 12 - LOG_TAIL, total - 12)
        ]
        # Back to rank 0 (still small, still no line), then to rank 1 after it wrote more:
        # the view starts at its end again, and the count is the new one.
        await pilot.press("[")
        await until(pilot, lambda: log.rank == 0 and log.line_count > 0, "rank 0's log again")
        assert skipped_lines(log) == []
        total = append_lines(big, 40_000, 5_000)
        await pilot.press("]")
        await until(
            pilot, lambda: log.rank == 1 and "step 0044999" in log.lines[-1], "rank 1's new end"
        )
        assert starts_with(
            log, f"… {total - LOG_TAIL:,} lines skipped: the whole output is in {big}"
        )


async def test_lines_more_than_the_view_keeps_while_following_are_counted_as_skipped(run_dir):
    small = run_dir / "logs" / "rank-0.log"
    app = build_app(monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.1)
    async with app.run_test(size=(80, 24)) as pilot:
        log = app.screen.query_one(RankLog)
        await until(pilot, lambda: log.rank == 0 and log.line_count > 0, "rank 0's log")
        assert skipped_lines(log) == []
        shown = log.line_count
        total = append_lines(small, 0, MAX_LINES // 2)  # fits: followed, nothing skipped
        await until(
            pilot,
            lambda: log.lines and f"step {MAX_LINES // 2 - 1:07d}" in log.lines[-1],
            "the new lines",
        )
        assert skipped_lines(log) == [] and log.line_count >= shown + MAX_LINES // 2
        total = append_lines(small, MAX_LINES // 2, MAX_LINES)  # more than it keeps
        await until(
            pilot, lambda: f"step {MAX_LINES * 3 // 2 - 1:07d}" in log.lines[-1], "the newest lines"
        )
        assert starts_with(
            log, f"… {total - MAX_LINES:,} lines skipped: the whole output is in {small}"
        )
        assert len(skipped_lines(log)) == 1
