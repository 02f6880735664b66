"""The plain view past 64 ranks (docs/launch.md, "Big runs in the plain view"): a row per node
(or group of nodes), the slowest ranks, the slow ones named, every rank not running; a run of 64
ranks or fewer keeps its row per rank. The views' own entry (``watch_plain``) on run dirs whose
lines carry the ground truth (bigrun.step_time)."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

from bigrun import make_big_run, step_time
from rich.console import Console

from xl.launcher.cli import console, endtable
from xl.launcher.cli.console_summary import render_summary
from xl.launcher.cli.consolerun import ConsoleRun


def end_view(run_dir: Path) -> str:
    out = io.StringIO()
    console.watch_plain(ConsoleRun(run_dir), out, lines=False)
    return out.getvalue()


def rank_rows(text: str) -> list[str]:
    """The per-rank table's rows: '| 12 | exited ...'."""
    return re.findall(r"^\|\s+(\d+) \|", text, flags=re.M)


def test_a_big_failed_run_ends_with_nodes_the_slow_rank_and_every_rank_not_running(
    tmp_path: Path,
) -> None:
    run = make_big_run(
        tmp_path,
        4096,
        t0=time.time() - 30,
        seconds=3,
        failed=[9, 1234],
        slow=[77],
        status="failed",
    )
    text = end_view(run)
    assert not rank_rows(text)  # no row per rank
    lines = text.splitlines()
    assert len(lines) < 90, text  # 512 nodes in at most 64 rows of 8
    assert "4096 ranks on 512 nodes" in text
    rows = [ln.split() for ln in lines if re.match(r"^\s*\d+-\d+\s+8 hosts", ln)]
    assert len(rows) == 64 and rows[0][0] == "0-7" and rows[-1][0] == "504-511"
    # Rank 77 (node 9, the row of nodes 8-15) is the slow one: its row's max, named slow with
    # where its time goes; nobody else is.
    [row] = [r for r in rows if r[0] == "8-15"]
    assert "2.000" in row
    slow = [ln for ln in lines if ln.startswith("slow:")]
    assert slow == ["slow: rank 77 2.000 s (3.9x the median; compute 1.800 s)"]
    assert "slowest steps: rank 77 2.000 s" in text
    # Every rank not running, by state and exit code: rank 9 failed first; the others ended
    # after it (the run's end stopped them; rank 1234 exited 1 of its own meanwhile).
    assert "  failed (1): rank 9 (exit 1)" in lines
    assert "  stopped (4095): ranks 0-8,10-1233,1235-4095 (exit -15); rank 1234 (exit 1)" in lines
    assert "rank 9 failed first" in text  # the run's own summary line still ends it


def test_a_healthy_even_big_run_names_no_rank_slow(tmp_path: Path) -> None:
    run = make_big_run(tmp_path, 200, t0=time.time() - 30, seconds=3, status="succeeded")
    text = end_view(run)
    assert not rank_rows(text)
    assert "slow:" not in text and "not running" not in text
    times = [step_time(r) for r in range(200)]
    slowest = max(range(200), key=lambda r: (times[r], -r))
    assert f"slowest steps: rank {slowest} {times[slowest]:.3f} s" in text  # a plain list
    node_rows = [ln.split() for ln in text.splitlines() if re.match(r"^\s*\d+\s+node\d+ ", ln)]
    assert [r[0] for r in node_rows] == [str(n) for n in range(25)]  # a row per node
    assert all(r[2] == "8" and r[3] == "8" for r in node_rows)
    assert "run 20261128-big-200 succeeded" in text


def test_64_ranks_keep_a_row_each_and_65_are_summarised(tmp_path: Path) -> None:
    small = make_big_run(tmp_path / "a", 64, t0=time.time() - 30, seconds=2, status="succeeded")
    text = end_view(small)
    assert rank_rows(text) == [str(r) for r in range(64)]
    assert "where the step time went" in text  # the per-rank split table, as ever
    big = make_big_run(tmp_path / "b", 65, t0=time.time() - 30, seconds=2, status="succeeded")
    text = end_view(big)
    assert not rank_rows(text) and "65 ranks on 9 nodes" in text


def test_the_live_view_draws_the_summary_past_64_ranks(tmp_path: Path) -> None:
    run = make_big_run(tmp_path, 300, t0=time.time() - 30, seconds=2, failed=[5])
    watched = ConsoleRun(run)
    watched.poll()
    shown = Console(width=140, record=True, file=io.StringIO())
    shown.print(console.render(watched, width=140))
    text = shown.export_text()
    assert text.rstrip("\n").startswith(render_summary(watched.ranks, endtable.title(watched))[:40])
    assert "failed (1): rank 5 (exit 1)" in text
    assert len(text.splitlines()) < 60


def test_ranks_starting_and_ending_together_are_one_line_past_64_ranks(tmp_path: Path) -> None:
    big = make_big_run(tmp_path / "b", 4096, t0=time.time() - 30, seconds=2, status="succeeded")
    text = end_view(big)
    assert len(re.findall(r"xl: ranks 0-4095 started \(4096\)$", text, flags=re.M)) == 1
    assert len(re.findall(r"xl: ranks 0-4095 exited with code 0 \(4096\)$", text, flags=re.M)) == 1
    assert not re.search(r"xl: rank \d+ (started|exited)", text)
    assert len(text.splitlines()) < 90
    failed = make_big_run(
        tmp_path / "f", 100, t0=time.time() - 30, seconds=2, failed=[7], status="failed"
    )
    text = end_view(failed)
    assert "xl: ranks 0-99 started (100)" in text
    assert "xl: rank 7 exited with code 1" in text  # news: a line of its own, as ever
    small = make_big_run(tmp_path / "s", 64, t0=time.time() - 30, seconds=2, status="succeeded")
    text = end_view(small)
    assert len(re.findall(r"xl: rank \d+ started$", text, flags=re.M)) == 64
    assert len(re.findall(r"xl: rank \d+ exited with code 0$", text, flags=re.M)) == 64


def _add_events(run_dir: Path, events: list[dict]) -> None:
    with (run_dir / "events.jsonl").open("a", encoding="utf-8") as fh:
        fh.writelines(json.dumps(ev) + "\n" for ev in events)


def _live_summary(run_dir: Path) -> list[str]:
    watched = ConsoleRun(run_dir)
    watched.poll()
    return render_summary(watched.ranks, endtable.title(watched)).splitlines()


def test_a_hang_names_its_culprit_first_and_its_waiting_ranks_as_ranges(tmp_path: Path) -> None:
    t0 = time.time() - 120
    run = make_big_run(tmp_path, 128, t0=t0, seconds=2)
    culprit = "rank 100 has not stepped for 95 s; the others wait for it in all_reduce #12"
    _add_events(
        run,
        [
            {
                "t": t0 + 100,
                "kind": "stalled",
                "rank": r,
                "message": f"rank {r} waits for 100",
                "waiting_on": [100],
            }
            for r in range(128)
            if r != 100
        ]
        + [{"t": t0 + 100, "kind": "stalled", "rank": 100, "message": culprit}],
    )
    lines = _live_summary(run)
    at = lines.index("not running:")
    assert lines[at + 1 : at + 4] == [
        "  stalled (1): rank 100",
        "  waiting (127): ranks 0-99,101-127",
        f"  rank 100: xl: {culprit}",
    ]
    assert sum(1 for ln in lines if re.match(r"  rank \d+: xl:", ln)) == 8  # the first 8 said
    assert not [ln for ln in lines if ln.startswith("slow:")]


def test_a_diagnosed_straggler_is_slow_and_still_running(tmp_path: Path) -> None:
    t0 = time.time() - 120
    run = make_big_run(tmp_path, 128, t0=t0, seconds=2, slow=[5])
    said = "rank 5 is 3.9x slower than the median (its time goes to compute)"
    _add_events(
        run,
        [{"t": t0 + 60, "kind": "straggler", "rank": 5, "message": said, "phase": "compute"}],
    )
    lines = _live_summary(run)
    assert [ln for ln in lines if ln.startswith("slow:")] == [
        f"slow: rank 5 2.000 s (3.9x the median; compute 1.800 s)  xl: {said}"
    ]
    assert "not running:" not in lines
    assert lines[1] == "ranks: 127 running, 1 straggler"
    [node0] = [ln.split() for ln in lines if re.match(r"^\s*0\s+node0 ", ln)]
    assert node0[3] == "8"  # a straggler is running: ok
