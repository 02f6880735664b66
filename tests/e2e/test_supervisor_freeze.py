"""A supervisor frozen mid-run (SIGSTOP, as a swapping or overloaded host does to it) loses no
record and blames no healthy rank; a rank that really stopped meanwhile is still named.

A real run (`xl launch`, torchrun, two CPU ranks) logs a step every 0.1 s and writes each step it
logged to a file of its own (the ground truth). The test stops the real supervisor for 20 s
(longer than the stall threshold, 8 s here) and lets it go on. Rank 1 is held still from the
freeze until the test has seen its stall named; rank 0 keeps stepping throughout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from procs import (
    XL,
    end_run,
    run_json,
    wait_for,
    wait_ranks_running,
    wait_run,
    xl_env,
)

pytestmark = pytest.mark.e2e

FREEZE_S = 20.0
SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import xl
    rank = int(os.environ["RANK"])
    here = sys.argv[1]
    steps = open(os.path.join(here, f"steps-{rank}.txt"), "w")
    print("ready", flush=True)
    step = 0
    while not os.path.exists(os.path.join(here, "end")):
        while rank == 1 and os.path.exists(os.path.join(here, "hold")):
            time.sleep(0.1)  # rank 1 held still: no step while the file is there
        step += 1
        xl.log(step=step, loss=1.0 / step, samples=4)
        steps.write(f"{step}\\n")
        steps.flush()
        time.sleep(0.1)
    print("flushed", xl.flush(timeout=30), flush=True)
    """
)


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if path.exists()
        else []
    )


def test_a_frozen_supervisor_loses_no_record_and_blames_only_the_rank_that_stopped(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    home = tmp_path / "home"
    env = xl_env(home, XL_STALL_MIN_S="8")
    launch = subprocess.Popen(
        [*XL, "launch", "--no-tui", "--nproc", "2", "train.py", str(tmp_path)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run_dir = None
    supervisor = None
    try:
        run_dir = wait_run(home)
        wait_ranks_running(run_dir, 2, timeout=90)
        wait_for(
            lambda: (
                all(
                    len((tmp_path / f"steps-{r}.txt").read_text().split()) >= 20
                    for r in (0, 1)
                    if (tmp_path / f"steps-{r}.txt").exists()
                )
                and (tmp_path / "steps-1.txt").exists()
            ),
            timeout=60,
            what="both ranks stepping",
        )
        supervisor = int(run_json(run_dir)["supervisor_pid"])
        os.kill(supervisor, signal.SIGSTOP)
        (tmp_path / "hold").touch()
        held_at = len((tmp_path / "steps-1.txt").read_text().split())
        time.sleep(FREEZE_S)
        os.kill(supervisor, signal.SIGCONT)
        supervisor = None
        # Rank 1 stopped stepping during the freeze: named once its threshold has passed.
        wait_for(
            lambda: any(
                e.get("kind") == "stalled" and e.get("rank") == 1 for e in _events(run_dir)
            ),
            timeout=90,
            what="rank 1's stall",
        )
        (tmp_path / "hold").unlink()
        wait_for(
            lambda: len((tmp_path / "steps-1.txt").read_text().split()) > held_at + 20,
            timeout=60,
            what="rank 1 stepping again",
        )
        (tmp_path / "end").touch()
        out, _ = launch.communicate(timeout=120)
        assert launch.returncode == 0, out[-3000:]
        # xl.flush() said every record was stored
        assert "[rank 0] flushed True" in out and "[rank 1] flushed True" in out, out[-3000:]
        events = _events(run_dir)
        # The supervisor says it was paused; it blames rank 0, which stepped throughout,
        # for nothing.
        blamed = [
            e
            for e in events
            if e.get("kind") in ("stalled", "hang", "straggler") and e.get("rank") == 0
        ]
        assert not blamed, blamed
        assert not [e for e in events if e.get("kind") == "hang" and 0 in (e.get("ranks") or [])], (
            events
        )
        paused = [e for e in events if e.get("kind") == "supervisor_paused"]
        assert paused and paused[0]["paused_s"] >= FREEZE_S - 2, events
        assert not [e for e in events if e.get("kind") == "dropped"], events
        # Every step each rank logged is in metrics.jsonl, once.
        stored: dict[int, list[int]] = {0: [], 1: []}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "train" and rec.get("rank") in stored:
                stored[rec["rank"]].append(int(rec["step"]))
        for rank in (0, 1):
            logged = [int(s) for s in (tmp_path / f"steps-{rank}.txt").read_text().split()]
            missing = sorted(set(logged) - set(stored[rank]))
            assert not missing, (rank, missing[:20], len(logged))
            assert sorted(stored[rank]) == logged, f"rank {rank}: a step stored twice"
    finally:
        (tmp_path / "end").touch()
        (tmp_path / "hold").unlink(missing_ok=True)
        if supervisor is not None:
            os.kill(supervisor, signal.SIGCONT)
        end_run(launch, run_dir)
