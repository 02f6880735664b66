"""One story for one kill: SIGKILL of one rank of a real Accelerate program (DDP over gloo, two CPU
ranks, real torchrun under the real `xl launch`), at a random moment, several times. Whatever
order the supervisor finds the two ranks gone in, every place says the same rank, exit and
cause: the live lines, the one `failure` event, run.json, `xl runs --json`, `xl attach`, the
Monitor's reader (its banner) and the exporter. The killed rank is never said "stopped" (xl did
not stop it), no rank is said to have ended with its exit code unknown, and the survivor (whose
peer vanished under it) is never the cause. Every run's processes are gone after it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from procs import run_json, wait_no_processes, wait_ranks_running, wait_run, xl, xl_env
from supervised import GRACE, popen_launch

from xl.launcher.exporter.metrics import failure_labels
from xl.launcher.view.reader import RunReader

pytestmark = pytest.mark.e2e

PROGRAM = Path(__file__).parents[1] / "support" / "accelerate_ddp.py"
KILLS = 4


def _kill_one(tmp_path: Path, victim: int, delay: float) -> tuple[str, Path, dict[str, Any]]:
    home = tmp_path / "home"
    env = xl_env(home)
    proc = popen_launch(["--nproc", "2", str(PROGRAM)], env, tmp_path)
    try:
        run_dir = wait_run(home, timeout=240)
        wait_ranks_running(run_dir, 2, timeout=240)
        # a random moment of its training (the ranks step every ~10 ms)
        time.sleep(delay)
        pid = next(r["pid"] for r in run_json(run_dir)["ranks"] if r["rank"] == victim)
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    wait_no_processes(run_dir, timeout=GRACE + 30)
    assert proc.returncode == 1, out + err
    return out, run_dir, env


@pytest.mark.parametrize("kill", range(KILLS))
def test_a_killed_rank_is_one_story_everywhere(tmp_path: Path, kill: int) -> None:
    victim, survivor = (1, 0) if kill % 2 == 0 else (0, 1)
    out, run_dir, env = _kill_one(tmp_path, victim, random.uniform(0.0, 1.5))
    said = f"rank {victim} was killed by SIGKILL"
    # run.json: the killed rank failed with its signal; the survivor was ended because of it.
    run = run_json(run_dir)
    failure = run["failure"]
    assert (failure["rank"], failure["exit_code"]) == (victim, -signal.SIGKILL), failure
    assert failure["message"] == f"rank {victim} failed first: {said}"
    cause = failure["cause"]
    assert cause["kind"] == "killed" and cause["summary"].startswith("killed by SIGKILL"), cause
    rows = {r["rank"]: (r["state"], r["exit_code"]) for r in run["ranks"]}
    assert rows[victim] == ("failed", -signal.SIGKILL) and rows[survivor][0] == "stopped", rows
    # The one failure event: the same rank, exit and cause; each rank's end said once, with its
    # exit, the killed rank's before the failure (the survivor may end after the decision).
    events = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]
    failures = [e for e in events if e["kind"] == "failure"]
    assert len(failures) == 1, failures
    assert (failures[0]["rank"], failures[0]["exit_code"], failures[0]["cause"]) == (
        victim, -signal.SIGKILL, cause,
    )
    exits = [e for e in events if e["kind"] == "rank_exited"]
    assert sorted(e["rank"] for e in exits) == [0, 1], exits
    by_rank = {e["rank"]: e for e in exits}
    assert events.index(by_rank[victim]) < events.index(failures[0]), events
    assert by_rank[victim]["message"] == said and by_rank[victim]["exit_code"] == -9
    assert by_rank[survivor]["exit_code"] is not None, by_rank
    # The live lines: what the events say, never "stopped" for the killed rank, never unknown.
    live = [ln.split(" xl: ", 1)[-1] for ln in out.splitlines() if " xl: rank " in ln]
    assert said in live and f"rank {victim} failed first: {said}" in live, out
    assert not any(ln.startswith(f"rank {victim} stopped") for ln in live), live
    assert not any("exit code unknown" in ln for ln in live), live
    assert f"cause: {cause['summary']}" in out.splitlines(), out
    # xl runs --json, xl attach, the Monitor's reader, the exporter: the same.
    listed = {r["run_id"]: r for r in json.loads(xl(["runs", "--json"], env, timeout=60).stdout)}
    mine = listed[run_dir.name]
    assert (mine["failure"]["rank"], mine["failure"]["exit_code"], mine["cause"]) == (
        victim, -signal.SIGKILL, cause,
    )
    attached = xl(["attach", run_dir.name, "--no-tui"], env, timeout=60).stdout.splitlines()
    assert f"cause: {cause['summary']}" in attached and any(
        ln.endswith(f": rank {victim} failed first: {said}") for ln in attached
    ), attached
    view = RunReader(run_dir).poll()
    assert view.failure is not None
    assert (view.failure.rank, view.failure.exit_code) == (victim, -signal.SIGKILL)
    assert view.failure.cause is not None and view.failure.cause.to_json() == cause
    labels = failure_labels(view.record, view.failure, "here")
    assert labels is not None and (labels["rank"], labels["exit_code"], labels["kind"]) == (
        str(victim), "-9", "killed",
    )


def test_the_program_runs_well_when_nothing_kills_it(tmp_path: Path) -> None:
    """The same program, stopped with `xl stop` instead of a kill: no failure, no cause, every
    rank said "stopped" (xl did stop them)."""
    home = tmp_path / "home"
    env = xl_env(home)
    proc = popen_launch(["--nproc", "2", str(PROGRAM)], env, tmp_path)
    try:
        run_dir = wait_run(home, timeout=240)
        wait_ranks_running(run_dir, 2, timeout=240)
        xl(["stop", run_dir.name], env, timeout=60)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    wait_no_processes(run_dir, timeout=GRACE + 30)
    run = run_json(run_dir)
    assert run["status"] == "stopped" and run["failure"] is None, out + err
    events = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["kind"] == "failure"]
    exits = sorted(e["message"] for e in events if e["kind"] == "rank_exited")
    assert len(exits) == 2 and all(" stopped" in m for m in exits), exits
