"""`last` is the newest run for every command; when that one has ended while an older one still
runs, each command says so and names the running one (real `xl launch` runs on torchrun)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from procs import (
    kill_run,
    run_dirs,
    run_json,
    wait_final,
    wait_for,
    wait_no_processes,
    wait_ranks_running,
    xl,
    xl_env,
)

pytestmark = pytest.mark.e2e

TRAINS = """
import time
print("ready", flush=True)
while True:
    time.sleep(0.2)
"""
FAILS = "raise SystemExit('bad config')\n"


def test_last_names_the_run_still_running_when_the_newest_has_ended(tmp_path: Path) -> None:
    (tmp_path / "trains.py").write_text(TRAINS)
    (tmp_path / "fails.py").write_text(FAILS)
    home = tmp_path / "home"
    env = xl_env(home)
    started = xl(
        ["launch", "--detach", "--nproc", "1", "trains.py"], env, cwd=tmp_path, timeout=120
    )
    assert started.returncode == 0, started.stdout + started.stderr
    trains = wait_for(
        lambda: run_dirs(home)[0] if run_dirs(home) else None, timeout=60, what="the run dir"
    )
    fails: Path | None = None
    try:
        wait_ranks_running(trains, 1, timeout=90)
        # The newest runs: `last` is that one and nothing more is said.
        logs = xl(["logs", "last"], env, timeout=60)
        assert (
            logs.returncode == 0 and "ready" in logs.stdout and "still running" not in logs.stderr
        ), logs.stderr
        time.sleep(1.1)  # run ids and start times order the runs: the failing one is newer
        done = xl(
            ["launch", "--no-tui", "--nproc", "1", "fails.py"], env, cwd=tmp_path, timeout=120
        )
        fails = next(d for d in run_dirs(home) if d != trains)
        assert done.returncode != 0 and run_json(fails)["status"] == "failed", (
            done.stdout + done.stderr
        )
        note = (
            f"xl: the last run, {fails.name}, already failed; {trains.name} is still running; for "
            f"it: 'xl CMD {trains.name}'"
        )

        stop = xl(["stop", "last"], env, timeout=60)
        assert stop.returncode == 0 and stop.stdout.strip() == f"{fails.name} already failed", (
            stop.stdout + stop.stderr
        )
        assert note.replace("CMD", "stop") in stop.stderr, stop.stderr
        # `last` never stops another run than the newest
        assert run_json(trains)["status"] == "running"

        logs = xl(["logs", "last"], env, timeout=60)
        assert "bad config" in logs.stdout and note.replace("CMD", "logs") in logs.stderr, (
            logs.stdout + logs.stderr
        )
        stacks = xl(["stacks", "last"], env, timeout=60)
        assert stacks.returncode != 0 and note.replace("CMD", "stacks") in stacks.stderr, (
            stacks.stderr
        )
        attach = xl(["attach", "last", "--no-tui"], env, timeout=60)
        assert attach.returncode != 0 and note.replace("CMD", "attach") in attach.stderr, (
            attach.stderr
        )
        # The command it names works: it reaches the run that trains.
        named = xl(["stacks", trains.name], env, timeout=60)
        assert named.returncode == 0 and "trains.py" in named.stdout, named.stdout + named.stderr

        stopped = xl(["stop", trains.name], env, timeout=90)
        assert stopped.returncode == 0 and run_json(trains)["status"] == "stopped", (
            stopped.stdout + stopped.stderr
        )
        # Nothing runs any more: `last` is the failed run and nothing more is said.
        logs = xl(["logs", "last"], env, timeout=60)
        assert "bad config" in logs.stdout and logs.stderr == "", logs.stderr
        wait_final(trains, timeout=30)
        wait_no_processes(trains, timeout=15)
        wait_no_processes(fails, timeout=15)
    finally:
        kill_run(trains)
        if fails is not None:
            kill_run(fails)
