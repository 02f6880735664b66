"""A healthy but unusual run: one rank evaluates for a while outside the training loop, so the
other waits for it in the all-reduce with no progress, exactly as in a hang. The real `xl launch`
must say what it sees (a stall, the rank working on the CPU, where) and never call it a hang; the
run trains on and succeeds. The other way round (a rank blocked, named as a hang) is in
test_stacks_e2e.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from procs import XL, first_run, run_json, wait_no_processes, xl_env
from where import SUPPORT

pytestmark = pytest.mark.e2e


def test_a_long_evaluation_on_one_rank_is_a_stall_that_says_it_works_not_a_hang(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    argv = [
        *XL, "launch", "--no-tui", "--nproc", "2", str(SUPPORT / "hang_ddp.py"), "--mode", "eval",
        "--rank", "0", "--at", "3", "--steps", "8", "--eval-s", "14",
    ]
    done = subprocess.run(
        argv,
        env=xl_env(home, XL_STALL_MIN_S="5"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = done.stdout + done.stderr
    run_dir = first_run(home)
    assert run_dir is not None, out[-3000:]
    try:
        assert done.returncode == 0 and run_json(run_dir)["status"] == "succeeded", out[-3000:]
        said = [line for line in out.splitlines() if "never entered" in line]
        assert len(said) == 1 and " xl: stalled: rank 0 never entered all_reduce #" in said[0], out[
            -3000:
        ]
        assert (
            "it is in compute at hang_ddp.py:" in said[0]
            and "working at " in said[0]
            and "% CPU (a long computation" in said[0]
        )
        assert " xl: hang:" not in out
        assert "rank 0 made progress again" in out and "rank 1 waits in all_reduce #" in out
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        [hang] = [e for e in events if e["kind"] == "hang"]
        assert hang["ranks"] == [0] and hang["busy"] == [0]
    finally:
        wait_no_processes(run_dir, timeout=30)
