"""2-rank CPU runs under real torchrun, with Telemetry standing in for the supervisor."""

from __future__ import annotations

from pathlib import Path

import pytest
from xltele import REPO, SUPPORT, torchrun

from xl.launcher.reader import RunReader

pytestmark = pytest.mark.e2e


def _sys_ranks(run) -> set[int]:
    return {r["rank"] for r in run.metrics("sys") if "rss_mib" in r}


def test_ddp_watch_names_the_straggler_not_its_victim_and_a_quiet_rank_stalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Short diagnosis windows, read by the Diagnoser in this (the supervisor's) process.
    monkeypatch.setenv("XL_STALL_MIN_S", "2")
    monkeypatch.setenv("XL_STRAGGLER_WINDOW_S", "3")
    monkeypatch.setenv("XL_STRAGGLER_SUSTAIN", "2")
    # Rank 1 sleeps 0.1 s more per step (the straggler); rank 0 waits for it at the all-reduce
    # and, after step 10, stops calling xl.log while it keeps training (stalled).
    run = torchrun(
        tmp_path / "run",
        SUPPORT / "telemetry_ddp.py",
        [
            "--steps",
            "50",
            "--watch",
            "--slow-rank",
            "1",
            "--slow-s",
            "0.1",
            "--quiet-rank",
            "0",
            "--quiet-after",
            "10",
        ],
    )
    assert run.returncode == 0, run.output[-2000:]
    assert [r["step"] for r in run.train(1)] == list(range(1, 51))
    assert [r["step"] for r in run.train(0)] == list(range(1, 11))
    assert all(r["samples_per_s"] > 0 for r in run.train(1)[1:])
    assert _sys_ranks(run) == {0, 1}
    waits = {r["rank"]: r["comm_wait_s"] for r in run.metrics("sys") if "comm_wait_s" in r}
    assert waits[0] > waits[1], "the victim waits at the all-reduce, the straggler does not"
    stragglers = [e for e in run.events if e["kind"] == "straggler"]
    assert stragglers and {e["rank"] for e in stragglers} == {1}
    assert stragglers[0]["victims"] == [0] and "rank 1" in stragglers[0]["message"]
    stalled = [e for e in run.events if e["kind"] == "stalled"]
    assert [e["rank"] for e in stalled] == [0]
    assert "step 10" in stalled[0]["message"]
    # What a live view would show, read back from the run directory.
    for event in run.events:
        with open(run.run_dir / "events.jsonl", "a") as fh:
            fh.write(__import__("json").dumps(event) + "\n")
    view = RunReader(run.run_dir).poll()
    assert view.ranks[0].state == "stalled" and view.ranks[1].state == "straggler"
    assert view.ranks[1].step == 50 and view.ranks[1].total_steps == 50
    assert view.ranks[1].progress == 1.0 and view.ranks[1].samples_per_s > 0


def test_hf_trainer_with_xlcallback_logs_every_rank(tmp_path: Path) -> None:
    run = torchrun(tmp_path / "run", REPO / "examples" / "hf_trainer.py", ["--steps", "8"])
    assert run.returncode == 0, run.output[-2000:]
    for rank in (0, 1):
        train = run.train(rank)
        assert max(r["step"] for r in train) == 8
        assert any(isinstance(r.get("loss"), float) for r in train)
        assert any("lr" in r and "grad_norm" in r for r in train)
        assert any(r.get("samples_per_s", 0) > 0 for r in train)
        assert all(r.get("source") != "log" for r in train), "printed dicts must not double up"
    assert _sys_ranks(run) == {0, 1}


def test_hf_trainer_without_any_xl_code_is_read_from_its_output(tmp_path: Path) -> None:
    run = torchrun(
        tmp_path / "run", REPO / "examples" / "hf_trainer.py", ["--steps", "8", "--no-callback"]
    )
    assert run.returncode == 0, run.output[-2000:]
    train = run.train(0)
    assert train and all(r["source"] == "log" for r in train)
    assert any(isinstance(r.get("loss"), float) and "lr" in r for r in train)
    assert max(r["step"] for r in train if "step" in r) == 8
    assert {r["total_steps"] for r in train if "total_steps" in r} == {8}
    # Rank 1 prints nothing HF-shaped, yet its process is sampled all the same.
    assert _sys_ranks(run) == {0, 1}


def test_accelerate_tracker(tmp_path: Path) -> None:
    run = torchrun(tmp_path / "run", REPO / "examples" / "accelerate_train.py", ["--steps", "8"])
    assert run.returncode == 0, run.output[-2000:]
    train = run.train(0)
    assert [r["step"] for r in train] == list(range(1, 9))
    assert all(isinstance(r["loss"], float) for r in train)
    assert all(r["samples_per_s"] > 0 for r in train[1:])
    assert _sys_ranks(run) == {0, 1}
