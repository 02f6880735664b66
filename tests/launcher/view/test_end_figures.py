"""The figures a run's end shows, read from what its ranks left: samples / time in steps, the last
good memory reading, an evaluation at its own epoch, and each rank's last line of output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xl.launcher.rundir.lastbytes import last_output_line
from xl.launcher.view.reader import RunReader


def _metrics(run_dir: Path, *rows: dict) -> None:
    with open(run_dir / "metrics.jsonl", "a") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def _train(t: float, step: int, **kw: float) -> dict:
    return {"t": t, "rank": 0, "kind": "train", "step": step, **kw}


def _sys(t: float, **kw: float) -> dict:
    return {"t": t, "rank": 0, "kind": "sys", **kw}


def test_the_runs_samples_per_s_is_samples_over_time_in_steps(tmp_path: Path) -> None:
    # 10 slow steps (32 samples in 0.5 s each), then 2 fast (32 in 0.01 s): the last line says
    # 3200/s, the run did 352 samples in 5.02 s of steps.
    rows = [_train(100 + i * 0.5, i, samples=32, samples_per_s=64.0) for i in range(1, 11)]
    rows += [_train(105 + i * 0.01, 10 + i, samples=32, samples_per_s=3200.0) for i in (1, 2)]
    _metrics(tmp_path, *rows)
    r = RunReader(tmp_path).poll().ranks[0]
    assert r.samples_per_s == 3200.0  # the live figure: the last line's
    assert r.run_samples_per_s == pytest.approx(12 * 32 / (10 * 0.5 + 2 * 0.01))


def test_a_rate_without_counts_is_the_runs_figure_as_it_was(tmp_path: Path) -> None:
    # A parsed progress bar gives a rate and no count: nothing to weigh, the last rate stands.
    _metrics(tmp_path, _train(100, 1, samples_per_s=40.0), _train(101, 2, samples_per_s=42.8))
    assert RunReader(tmp_path).poll().ranks[0].run_samples_per_s == 42.8


def test_memory_read_as_the_rank_died_keeps_its_last_good_reading(tmp_path: Path) -> None:
    _metrics(
        tmp_path,
        _sys(100, mem_mib=812.0, rss_mib=700.0, gpu_proc_mem_mib=3000.0),
        _sys(101, mem_mib=0.0, rss_mib=0.0, gpu_proc_mem_mib=0.0),
    )
    r = RunReader(tmp_path).poll().ranks[0]
    assert (r.mem_mib, r.rss_mib, r.gpu_proc_mem_mib) == (812.0, 700.0, 3000.0)


def test_memory_that_shrinks_is_shown_as_it_shrank(tmp_path: Path) -> None:
    # A rank that frees memory (a cache emptied, an eval's tensors gone) really holds less.
    _metrics(tmp_path, _sys(100, mem_mib=812.0), _sys(101, mem_mib=95.5))
    assert RunReader(tmp_path).poll().ranks[0].mem_mib == 95.5


def test_an_evaluation_keeps_the_epoch_it_was_taken_at(tmp_path: Path) -> None:
    _metrics(
        tmp_path,
        _train(100, 10, epoch=1.0),
        _train(101, 11, eval_loss=0.5, epoch=1.0),
        _train(102, 12, epoch=2.0),
        _train(103, 13, epoch=2.5),
    )
    r = RunReader(tmp_path).poll().ranks[0]
    assert (r.eval_loss, r.eval_epoch, r.epoch) == (0.5, 1.0, 2.5)


def test_an_evaluation_without_an_epoch_takes_the_one_in_force(tmp_path: Path) -> None:
    _metrics(tmp_path, _train(100, 10, epoch=3.0), _train(101, 11, eval_loss=0.25))
    r = RunReader(tmp_path).poll().ranks[0]
    assert (r.eval_loss, r.eval_epoch) == (0.25, 3.0)


def _log(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "rank-0.log"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("data", "shown"),
    [
        # a bar's frames, redrawn with \r, then its newline alone: its last frame
        (
            b"epoch 1\n\rtrain  10%|#\rtrain  60%|######\rtrain 100%|##########\n",
            "train 100%|##########",
        ),
        # a bar still being drawn when the rank ended: its last frame
        (b"epoch 1\n\rtrain  10%|#\rtrain  60%|######", "train  60%|######"),
        # a warning and the source line Python echoes under it: the warning
        (
            b"step 9\n/home/ada/train.py:52: UserWarning: lr is 0\n  warnings.warn(\n",
            "UserWarning: lr is 0 (train.py:52)",
        ),
        # xl's own note in the log is not the rank's output
        (
            b"step 9 done\n[xl: rank 0's output relay died (killed by signal 9); another one"
            b" took over]\n",
            "step 9 done",
        ),
        (b"step 9\n\n   \n", "step 9"),
        (b"", ""),
    ],
)
def test_the_last_line_is_what_the_rank_last_said(tmp_path: Path, data: bytes, shown: str) -> None:
    assert last_output_line(_log(tmp_path, data)) == shown


def test_an_indented_last_line_that_no_warning_echoes_is_kept(tmp_path: Path) -> None:
    # A script's own indented output (a table, a tree) is what it said.
    path = _log(tmp_path, b"results:\n  accuracy 0.91\n")
    assert last_output_line(path) == "accuracy 0.91"


def test_the_live_views_last_line_skips_a_warnings_echo_and_xls_notes(tmp_path: Path) -> None:
    from xl.launcher.cli.consolerun import ConsoleRun  # noqa: PLC0415 - the console's model, here only

    _metrics(tmp_path, _train(100, 1, loss=1.0))
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "rank-0.log"
    log.write_text("step 1\n")
    watched = ConsoleRun(tmp_path)
    watched.poll()
    assert not watched.final and watched.last_line[0] == "step 1"
    with log.open("a") as fh:
        fh.write("/w/train.py:7: UserWarning: lr is 0\n  warnings.warn(\n[xl: a note]\n")
    watched.poll()
    assert watched.last_line[0] == "UserWarning: lr is 0 (train.py:7)"
    with log.open("a") as fh:
        fh.write("  indented, said by the script\n")
    watched.poll()
    assert watched.last_line[0] == "indented, said by the script"
