"""Runs and Monitor screens fed recorded run directories (tests/fixtures/runs, runfixtures.py)."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
import runfixtures
from pilotwait import until
from textual.widgets import DataTable, Static
from textual.widgets._footer import FooterKey
from where import FIXTURES

from xl.launcher.view.reader import RunReader
from xl.tui import fmt
from xl.tui.app import build_app, exit_code
from xl.tui.backend import LocalBackend
from xl.tui.screens.monitor import MonitorScreen
from xl.tui.widgets.rank_log import RankLog
from xl.tui.widgets.rank_table import RankTable
from xl.tui.widgets.text_lines import TextLines

RUNS_FIXTURES = FIXTURES / "runs"
SIZE = (120, 40)
NOW = runfixtures.T0 + 130  # a fixed "now": stable elapsed and last-seen values


def text_of(app, selector: str) -> str:
    widget = app.screen.query_one(selector)
    return widget.text.plain if isinstance(widget, TextLines) else str(widget.render())


@pytest.fixture
def xl_home(tmp_path, monkeypatch) -> Path:
    runs = tmp_path / "xlhome" / "runs"
    shutil.copytree(RUNS_FIXTURES, runs)
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    return runs


def cell(table: DataTable | RankTable, row: str, col: str) -> str:
    if isinstance(table, RankTable):
        return str(table.cell(int(row), col))
    return str(table.get_cell(row, col))


async def test_runs_lists_runs_and_opens_one_in_the_monitor(xl_home):
    app = build_app(clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await until(pilot, lambda: app.screen.id == "runs", "runs screen")
        table = app.screen.query_one("#runs-table", DataTable)
        await until(pilot, lambda: table.row_count == 5, "5 runs listed")
        assert cell(table, "20260530-failed", "status") == "failed"
        assert cell(table, "20260530-healthy", "status") == "succeeded"
        # run.json says running, but no supervisor is alive: the list says so.
        assert cell(table, "20260530-straggler", "status") == "orphaned"
        assert cell(table, "20260530-wide", "world") == "64"
        assert cell(table, "20260530-healthy", "dur") == "1m42s"
        assert cell(table, "20260530-failed", "name") == "llama-oom"
        table.move_cursor(row=table.get_row_index("20260530-failed"))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "monitor opened")
        assert app.screen.run_dir == xl_home / "20260530-failed"
        await until(pilot, lambda: "llama-oom" in text_of(app, "#run-header"), "header of the run")
        await pilot.press("escape")
        await until(pilot, lambda: app.screen.id == "runs", "back to runs")


async def test_monitor_healthy_run(xl_home):
    app = build_app(
        monitor_run_dir=xl_home / "20260530-healthy", clock=lambda: NOW, poll_interval=0.2
    )
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        table = screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "two ranks")
        header = text_of(app, "#run-header")
        assert "bert-finetune" in header and "succeeded" in header
        assert "world size 2" in header and "elapsed 1m42s" in header
        assert "devices GPU 1,0" in header  # in the chosen order (at 120 columns, not the model)
        assert cell(table, "0", "step") == "100/100"
        assert cell(table, "1", "gpu") == "0"
        assert cell(table, "0", "state") == "exited"
        assert not screen.query_one("#failure-banner").display
        assert "100%  step 100/100" in text_of(app, "#progress")
        # The log follows the highlighted rank; ] switches rank.
        log = screen.query_one(RankLog)
        await until(pilot, lambda: log.rank == 0 and log.line_count > 0, "rank 0 log")
        assert "[rank 0] step 100" in "\n".join(log.lines)
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: log.rank == 1, "rank 1 log")
        assert all("[rank 1]" in line for line in log.lines if line)
        # Charts toggle.
        assert screen.query_one("#charts").display
        await pilot.press("c")
        assert not screen.query_one("#charts").display
        # Nothing to stop in a finished run; q leaves with 0.
        await pilot.press("s")
        assert isinstance(app.screen, MonitorScreen)
        await pilot.press("q")
    assert app.return_code == 0


async def test_monitor_straggler_run_names_the_slow_rank(xl_home):
    app = build_app(
        monitor_run_dir=xl_home / "20260530-straggler", clock=lambda: NOW, poll_interval=0.2
    )
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "two ranks")
        await until(pilot, lambda: cell(table, "1", "state") == "straggler", "rank 1 straggler")
        assert cell(table, "0", "state") != "straggler"
        assert int(cell(table, "0", "step").split("/")[0]) > int(
            cell(table, "1", "step").split("/")[0]
        )
        # The state reads in its colour (the row is drawn from segments, not a DataTable).
        row = table.render_line(1 + table.column("rank").index("1"))
        straggler = [seg for seg in row if "straggler" in seg.text]
        assert straggler and straggler[0].style.color.name == "yellow", row
        progress = app.screen.query_one("#progress")
        assert progress.display
        # The slowest rank's step is the run's: rank 1 at 37 of 100, its ETA from its rate.
        assert re.search(r"█+\S?\s+37%  step 37/100  ETA \d", progress.text.plain)


async def test_monitor_failed_run_shows_root_cause_and_traceback(xl_home):
    app = build_app(
        monitor_run_dir=xl_home / "20260530-failed", clock=lambda: NOW, poll_interval=0.2
    )
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "two ranks")
        banner = app.screen.query_one("#failure-banner", Static)
        await until(pilot, lambda: banner.display, "failure banner")
        text = str(banner.render())
        assert "rank 1 failed first" in text
        assert "torch.OutOfMemoryError: CUDA out of memory" in text
        assert cell(table, "1", "state") == "failed"
        await pilot.press("q")
    # `xl attach` of a failed run exits 1, as the plain view does.
    assert exit_code(app) == 1


async def test_monitor_handles_64_ranks(xl_home):
    app = build_app(monitor_run_dir=xl_home / "20260530-wide", clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 64, "64 ranks")
        assert cell(table, "63", "node") == "node7"
        await pilot.press("left_square_bracket")  # wraps to the last rank
        log = app.screen.query_one(RankLog)
        await until(pilot, lambda: log.rank == 63, "rank 63 log")


def _shown_ranks(table: RankTable) -> list[int]:
    """The ranks whose rows are on screen now, top to bottom, read from the drawn lines."""
    lines = [
        "".join(s.text for s in table.render_line(y))
        for y in range(1, table.scrollable_content_region.height)
    ]
    col = table.column_keys.index("rank")
    return [int(line.split()[col]) for line in lines if line.strip()]


async def test_rank_table_keys_and_mouse_keep_the_chosen_rank_on_screen(xl_home):
    """64 ranks in a table that shows about 14: the keys move the chosen rank, the table scrolls
    to keep it in view, the header stays, a click picks the rank under the mouse; the log
    follows."""
    app = build_app(monitor_run_dir=xl_home / "20260530-wide", clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(100, 36)) as pilot:
        table = app.screen.query_one(RankTable)
        log = app.screen.query_one(RankLog)
        await until(
            pilot, lambda: table.row_count == 64 and len(_shown_ranks(table)) > 5, "64 ranks shown"
        )
        table.focus()
        assert _shown_ranks(table)[0] == 0
        await pilot.press("end")
        await until(pilot, lambda: log.rank == 63, "rank 63 log")
        assert _shown_ranks(table)[-1] == 63
        assert "Rank" in "".join(s.text for s in table.render_line(0))  # the header stays on top
        await pilot.press("home", "down", "down", "pagedown")
        page = table.scrollable_content_region.height - 1  # rows on screen, less the header
        await until(pilot, lambda: table.current_rank == 2 + page, f"rank {2 + page}")
        assert 2 + page in _shown_ranks(table)
        # Scrolled down: a click on the fourth row (line 0 is the header) picks its rank.
        shown = _shown_ranks(table)
        assert shown[0] > 0
        await pilot.click(RankTable, offset=(10, 4))
        await until(pilot, lambda: log.rank == shown[3], f"rank {shown[3]} log after the click")
        assert table.current_rank == shown[3]
        await pilot.press("home")
        assert _shown_ranks(table)[0] == 0


def _set_status(run_dir: Path, status: str) -> None:
    run = json.loads((run_dir / "run.json").read_text())
    run["status"] = status
    (run_dir / "run.json").write_text(json.dumps(run))


@pytest.mark.parametrize(
    ("run", "status", "key", "code"),
    [
        ("20260530-healthy", None, "q", 0),  # succeeded
        ("20260530-failed", None, "q", 1),  # failed
        ("20260530-healthy", "stopped", "q", 1),  # stopped from the monitor or `xl stop`
        ("20260530-straggler", None, "d", 0),  # detached from a run still going
        ("20260530-straggler", None, "q", 0),  # q on a running run detaches too
    ],
)
@pytest.mark.parametrize("attach_only", [True, False], ids=["attach", "launch"])
async def test_monitor_exit_code_is_the_runs_outcome(
    xl_home, capsys, run, status, key, code, attach_only
):
    """`xl attach` / `xl launch` / `xl demo` through the monitor exit like the plain view:
    0 succeeded, 1 failed or stopped, 0 when the person detaches from a run still going."""
    run_dir = xl_home / run
    if status:
        _set_status(run_dir, status)
    app = build_app(
        monitor_run_dir=run_dir, attach_only=attach_only, clock=lambda: NOW, poll_interval=0.2
    )
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "monitor")
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "two ranks")
        await pilot.press(key)
        await until(pilot, lambda: not app.is_running, "the app ended")
    assert exit_code(app) == code
    if run == "20260530-straggler":
        assert "keeps running" in capsys.readouterr().err  # the detach message names the way back


async def test_launch_exit_code_when_left_from_another_screen(xl_home):
    """`xl launch`: leaving the monitor for the other screens and quitting there still exits
    with the launched run's outcome (read from run.json), not with whatever screen was last."""
    app = build_app(
        monitor_run_dir=xl_home / "20260530-failed",
        attach_only=False,
        clock=lambda: NOW,
        poll_interval=0.2,
    )
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "monitor")
        await pilot.press("escape")
        await until(pilot, lambda: app.screen.id == "gpus", "back on the GPUs screen")
        await pilot.press("4")
        await until(pilot, lambda: app.screen.id == "runs", "runs screen")
        runs = app.screen.query_one("#runs-table", DataTable)
        await until(pilot, lambda: runs.row_count == 5, "5 runs listed")
        # Another run opened and left with q does not decide the exit code.
        runs.move_cursor(row=runs.get_row_index("20260530-healthy"))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "the other run's monitor")
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the app ended")
    assert exit_code(app) == 1


def _column(table: RankTable, col: str) -> list[str]:
    return [str(value) for value in table.column(col)]


async def test_monitor_groups_ranks_by_node(xl_home):
    """Two nodes: node first, rows by node (in rank order, not name order) then rank, each
    node's first row naming it; the header says how many nodes. One node: as before."""
    app = build_app(
        monitor_run_dir=xl_home / "20260530-twonode", clock=lambda: NOW, poll_interval=0.2
    )
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 8, "eight ranks")
        assert table.grouped
        assert table.column_keys[:2] == ["node", "rank"]
        # trn-b12 holds ranks 0-3: it comes first although "trn-a07" sorts before it.
        assert _column(table, "node") == ["trn-b12"] * 4 + ["trn-a07"] * 4
        assert _column(table, "rank") == [str(r) for r in range(8)]
        firsts = [r for r, node in enumerate(table.column("node")) if "bold" in str(node.style)]
        assert firsts == [0, 4]  # one label per node block
        assert "world size 8 on 2 nodes" in text_of(app, "#run-header")
        await until(
            pilot, lambda: cell(table, "5", "state") == "straggler", "the straggler on node 2"
        )

    app = build_app(
        monitor_run_dir=xl_home / "20260530-straggler", clock=lambda: NOW, poll_interval=0.2
    )
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "two ranks")
        assert not table.grouped
        assert table.column_keys[0] == "rank"
        assert "nodes" not in text_of(app, "#run-header")


async def test_monitor_tells_apart_two_nodes_on_one_host(xl_home):
    """Two xl nodes started on one machine (as docs/multinode.md's try-it-on-one-machine does):
    run.json names the same host for all ranks, and only the node rank differs. They are two
    groups."""
    run_dir = xl_home / "20260530-twonode"
    run = json.loads((run_dir / "run.json").read_text())
    for info in run["ranks"]:
        info["node_rank"] = 0 if info["node"] == "trn-b12" else 1
        info["node"] = "box"
    (run_dir / "run.json").write_text(json.dumps(run))
    app = build_app(monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 8 and table.grouped, "grouped by node")
        assert _column(table, "node") == ["box #0"] * 4 + ["box #1"] * 4
        assert _column(table, "rank") == [str(r) for r in range(8)]
        assert "world size 8 on 2 nodes" in text_of(app, "#run-header")


async def test_monitor_regroups_when_the_second_nodes_ranks_arrive(xl_home):
    """Node 1's ranks reach node 0's run dir later than node 0's own: the table starts as one
    node's, then groups, keeping the rank the person was looking at."""
    run_dir = xl_home / "20260530-twonode"
    run = json.loads((run_dir / "run.json").read_text())
    full = run["ranks"]
    run["ranks"] = full[:4]
    (run_dir / "run.json").write_text(json.dumps(run))
    # Only node 0's ranks have logged so far.
    later = {}
    for name in ("metrics.jsonl", "events.jsonl"):
        lines = (run_dir / name).read_text().splitlines()
        later[name] = "".join(ln + "\n" for ln in lines if (json.loads(ln)["rank"] or 0) >= 4)
        (run_dir / name).write_text(
            "".join(ln + "\n" for ln in lines if (json.loads(ln)["rank"] or 0) < 4)
        )
    app = build_app(monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 4, "node 0's four ranks")
        assert not table.grouped
        await pilot.press("right_square_bracket", "right_square_bracket")
        await until(pilot, lambda: table.current_rank == 2, "rank 2 chosen")
        run["ranks"] = [full[4], full[6], *full[:4], full[5], full[7]]  # as they arrived
        (run_dir / "run.json").write_text(json.dumps(run))
        for name, text in later.items():
            with (run_dir / name).open("a") as fh:
                fh.write(text)
        await until(pilot, lambda: table.row_count == 8 and table.grouped, "grouped by node")
        assert _column(table, "rank") == [str(r) for r in range(8)]
        assert _column(table, "node") == ["trn-b12"] * 4 + ["trn-a07"] * 4
        assert table.current_rank == 2
        assert app.screen.query_one(RankLog).rank == 2


async def test_monitor_polls_once_per_interval_however_often_the_rank_changes(xl_home):
    """Switching rank reads the new rank's log at once, but must not start another poll loop:
    each switch used to add one, so after a few switches the Monitor read the run many times a
    second (CPU a person would notice on a big run)."""
    interval = 0.2
    app = build_app(
        monitor_run_dir=xl_home / "20260530-straggler", clock=lambda: NOW, poll_interval=interval
    )
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        table = screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "two ranks")
        log = screen.query_one(RankLog)
        for _ in range(3):
            for key, rank in (("right_square_bracket", 1), ("left_square_bracket", 0)):
                await pilot.press(key)
                await until(pilot, lambda rank=rank: log.rank == rank, f"rank {rank} log")
        start, t0 = screen.polls, time.monotonic()
        await pilot.pause(2.0)
        rate = (screen.polls - start) / (time.monotonic() - t0)
        assert rate <= 1.5 / interval, f"{rate:.1f} polls/s with a {interval}s interval"


async def test_runs_list_refreshes_once_per_interval_however_often_r_is_pressed(xl_home):
    listings: list[float] = []

    class Counted(LocalBackend):
        def runs(self):
            listings.append(time.monotonic())
            return super().runs()

    app = build_app(Counted(), clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await until(pilot, lambda: app.screen.id == "runs", "runs screen")
        screen = app.screen
        screen.interval = 0.2
        for _ in range(5):
            await pilot.press("r")
            await pilot.pause(0.05)
        await pilot.press("1", "4")  # away and back
        await until(pilot, lambda: app.screen.id == "runs", "runs screen again")
        start = len(listings)
        t0 = time.monotonic()
        await pilot.pause(2.0)
        rate = (len(listings) - start) / (time.monotonic() - t0)
        assert rate <= 1.5 / screen.interval, (
            f"{rate:.1f} listings/s with a {screen.interval}s interval"
        )


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "-"), (3.214, "3.21"), (532.4, "532"), (999.9, "1k"), (12400.0, "12.4k"),
        (1234567.0, "1.23M"),
    ],
)
def test_throughput_reads_as_k_and_m_not_exponents(value: float | None, shown: str) -> None:
    assert fmt.rate(value) == shown


async def test_node_0_shows_the_command_for_the_other_nodes_until_they_join(xl_home):
    """`xl launch --nnodes 2 --node-rank 0` in a terminal: the full-screen monitor would cover
    the printed command, so the monitor shows it until every node's ranks are there."""
    run_dir = xl_home / "20260530-twonode"
    run_file = run_dir / "run.json"
    run = json.loads(run_file.read_text())
    both = run["ranks"]
    first_node = both[0]["node"]
    run["ranks"] = [r for r in both if r["node"] == first_node]
    run_file.write_text(json.dumps(run))
    # Script arguments in [brackets] (Hydra overrides) must show as typed, not as markup.
    join = (
        "xl: this is node 0 of 2; on the other node, in /work, run:\n  XL_TOKEN=abc xl launch "
        "--nnodes 2 --node-rank 1 train.py layers=[0,1] tag=[/]"
    )
    app = build_app(
        monitor_run_dir=run_dir,
        attach_only=False,
        clock=lambda: NOW,
        poll_interval=0.2,
        notice=join,
    )
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "monitor opened")
        banner = app.screen.query_one("#notice-banner", Static)
        await until(pilot, lambda: app.screen.polls >= 2, "two polls")
        assert banner.display and "--node-rank 1 train.py layers=[0,1] tag=[/]" in str(
            banner.render()
        )
        run["ranks"] = both  # node 1's ranks arrive
        run_file.write_text(json.dumps(run))
        await until(pilot, lambda: not banner.display, "the notice goes once node 1 joined")


async def test_the_join_command_comes_back_with_the_monitor_until_the_nodes_joined(xl_home):
    """A multi-node run started from the Launch form: leaving its Monitor and opening the run
    again from Runs shows the command for the other nodes again, until they have joined."""
    run_dir = xl_home / "20260530-twonode"
    run_file = run_dir / "run.json"
    run = json.loads(run_file.read_text())
    both = run["ranks"]
    run["ranks"] = [r for r in both if r["node"] == both[0]["node"]]
    run_file.write_text(json.dumps(run))
    join = (
        "xl: this is node 0 of 2; on the other node run:\n  XL_TOKEN=abc xl launch --nnodes 2 "
        "--node-rank 1 train.py"
    )
    app = build_app(clock=lambda: NOW, poll_interval=0.2)

    async def reopen() -> Static:
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, MonitorScreen), "the Monitor left")
        await pilot.press("4")
        await until(
            pilot,
            lambda: app.screen.id == "runs" and len(app.screen.query("#runs-table")),
            "runs screen",
        )
        runs = app.screen.query_one("#runs-table", DataTable)
        await until(pilot, lambda: runs.row_count == 5, "the runs listed")
        runs.move_cursor(row=runs.get_row_index(run_dir.name))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "the Monitor again")
        await until(pilot, lambda: app.screen.polls >= 1, "a poll")
        return app.screen.query_one("#notice-banner", Static)

    async with app.run_test(size=SIZE) as pilot:
        app.open_monitor(run_dir, join)  # as the Launch form does
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "monitor opened")
        banner = await reopen()
        assert banner.display and "--node-rank 1 train.py" in str(banner.render())
        run["ranks"] = both  # node 1's ranks arrive
        run_file.write_text(json.dumps(run))
        await until(pilot, lambda: not banner.display, "the notice goes once node 1 joined")
        banner = await reopen()
        assert not banner.display


async def test_switching_ranks_never_reads_the_run_from_two_threads_at_once(xl_home):
    """A rank switch asks for a poll at once; while one runs, it waits for it (the reader keeps
    file offsets: two threads in it at once would lose or repeat log lines)."""
    inside, overlaps, calls = [0], [0], [0]
    lock = threading.Lock()

    class SlowReader(RunReader):
        def poll(self, *args, **kwargs):
            with lock:
                inside[0] += 1
                calls[0] += 1
                overlaps[0] += inside[0] > 1
            time.sleep(0.1)  # widen the window a second poll would need
            try:
                return super().poll(*args, **kwargs)
            finally:
                with lock:
                    inside[0] -= 1

    class Slow(LocalBackend):
        def reader(self, run_dir: Path) -> RunReader:
            return SlowReader(run_dir)

    app = build_app(
        Slow(), monitor_run_dir=xl_home / "20260530-wide", clock=lambda: NOW, poll_interval=0.2
    )
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 64, "64 ranks")
        for _ in range(20):
            await pilot.press("]")
            await pilot.pause(0.03)
        await until(
            pilot,
            lambda: app.screen.query_one(RankLog).rank == table.current_rank,
            "the log follows the last rank chosen",
        )
    assert calls[0] > 3 and overlaps[0] == 0, (calls[0], overlaps[0])


def _ended_footer(keys: set[str]) -> bool:
    return "charts" in keys and not {"stop", "detach"} & keys


async def test_stop_and_detach_leave_the_footer_when_the_run_ends(xl_home):
    """The footer follows the run: live, "Stop run" and "Detach" can be pressed; once the run has
    ended (seen by a poll, with no key pressed in between) neither is offered, nor by `?`."""
    run_dir = xl_home / "20260530-straggler"  # running
    app = build_app(monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen

        def footer() -> set[str]:
            return {k.action for k in screen.query(FooterKey) if not k.has_class("-disabled")}

        await until(
            pilot,
            lambda: screen.status == "running" and {"stop", "detach"} <= footer(),
            "the footer of a live run",
        )
        await pilot.press("question_mark")
        await until(pilot, lambda: app.screen is not screen, "the help")
        assert (
            "`s`: stop the run" in app.screen.text and "`d`: leave the run going" in app.screen.text
        )
        await pilot.press("escape")
        _set_status(run_dir, "succeeded")
        # The footer is redrawn at the end: judge one drawn (an empty one, mid-redraw, says
        # nothing).
        await until(
            pilot,
            lambda: screen.status == "succeeded" and _ended_footer(footer()),
            "Charts kept, Stop run and Detach gone",
        )
        await pilot.press("s")  # nothing to stop: no question comes
        await pilot.pause(0.2)
        assert app.screen is screen
        await pilot.press("question_mark")
        await until(pilot, lambda: app.screen is not screen, "the help")
        assert (
            "stop the run" not in app.screen.text and "leave the run going" not in app.screen.text
        )
        assert "The run has ended" in app.screen.text and "the run goes on" not in app.screen.text


async def test_the_log_wraps_long_lines_to_its_width_and_again_when_it_changes(xl_home):
    """A traceback's last line (104 characters) in a 80-column log: wrapped, not cut; the
    terminal grown: one row again."""
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 79.15 GiB "
        "total capacity)"
    )
    app = build_app(
        monitor_run_dir=xl_home / "20260530-failed", clock=lambda: NOW, poll_interval=0.2
    )
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "two ranks")
        await pilot.press("]")
        log = app.screen.query_one(RankLog)
        await until(
            pilot,
            lambda: log.rank == 1 and any("OutOfMemoryError" in line for line in log.lines),
            "rank 1's log",
        )
        width = log.scrollable_content_region.width
        rows = list(log.lines)
        at = next(i for i, line in enumerate(rows) if line.startswith("torch.OutOfMemoryError"))
        assert width < len(oom) and all(len(line) <= width for line in rows)
        assert "".join(rows[at:at + 2]) == oom  # every character, on two rows
        # charts and log side by side, the log wider than the line
        await pilot.resize_terminal(260, 60)
        await until(pilot, lambda: oom in log.lines, "one row once there is room")
