"""The Monitor's header is one line at 120 columns for a run as xl names it (its id carries its
name) on eight GPUs of a long-named host: it says less rather than wrap, and never cuts the run
id. Where there is room it says everything; a name the id does not carry is still shown."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import runfixtures
from pilotwait import until
from where import FIXTURES

from xl.tui.app import build_app
from xl.tui.widgets.rank_table import RankTable
from xl.tui.widgets.text_lines import TextLines

NOW = runfixtures.T0 + 130
NAME = "lightning_image_classifier"
RUN_ID = f"20261207-062804-{NAME}-3f2a"
HOST = "gpu-node-012.cluster.example.org"
MODEL = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The recorded straggler run (running, two ranks) as `xl launch` names a run today, on a
    host with a long name and eight GPUs."""
    runs = tmp_path / "xlhome" / "runs"
    run = runs / RUN_ID
    shutil.copytree(FIXTURES / "runs" / "20260530-straggler", run)
    record = run / "run.json"
    data = json.loads(record.read_text())
    data.update(run_id=RUN_ID, name=NAME)
    data["devices"] = [{"index": i, "uuid": f"GPU-{i}", "name": MODEL} for i in range(8)]
    for row in data["ranks"]:
        row["node"] = HOST
    record.write_text(json.dumps(data))
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    return run


async def header_at(run_dir: Path, size: tuple[int, int]) -> tuple[str, int]:
    """(what the header says, how many rows it takes) once the Monitor shows the run."""
    app = build_app(monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.screen.query_one(RankTable).row_count == 2, "the ranks")
        header = app.screen.query_one("#run-header", TextLines)
        await until(pilot, lambda: RUN_ID in header.text.plain, "the header")
        await pilot.pause(0.3)
        return header.text.plain, header.size.height


async def test_the_header_is_one_line_at_120_columns_with_the_run_id_whole(run_dir):
    text, rows = await header_at(run_dir, (120, 40))
    assert rows == 1 and len(text) <= 120, text
    assert f"[{RUN_ID}]" in text and "running" in text and "elapsed 2m10s" in text
    assert "world size 2" in text and "GPU 0-7" in text
    assert text.count(NAME) == 1  # the id says the name: said once


async def test_a_wide_terminal_says_everything(run_dir):
    text, rows = await header_at(run_dir, (200, 60))
    assert rows == 1
    assert f"world size 2 on {HOST}" in text and f"GPU 0-7 ({MODEL})" in text


async def test_a_name_the_run_id_does_not_carry_is_shown_beside_it(tmp_path, monkeypatch):
    runs = tmp_path / "xlhome" / "runs"
    shutil.copytree(FIXTURES / "runs" / "20260530-healthy", runs / "20260530-healthy")
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    app = build_app(monitor_run_dir=runs / "20260530-healthy", clock=lambda: NOW,
                    poll_interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        header = app.screen.query_one("#run-header", TextLines)
        await until(pilot, lambda: "[20260530-healthy]" in header.text.plain, "the header")
        first = header.text.plain.split("\n")[0]  # the second: where a finished run's time went
        assert first.startswith("bert-finetune  [20260530-healthy]  ") and len(first) <= 120
        assert "world size 2 on localhost" in first and first.endswith("devices GPU 1,0")


async def test_at_80_columns_the_header_is_one_line_with_the_run_id_whole(run_dir):
    text, rows = await header_at(run_dir, (80, 24))
    assert rows == 1 and len(text) <= 80, text
    assert f"[{RUN_ID}]" in text and "running" in text, text
    # the figures lose their words before anything goes; what is left is still so
    assert "2m10s" in text, text


async def test_a_narrow_terminal_keeps_every_figure_that_fits(run_dir):
    text, rows = await header_at(run_dir, (100, 30))
    assert rows == 1 and len(text) <= 100, text
    assert f"[{RUN_ID}]" in text and "running" in text and "2m10s" in text, text
    assert "2 ranks" in text and "GPU 0-7" in text, text
