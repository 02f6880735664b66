"""The Monitor's step split: each rank's step time with a bar of where it went (data, compute,
comm, other), the straggler's phase in its banner, and its own memory on its GPU as its memory; the
table's columns follow the terminal's width. Fed recorded runs (runfixtures.add_step_split)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import runfixtures
from pilotwait import until
from where import FIXTURES

from xl.launcher.view.reader import RunReader
from xl.tui.app import build_app
from xl.tui.widgets.rank_cells import bar_counts, split_cell, step_time
from xl.tui.widgets.rank_table import COLUMNS, RankTable, fit
from xl.tui.widgets.text_lines import TextLines

NOW = runfixtures.T0 + 130


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "xlhome" / "runs"
    shutil.copytree(FIXTURES / "runs", root)
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    runfixtures.add_step_split(root / "20260530-straggler")
    return root


def test_the_step_bar_adds_up_and_reads_without_colour() -> None:
    assert [step_time(s) for s in (0.35, 0.0004, 1.25, 12.5, 125.0, None, -1.0)] == [
        "350ms",
        "0ms",
        "1.25s",
        "12.5s",
        "125s",
        "-",
        "-",
    ]
    # Rank 0 of the recorded run: 6% data, 57% compute, 34% comm, 3% other, in 14 cells.
    assert bar_counts((0.02, 0.2, 0.12, 0.01), 14) == [1, 8, 5, 0]
    for parts in (
        (0.02, 0.2, 0.12, 0.01),
        (1.0, 0.0, 0.0, 0.0),
        (0.1, 0.1, 0.1, 0.1),
        (0.0, 0.0, 0.0, 0.0),
    ):
        for cells in (1, 6, 13):
            counts = bar_counts(parts, cells)
            assert sum(counts) == (cells if sum(parts) else 0) and all(
                n == 0 for n, p in zip(counts, parts, strict=True) if p == 0
            )
    cell = split_cell(0.35, (0.21, 0.12, 0.01, 0.01), 6)
    assert cell.plain == "350ms " + "".join(
        letter * n
        for letter, n in zip("dcno", bar_counts((0.21, 0.12, 0.01, 0.01), 6), strict=True)
    )
    # the letters carry colours too
    assert {span.style for span in cell.spans} == {"black on yellow", "black on green"}
    assert split_cell(0.35, None, 6).plain == "350ms"  # timed, not split (an older xl's lines)
    assert split_cell(None, None, 6).plain == "-"


def test_the_columns_fit_the_terminal_least_needed_left_out_first() -> None:
    def keys(width: int) -> list[str]:
        return [k for k, _, _ in fit(COLUMNS, width)]

    def used(width: int) -> int:
        return sum(w + 2 for _, _, w in fit(COLUMNS, width))

    def width_of(width: int, key: str) -> int:
        return next(w for k, _, w in fit(COLUMNS, width) if k == key)

    # 80 columns: every figure a step gives (samples/s too) with the split's bar in what is left
    # (3 cells), utilisation out, nothing off to the right.
    assert keys(80) == ["rank", "gpu", "state", "step", "loss", "time", "sps", "mem"]
    assert used(80) == 80 and width_of(80, "time") == len("350ms") + 1 + 3
    # Narrower still: the bar goes before any figure does, then the least needed figure.
    assert keys(76) == keys(80) and width_of(76, "time") == len("350ms")
    assert keys(75) == ["rank", "state", "step", "loss", "time", "sps", "mem"]
    assert split_cell(0.35, (0.21, 0.12, 0.01, 0.01), 0).plain == "350ms"  # no bar, no ellipsis
    # Wide: every column, the step-time column grown to show a longer bar and its legend.
    wide = fit(COLUMNS, 200)
    assert [k for k, _, _ in wide] == [k for k, _, _ in COLUMNS]
    assert next(c for c in wide if c[0] == "time")[1:] == ("Step time  d c n o", 24)
    # Too narrow for even the four first: they stay (the table scrolls), nothing else does.
    assert keys(30) == ["rank", "state", "step", "loss"]
    assert fit(COLUMNS, 0) == COLUMNS  # not laid out yet


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
async def test_each_rank_shows_its_split_memory_and_the_straggler_its_phase(
    runs: Path, size: tuple[int, int]
) -> None:
    app = build_app(
        monitor_run_dir=runs / "20260530-straggler", clock=lambda: NOW, poll_interval=0.2
    )
    async with app.run_test(size=size) as pilot:
        table = app.screen.query_one(RankTable)
        await until(
            pilot,
            lambda: table.row_count == 2 and str(table.cell(1, "time")) != "-",
            "the ranks' split",
        )
        bar = 3 if size[0] == 80 else 18  # what is left of the column after the time
        for rank, (step_s, *parts, mem) in runfixtures.SPLIT.items():
            counts = bar_counts(tuple(parts), bar)
            assert table.cell(rank, "time").plain == f"{step_time(step_s)} " + "".join(
                c * n for c, n in zip("dcno", counts, strict=True)
            )
            # what the rank's own processes hold on its GPU: not its footprint in host memory
            # (mem), nor the whole GPU's use (39.1G)
            own = runfixtures.SPLIT_GPU_MEM[rank]
            shown = str(table.cell(rank, "mem"))
            assert shown.split()[-1] == f"{own / 1024:.1f}G" != f"{mem / 1024:.1f}G", shown
        # Samples/s stays at 80 columns, as the rank's last line gave it.
        view = RunReader(runs / "20260530-straggler").poll()
        for rank, rv in view.ranks.items():
            assert rv.samples_per_s and table.cell(rank, "sps") == f"{rv.samples_per_s:.3g}"
        assert ("util" in table.column_keys) is (size[0] != 80)
        banner = app.screen.query_one("#straggler-banner", TextLines)
        assert banner.display
        assert banner.text.plain == f"straggler  data : {runfixtures.STRAGGLER_DATA}"
        if size[0] == 80:  # the terminal grows: the columns left out come back, the bar grows
            await pilot.resize_terminal(200, 60)
            await until(
                pilot,
                lambda: "sps" in table.column_keys and "util" in table.column_keys,
                "every column",
            )
            assert len(table.cell(1, "time").plain) == len("350ms ") + 18


async def test_a_run_without_the_split_shows_what_it_showed(runs: Path) -> None:
    """The healthy fixture (no step_s, no mem_mib): a dash for the step time, the meter of the
    rank's own memory on its GPU, and no straggler banner."""
    app = build_app(monitor_run_dir=runs / "20260530-healthy", clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "the ranks")
        assert (
            str(table.cell(0, "time")) == "-"
            and "39.1G" in str(table.cell(0, "mem"))
            and "█" in str(table.cell(0, "mem"))
        )
        assert not app.screen.query_one("#straggler-banner").display


def test_the_reader_keeps_the_straggler_s_phase_until_it_recovers(runs: Path) -> None:
    run = runs / "20260530-straggler"
    view = RunReader(run).poll()
    assert view.ranks[1].state == "straggler" and view.ranks[1].straggler_phase == "data"
    assert view.ranks[0].straggler_phase is None
    with (run / "events.jsonl").open("a") as fh:
        fh.write(
            json.dumps(
                {
                    "t": NOW,
                    "kind": "recovered",
                    "rank": 1,
                    "of": "straggler",
                    "message": "rank 1 is no longer a straggler",
                }
            )
            + "\n"
        )
    view = RunReader(run).poll()
    assert view.ranks[1].state != "straggler" and view.ranks[1].straggler_phase is None
