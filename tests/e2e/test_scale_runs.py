"""Runs at scale (docs/security.md): ten launches at once, 10,000 metric keys a step, 64 CPU
ranks. Each is recorded whole, loses no step and costs a bounded record.

Real `xl launch` on real torchrun with CPU ranks; every test checks that nothing it started is
left.
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from procs import (
    end_run,
    kill_run,
    run_dirs,
    run_json,
    wait_no_processes,
    wait_run,
    xl,
    xl_env,
)

pytestmark = pytest.mark.e2e

# argv: GO_FILE. Prints, then waits for the go file (at most two minutes: never outlives a test).
WAIT_FOR_GO = textwrap.dedent(
    """
    import os, sys, time
    print("ready", flush=True)
    deadline = time.time() + 120
    while not os.path.exists(sys.argv[1]) and time.time() < deadline:
        time.sleep(0.05)
    """
)


def test_ten_launches_at_once_make_ten_runs_that_all_succeed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = xl_env(home)
    (tmp_path / "train.py").write_text(WAIT_FOR_GO)
    go = tmp_path / "go"
    go.touch()  # each run ends as soon as it starts

    def launch(i: int) -> subprocess.CompletedProcess[str]:
        return xl(
            [
                "launch",
                "--no-tui",
                "--name",
                f"same-name-{i % 2}",
                "--nproc",
                "1",
                "train.py",
                str(go),
            ],
            env,
            cwd=tmp_path,
            timeout=480,
        )

    try:
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            results = list(pool.map(launch, range(10)))
        assert [r.returncode for r in results] == [0] * 10, [
            r.stderr[-500:] for r in results if r.returncode
        ]
        dirs = run_dirs(home)
        assert len({d.name for d in dirs}) == 10, [d.name for d in dirs]
        assert [run_json(d)["status"] for d in dirs] == ["succeeded"] * 10
        listed = xl(["runs", "--json"], env, timeout=60)
        assert listed.returncode == 0 and len(json.loads(listed.stdout)) == 10, listed.stderr
    finally:
        for run_dir in run_dirs(home):
            end_run(None, run_dir, timeout=60)


MANY_KEYS = textwrap.dedent(
    """
    import xl
    keys = {f"key_{i:05d}": float(i) for i in range(10_000)}
    for step in range(1, 31):
        xl.log(step=step, loss=1.0 / step, **keys)
    assert xl.flush(timeout=30)
    print("logged 30 steps", flush=True)
    """
)


def test_ten_thousand_metric_keys_a_step_cost_a_bounded_record_and_lose_no_step(
    tmp_path: Path,
) -> None:
    """A script that logs 10,000 keys with each step: each step is stored once, its own step
    and loss first, within the wire's cap of keys; the run succeeds."""
    from xl import wire  # noqa: PLC0415 - the cap, read where it is used

    home = tmp_path / "home"
    (tmp_path / "train.py").write_text(MANY_KEYS)
    done = xl(
        ["launch", "--no-tui", "--nproc", "2", "train.py"], xl_env(home), cwd=tmp_path, timeout=240
    )
    run_dir = wait_run(home)
    try:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert run_json(run_dir)["status"] == "succeeded"
        lines = [
            json.loads(line)
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()
        ]
        for rank in (0, 1):
            train = [
                r
                for r in lines
                if r.get("kind") == "train" and r.get("rank") == rank and "key_00000" in r
            ]
            assert sorted(r["step"] for r in train) == list(range(1, 31)), f"rank {rank}"
            assert all(r["loss"] == 1.0 / r["step"] for r in train)
            assert all(len(r) <= wire.MAX_KEYS + 16 for r in train), max(len(r) for r in train)
        wait_no_processes(run_dir, timeout=60)
    finally:
        kill_run(run_dir)


RANKS = 64
TINY_RANK = textwrap.dedent(
    """
    import os, sys
    import xl
    rank = int(os.environ["RANK"])
    for step in range(1, 6):
        xl.log(step=step, loss=float(rank))
    assert xl.flush(timeout=120)
    print(f"rank {rank} of {os.environ['WORLD_SIZE']} done", flush=True)
    """
)


def test_sixty_four_cpu_ranks_run_and_are_each_recorded(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (tmp_path / "train.py").write_text(TINY_RANK)
    done = xl(
        ["launch", "--no-tui", "--nproc", str(RANKS), "train.py"],
        xl_env(home),
        cwd=tmp_path,
        timeout=540,
    )
    run_dir = wait_run(home)
    try:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        rec = run_json(run_dir)
        assert rec["status"] == "succeeded" and sorted(r["rank"] for r in rec["ranks"]) == list(
            range(RANKS)
        )
        assert all(r["exit_code"] == 0 for r in rec["ranks"]), rec["ranks"]
        lines = [
            json.loads(line)
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()
        ]
        for rank in range(RANKS):
            steps = sorted(
                r["step"]
                for r in lines
                if r.get("kind") == "train" and r.get("rank") == rank and "loss" in r
            )
            assert steps == [1, 2, 3, 4, 5], f"rank {rank}: {steps}"
            log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
            assert f"rank {rank} of {RANKS} done" in log
        wait_no_processes(run_dir, timeout=120)
    finally:
        kill_run(run_dir)


