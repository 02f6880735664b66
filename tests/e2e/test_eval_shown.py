"""Evaluations show: each rank's latest eval loss (and the epoch, where the framework logs one) in
the Monitor's rank table and in the plain view, kept apart from the training loss. A run that never
evaluated shows no eval column at all (its snapshots are those of tests/__snapshots__). The last
test runs the real `xl launch --no-tui` of examples/hf_trainer.py without --eval; the same with
--eval is test_frameworks.py's run of the unchanged Trainer, which checks its end table too."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest
import runfixtures
from pilotwait import until
from procs import only_run, wait_no_processes, xl, xl_env
from rich.console import Console
from where import FIXTURES
from xltele import REPO

from xl.launcher.cli.console import ConsoleRun, render, render_text
from xl.launcher.view.reader import RunReader
from xl.tui.app import build_app
from xl.tui.widgets.rank_table import RankTable

RUNS_FIXTURES = FIXTURES / "runs"
NOW = runfixtures.T0 + 130


def _eval_record(
    rank: int, step: int, eval_loss: object, epoch: object, t: float
) -> dict[str, object]:
    """What XLCallback's on_log writes (through xl.log) for a Trainer evaluation: the Trainer's
    eval_ keys and its epoch, at the step it was taken, and no training loss."""
    return {
        "t": t,
        "rank": rank,
        "kind": "train",
        "step": step,
        "eval_loss": eval_loss,
        "eval_runtime": 0.41,
        "eval_samples_per_second": 39.0,
        "eval_steps_per_second": 4.9,
        "epoch": epoch,
    }


def _copy(tmp_path: Path, name: str = "20260530-healthy") -> Path:
    runs = tmp_path / "xlhome" / "runs"
    shutil.copytree(RUNS_FIXTURES / name, runs / name)
    return runs / name


def _append(run_dir: Path, records: list[dict[str, object]]) -> None:
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)


@pytest.fixture
def evaluated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The healthy two-rank run, evaluated at steps 50 and 100 (epochs 1 and 2) on both ranks."""
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    run_dir = _copy(tmp_path)
    t = runfixtures.T0 + 102.5
    _append(run_dir, [
        _eval_record(0, 50, 3.1, 1.0, t), _eval_record(1, 50, 3.2, 1.0, t),
        _eval_record(0, 100, 2.3125, 2.0, t + 0.1), _eval_record(1, 100, 2.4375, 2.0, t + 0.1),
    ])
    return run_dir


@pytest.fixture
def plain_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    return _copy(tmp_path)


# -- the reader ------------------------------------------------------------------------------


def test_the_reader_keeps_each_ranks_latest_eval_loss_and_epoch_apart_from_its_loss(
    evaluated: Path,
) -> None:
    view = RunReader(evaluated).poll()
    assert (view.ranks[0].eval_loss, view.ranks[0].epoch) == (2.3125, 2.0)
    assert (view.ranks[1].eval_loss, view.ranks[1].epoch) == (2.4375, 2.0)
    assert view.ranks[1].loss == 0.51425  # the last training loss, not the eval loss
    assert view.ranks[0].step == 100


def test_a_non_finite_or_odd_eval_leaves_the_last_one_shown_and_a_loss_beside_it_is_not_training(
    evaluated: Path,
) -> None:
    reader = RunReader(evaluated)
    reader.poll()
    t = runfixtures.T0 + 110
    _append(evaluated, [
        _eval_record(0, 101, None, "2.5", t),
        _eval_record(0, 102, True, None, t + 0.1),
        _eval_record(0, 103, float("nan"), float("inf"), t + 0.2),
        _eval_record(0, 104, "nan", "2.5", t + 0.3),
        {**_eval_record(1, 103, 1.75, 2.5, t), "loss": 9.0},
    ])
    view = reader.poll()
    assert (view.ranks[0].eval_loss, view.ranks[0].epoch) == (2.3125, 2.0)
    assert (view.ranks[1].eval_loss, view.ranks[1].epoch) == (1.75, 2.5)
    assert view.ranks[1].loss == 0.51425  # an evaluation's "loss" never moves the training loss


def test_a_run_that_never_evaluated_has_no_eval_values(plain_run: Path) -> None:
    view = RunReader(plain_run).poll()
    assert all(rv.eval_loss is None and rv.epoch is None for rv in view.ranks.values())


def test_a_training_record_with_an_epoch_gives_the_epoch_without_an_eval_loss(
    plain_run: Path,
) -> None:
    _append(
        plain_run,
        [
            {
                "t": runfixtures.T0 + 103,
                "rank": 0,
                "kind": "train",
                "step": 101,
                "loss": 0.5,
                "epoch": 1.25,
            }
        ],
    )
    rv = RunReader(plain_run).poll().ranks[0]
    assert (rv.loss, rv.epoch, rv.eval_loss) == (0.5, 1.25, None)


# -- the Monitor -----------------------------------------------------------------------------


async def test_the_monitor_shows_each_ranks_eval_loss_and_epoch(evaluated: Path) -> None:
    app = build_app(monitor_run_dir=evaluated, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(200, 60)) as pilot:
        table = app.screen.query_one(RankTable)
        await until(
            pilot, lambda: table.row_count == 2 and "eval" in table.column_keys, "the eval column"
        )
        # after the others: 80 columns still show up to Memory
        assert table.column_keys[-1] == "eval"
        assert table.column("eval") == ["2.312 ep 2", "2.438 ep 2"]
        assert table.column("loss")[1] == "0.5142"  # the training loss, beside it
        await pilot.pause()
        drawn = [table.render_line(y).text for y in range(3)]  # what the screen shows of it
        assert (
            "Eval loss (ep)" in drawn[0] and "2.312 ep 2" in drawn[1] and "2.438 ep 2" in drawn[2]
        )


async def test_at_80_columns_the_eval_column_leaves_what_the_screen_showed_as_it_was(
    plain_run: Path,
) -> None:
    app = build_app(monitor_run_dir=plain_run, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "two ranks")
        await pilot.pause()
        before = [table.render_line(y).text for y in range(3)]
        t = runfixtures.T0 + 102.5
        _append(
            plain_run, [_eval_record(0, 100, 2.3125, 2.0, t), _eval_record(1, 100, 2.4375, 2.0, t)]
        )
        # The table learnt of the evaluations; at 80 columns the eval column is the first left
        # out (it does not fit beside the step time and memory), so nothing shown moves.
        await until(pilot, lambda: table._evals, "the evaluations read")
        await pilot.pause()
        assert [table.render_line(y).text for y in range(3)] == before  # up to Memory, as it was
        assert "Memory" in before[0]


async def test_a_run_without_evaluations_has_no_eval_column(plain_run: Path) -> None:
    app = build_app(monitor_run_dir=plain_run, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(200, 60)) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "two ranks")
        assert "eval" not in table.column_keys
        await pilot.pause()
        assert "Eval" not in table.render_line(0).text


async def test_the_eval_column_appears_when_the_first_evaluation_comes(plain_run: Path) -> None:
    app = build_app(monitor_run_dir=plain_run, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(200, 60)) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "two ranks")
        assert "eval" not in table.column_keys
        _append(plain_run, [_eval_record(1, 100, 2.5, 2.0, runfixtures.T0 + 103)])
        await until(pilot, lambda: "eval" in table.column_keys, "the eval column")
        assert table.column("eval") == ["-", "2.5 ep 2"]  # rank 0 has not evaluated


# -- the plain view --------------------------------------------------------------------------


def _live(watched: ConsoleRun, width: int) -> str:
    """The live view (a terminal's) as drawn at ``width`` columns."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(render(watched, width=width))
    return buf.getvalue()


def _plain(run_dir: Path) -> tuple[str, str, str]:
    """The end table of the plain view, and the live view at 80 and 120 columns."""
    watched = ConsoleRun(run_dir)
    watched.poll()
    # 120: a pipe's width
    return render_text(watched, width=120), _live(watched, 80), _live(watched, 120)


def _rank_rows(live: str) -> list[str]:
    return [ln for ln in live.splitlines() if ln.startswith("│")]


def test_the_plain_view_shows_eval_loss_and_epoch_in_its_end_table(evaluated: Path) -> None:
    text, _, wide = _plain(evaluated)
    lines = text.splitlines()
    header = next(ln for ln in lines if "| rank" in ln)
    assert re.search(r"mem \|\s+eval \| last log line", header), header
    rows = [ln for ln in lines if re.match(r"\|\s+[01] \|", ln)]
    assert "2.312 ep 2" in rows[0] and "2.438 ep 2" in rows[1]
    assert "0.5142" in rows[1]  # the training loss beside it
    assert all(len(ln) <= 120 for ln in lines)
    rows = _rank_rows(wide)  # a wide terminal's live view: the same, each rank on one line
    assert len(rows) == 2 and "2.312 ep 2" in rows[0] and "0.5142" in rows[1], wide


def test_at_80_columns_the_live_view_keeps_each_rank_on_one_line_with_its_loss(
    evaluated: Path,
) -> None:
    _, narrow, _ = _plain(evaluated)
    rows = _rank_rows(narrow)
    assert len(rows) == 2, narrow  # nothing wrapped onto a second line
    assert "exited" in rows[0] and "0.5142" in rows[1]  # the loss not squeezed by an eval column
    assert max(len(ln) for ln in narrow.splitlines()) <= 80


def test_the_plain_view_of_a_run_without_evaluations_has_no_eval_field(plain_run: Path) -> None:
    text, narrow, wide = _plain(plain_run)
    assert "eval" not in text and "eval" not in narrow and "eval" not in wide
    header = next(ln for ln in text.splitlines() if "| rank" in ln)
    assert re.search(r"mem \| last log line", header), header


# -- end to end ------------------------------------------------------------------------------


def _launch_trainer(tmp_path: Path) -> str:
    """The real `xl launch --nproc-per-node 2 --no-tui` of the unchanged examples/hf_trainer.py
    (4 steps, no evaluation): its output."""
    home = tmp_path / "home"
    env = xl_env(
        home,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        HF_HOME=str(tmp_path / "hf"),
    )
    args = ["--steps", "4", "--logging-steps", "1", "--no-callback"]
    script = REPO / "examples" / "hf_trainer.py"
    proc = xl(
        ["launch", "--nproc-per-node", "2", "--no-tui", "--", str(script), *args],
        env,
        cwd=tmp_path,
        timeout=240,
    )
    wait_no_processes(only_run(home), timeout=30)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.e2e
def test_xl_launch_no_tui_of_a_trainer_that_never_evaluates_has_no_eval_column(
    tmp_path: Path,
) -> None:
    out = _launch_trainer(tmp_path)
    header = next(ln for ln in out.splitlines() if ln.startswith("| rank"))
    assert "eval" not in header and re.search(r"mem \| last log line", header), out[-3000:]
    assert len([ln for ln in out.splitlines() if re.match(r"\|\s+[01] \| exited", ln)]) == 2
