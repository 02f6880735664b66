"""The Monitor's eval column names the epoch each evaluation was taken at: training that went on
into the next epoch since leaves it as it was; an evaluation of the epoch in course says that one.
"""

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
from xl.tui.widgets.rank_table import RankTable

NOW = runfixtures.T0 + 130
T = runfixtures.T0 + 102.5


def record(rank: int, step: int, epoch: float, eval_loss: float | None = None) -> dict:
    """A train line as the Trainer's callback writes it: an evaluation, or training with a loss."""
    line: dict = {"t": T + step / 1000, "rank": rank, "kind": "train", "step": step, "epoch": epoch}
    line.update({"eval_loss": eval_loss} if eval_loss is not None else {"loss": 0.5})
    return line


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    runs = tmp_path / "xlhome" / "runs"
    shutil.copytree(FIXTURES / "runs" / "20260530-healthy", runs / "20260530-healthy")
    return runs / "20260530-healthy"


async def eval_cells(run_dir: Path, lines: list[dict]) -> list[str]:
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in lines)
    app = build_app(monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(200, 60)) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2 and "eval" in table.column_keys, "evals")
        return table.column("eval")


async def test_an_eval_keeps_its_own_epoch_while_training_goes_on(run_dir):
    cells = await eval_cells(run_dir, [
        record(0, 101, 1.0, eval_loss=3.1), record(1, 101, 1.0, eval_loss=3.2),
        record(0, 150, 1.5), record(1, 150, 1.5),  # training in the next epoch since
    ])
    view = RunReader(run_dir).poll()
    assert [view.ranks[r].epoch for r in (0, 1)] == [1.5, 1.5]  # where training is now
    assert cells == ["3.1 ep 1", "3.2 ep 1"]


async def test_an_eval_of_the_epoch_in_course_says_that_epoch(run_dir):
    cells = await eval_cells(run_dir, [
        record(0, 150, 1.5), record(1, 150, 1.5),
        record(0, 200, 2.0, eval_loss=2.3125), record(1, 200, 2.0, eval_loss=2.4375),
    ])
    assert cells == ["2.312 ep 2", "2.438 ep 2"]
