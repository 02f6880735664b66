"""One hang, one story (real `xl launch --no-tui`, real torchrun with two CPU gloo ranks): the
culprit named within the stall threshold and a few seconds, before any "made no progress" line,
and every line after in time order. Beside it, a rank that is slow but progresses is left alone
(a long evaluation is test_stall_working.py's)."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from procs import XL, first_run, kill_run, run_json, wait_for, wait_no_processes, xl, xl_env
from where import SUPPORT

pytestmark = pytest.mark.e2e

STALL_MIN_S = 5.0

# Rank 1 goes astray at step 6, outside any collective. Rank 0 logs each step 1.5 s after its
# all-reduce, so its last progress is 1.5 s younger than rank 1's: the culprit passes the
# threshold first, its victim only later (as in a real program whose ranks log at different
# moments of a step).
SCRIPT = """
import time
import torch
import torch.distributed as dist
import xl

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(8)
dist.all_reduce(t)
for step in range(1, 100000):
    if rank == 1 and step == 6:
        print("rank 1 goes astray", flush=True)
        time.sleep(3600)
    dist.all_reduce(t)
    if rank == 0:
        time.sleep(1.5)
    xl.log(step=step, loss=1.0 / step)
    time.sleep(0.05)
"""


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def _last_progress(run_dir: Path, rank: int) -> float:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return max(
        m["t"]
        for m in map(json.loads, lines)
        if m["rank"] == rank and m["kind"] == "train" and "step" in m
    )


def test_a_hang_is_named_first_within_the_threshold_and_its_lines_keep_time_order(
    tmp_path: Path,
) -> None:
    script = tmp_path / "lag.py"
    script.write_text(textwrap.dedent(SCRIPT))
    home = tmp_path / "home"
    env = xl_env(home, XL_STALL_MIN_S=str(STALL_MIN_S), XL_STALL_FACTOR="2", OMP_NUM_THREADS="1")
    view = subprocess.Popen(
        [*XL, "launch", "--no-tui", "--nproc", "2", str(script)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run_dir = None
    try:
        run_dir = wait_for(lambda: first_run(home), timeout=60, what="the run dir")
        wait_for(
            lambda: any(e["kind"] == "hang" for e in _events(run_dir)),
            timeout=120,
            what="the hang named",
        )
        time.sleep(3)  # what would follow it (stalls said again, re-dated) has come
        stop = xl(["stop", run_dir.name], env, timeout=90)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        out, _ = view.communicate(timeout=120)
        events = _events(run_dir)
        kinds = [e["kind"] for e in events if e["kind"] in ("hang", "stalled")]
        # The culprit once known, first: no "made no progress" line of either rank before it.
        assert kinds[0] == "hang" and kinds.count("hang") == 1, kinds
        [hang] = [e for e in events if e["kind"] == "hang"]
        assert hang["ranks"] == [1] and "rank 1 never entered all_reduce #" in hang["message"]
        # Within the threshold and 5 s of the culprit's last step (its threshold: the least one,
        # 5 s; twice its median step, ~3 s, is less).
        late = hang["t"] - _last_progress(run_dir, 1)
        assert late <= STALL_MIN_S + 5.0, late
        stalled = [e for e in events if e["kind"] == "stalled"]
        assert {e["rank"] for e in stalled} == {0, 1}, stalled
        assert all(e["t"] >= hang["t"] for e in stalled), (hang, stalled)
        assert [e["t"] for e in events] == sorted(e["t"] for e in events), events
        # The plain view says the same, in the same order, its times never going back.
        said = [ln for ln in out.splitlines() if re.match(r"\d\d:\d\d:\d\d xl: ", ln)]
        stories = [ln for ln in said if "no progress" in ln or " xl: hang: " in ln]
        assert " xl: hang: rank 1 never entered" in stories[0], out[-3000:]
        assert [ln[:8] for ln in said] == sorted(ln[:8] for ln in said), said
        assert any("rank 0 waits in all_reduce #" in ln and "for rank 1" in ln for ln in stories)
        assert run_json(run_dir)["status"] == "stopped"
        wait_no_processes(run_dir, timeout=30)
    finally:
        if view.poll() is None:
            view.kill()
            view.wait(timeout=30)
        if run_dir is not None:
            kill_run(run_dir)


def test_a_slow_rank_that_progresses_is_no_stall_and_no_hang(tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = [
        "launch", "--no-tui", "--nproc", "2", str(SUPPORT / "hang_ddp.py"), "--mode", "slow",
        "--rank", "1", "--slow-s", "0.6", "--steps", "25",
    ]  # fmt: skip
    env = xl_env(home, XL_STALL_MIN_S="3", OMP_NUM_THREADS="1")
    done = xl(args, env, cwd=tmp_path, timeout=240)
    run_dir = first_run(home)
    assert run_dir is not None, done.stdout[-3000:] + done.stderr[-3000:]
    try:
        assert done.returncode == 0, done.stdout[-3000:]
        kinds = {e["kind"] for e in _events(run_dir)}
        assert not kinds & {"hang", "stalled"}, kinds
        assert " xl: hang" not in done.stdout and "no progress" not in done.stdout
        wait_no_processes(run_dir, timeout=30)
    finally:
        kill_run(run_dir)
