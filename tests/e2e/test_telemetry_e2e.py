"""2-rank CPU runs under real torchrun, with Telemetry standing in for the supervisor."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from xltele import REPO, SUPPORT, torchrun

pytestmark = pytest.mark.e2e


def _sys_ranks(run) -> set[int]:
    return {r["rank"] for r in run.metrics("sys") if "rss_mib" in r}


def test_a_hung_rank_is_named_stalled_and_holding_up_the_rank_waiting_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rank 1 stops (stops logging too) before step 15; rank 0 then blocks in that step's
    # all-reduce. Both make no progress; xl.watch tells the culprit from its victim.
    monkeypatch.setenv("XL_STALL_MIN_S", "4")  # read by the Diagnoser in this process

    def until_both_stalled(tel, proc) -> None:
        deadline = time.monotonic() + 90
        while tel.diagnoser.named() != {0: "stalled", 1: "stalled"}:
            assert proc.poll() is None, "the run ended before the hang was diagnosed"
            assert time.monotonic() < deadline, "no stall diagnosed"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGTERM)  # what `xl stop` does to a hung run

    run = torchrun(
        tmp_path / "run",
        SUPPORT / "telemetry_ddp.py",
        ["--steps", "100000", "--watch", "--hang-rank", "1", "--hang-at", "15"],
        during=until_both_stalled,
    )
    assert run.returncode != 0
    for rank in (0, 1):
        steps = [r["step"] for r in run.train(rank)]
        assert steps == list(range(1, 15))
    stalled = {e["rank"]: e for e in run.events if e["kind"] == "stalled"}
    assert set(stalled) == {0, 1}
    assert stalled[1]["holding_up"] == [0]
    assert "rank 1 is holding them up" in stalled[1]["message"]
    assert stalled[0]["waiting_s"] >= 1 and "waiting" in stalled[0]["message"]
    assert "holding_up" not in stalled[0]
    assert not [e for e in run.events if e["kind"] == "straggler"]
    assert _sys_ranks(run) == {0, 1}


def test_hf_trainer_with_xlcallback_logs_every_rank(tmp_path: Path) -> None:
    run = torchrun(tmp_path / "run", REPO / "examples" / "hf_trainer.py", ["--steps", "8"])
    assert run.returncode == 0, run.output[-2000:]
    losses = {}
    for rank in (0, 1):
        train = run.train(rank)
        assert max(r["step"] for r in train) == 8
        # each rank's own loss at every step (they see different batches), plus HF's average
        losses[rank] = [r["loss"] for r in train if "loss" in r]
        assert len(losses[rank]) == 8 and all(isinstance(v, float) for v in losses[rank])
        assert any(isinstance(r.get("hf_loss"), float) for r in train)
        assert any("lr" in r and "grad_norm" in r for r in train)
        assert any(r.get("samples_per_s", 0) > 0 for r in train)
        # batch 4 x 16 tokens per step: tokens/s is 16x samples/s
        rated = [r for r in train if "tokens_per_s" in r]
        assert rated and all(r["tokens"] == 64 for r in rated)
        assert all(
            r["tokens_per_s"] == pytest.approx(16 * r["samples_per_s"], rel=1e-3) for r in rated
        )
        assert all(r.get("source") != "log" for r in train), "printed dicts must not double up"
    assert losses[0] != losses[1]
    assert _sys_ranks(run) == {0, 1}


def test_accelerate_tracker(tmp_path: Path) -> None:
    run = torchrun(tmp_path / "run", REPO / "examples" / "accelerate_train.py", ["--steps", "8"])
    assert run.returncode == 0, run.output[-8000:]
    train = run.train(0)
    assert [r["step"] for r in train] == list(range(1, 9))
    assert all(isinstance(r["loss"], float) for r in train)
    assert all(r["samples_per_s"] > 0 for r in train[1:])
    assert _sys_ranks(run) == {0, 1}
