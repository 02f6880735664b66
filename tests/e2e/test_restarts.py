"""`xl launch --max-restarts N` as a torchrun user expects it: torchrun restarts every rank after a
failure, the run goes on, each restart is an attempt in the run dir (a `restarted` event, the
ranks' `attempt` in run.json) and shown; the run fails only when torchrun gives up. Real torchrun,
CPU ranks, the real `xl` command. Also: memory reads in one style everywhere (xl.units)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from procs import kill_run, run_json, wait_no_processes, wait_run, xl, xl_env

from xl.launcher.supervisor.loop import Supervisor
from xl.launcher.supervisor.ranks import Change, RankChange
from xl.launcher.supervisor.stopping import StopReason
from xl.units import mib

# Rank 1 fails on torchrun's first attempt (rank 0 waits to be stopped by torchrun); every rank
# succeeds on the next one.
FLAKY = """
import os, time
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {rank} attempt {attempt}", flush=True)
if attempt == 0:
    if rank == 1:
        time.sleep(0.5)
        raise RuntimeError("flaky on the first attempt")
    time.sleep(60)
print(f"rank {rank} done", flush=True)
"""


def _events(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.mark.e2e
@pytest.mark.parametrize("restarts", [1, 0])
def test_a_rank_failing_once_is_restarted_and_the_run_succeeds_only_with_restarts_left(
    tmp_path: Path, restarts: int
) -> None:
    home = tmp_path / "home"
    (tmp_path / "flaky.py").write_text(textwrap.dedent(FLAKY))
    args = ["launch", "--no-tui", "--nproc", "2", "--max-restarts", str(restarts), "flaky.py"]
    proc = xl(args, xl_env(home, XL_STOP_GRACE="1"), cwd=tmp_path, timeout=120)
    run_dir = wait_run(home)
    try:
        run = run_json(run_dir)
        events = _events(run_dir)
        restarted = [e for e in events if e["kind"] == "restarted"]
        started = [e for e in events if e["kind"] == "rank_started"]
        if restarts:
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert run["status"] == "succeeded" and run["failure"] is None
            assert [e["attempt"] for e in restarted] == [1], events
            assert "rank 1" in str(restarted[0]["message"]) and "attempt 2 of 2" in str(
                restarted[0]["message"]
            )
            assert [
                (r["rank"], r["attempt"], r["state"], r["exit_code"]) for r in run["ranks"]
            ] == [
                (0, 1, "exited", 0),
                (1, 1, "exited", 0),
            ]
            # Each rank started twice, as two processes; run.json holds the second one's pid.
            for rank in (0, 1):
                pids = [e["pid"] for e in started if e["rank"] == rank]
                assert len(pids) == 2 and pids[0] != pids[1], started
                assert run["ranks"][rank]["pid"] == pids[1]
            log = (run_dir / "logs" / "rank-1.log").read_text()
            assert (
                "rank 1 attempt 0" in log
                and "flaky on the first attempt" in log
                and "rank 1 done" in log
            )
            # The plain view says so as it happens.
            assert "torchrun restarted the ranks" in proc.stdout, proc.stdout
        else:
            assert proc.returncode == 1, proc.stdout + proc.stderr
            assert run["status"] == "failed" and restarted == []
            assert (
                run["failure"]["rank"] == 1
                and "flaky on the first attempt" in run["failure"]["message"]
            )
            assert [r["attempt"] for r in run["ranks"]] == [0, 0]
        wait_no_processes(run_dir, timeout=5)
    finally:
        kill_run(run_dir)


def _unit_run_dir(tmp_path: Path, max_restarts: int) -> Path:
    """A one-rank run dir as start_run leaves it, for a supervisor that is never started."""
    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    record = {
        "run_id": f"unit-{os.getpid()}-{time.monotonic_ns()}",
        "status": "running",
        "spec": {"max_restarts": max_restarts},
        "nnodes": 1,
        "node_rank": 0,
        "nproc_per_node": 1,
        "world_size": 1,
        "host": "here",
        "grace_s": 0.3,
        "ranks": [],
        "failure": None,
    }
    (run_dir / "run.json").write_text(json.dumps(record))
    return run_dir


def _ended_pid(code: int) -> int:
    """The pid of a process already gone (as a rank that failed fast): its environment is
    unreadable."""
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    assert proc.wait(10) == code
    return proc.pid


def test_each_failure_with_restarts_left_is_an_attempt_and_the_last_one_is_the_cause(
    tmp_path: Path,
) -> None:
    run_dir = _unit_run_dir(tmp_path, max_restarts=2)
    sup = Supervisor(run_dir)
    st = sup.ranks.get(0)
    assert st is not None
    for attempt in range(3):
        sup.act(sup.ranks.hello(0, _ended_pid(1)))
        assert st.attempt == attempt and st.state.value == "running"
        # what the rank's record (or its vanishing) tells Ranks
        sup.act([RankChange(Change.ENDED, st, 1)])
        if attempt < 2:
            # torchrun has restarts left: no cause, no stop.
            assert sup.cause.failure is None and sup.stopping.current is None
    # The last attempt's failure: the stop at once, the cause on the loop's next look.
    assert sup.cause.decide(sup.ranks, None, sup.sink.drain) is not None
    assert sup.cause.failure is not None and sup.cause.failure.rank == 0
    assert sup.stopping.current is not None and sup.stopping.current.reason is StopReason.FAILURE
    sup.save()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["attempt"] == 2 and run["ranks"][0]["attempt"] == 2
    events = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]
    restarted = [e for e in events if e["kind"] == "restarted"]
    assert [e["attempt"] for e in restarted] == [1, 2]
    assert (
        restarted[0]["message"]
        == "torchrun restarted the ranks after rank 0 exited with code 1 (attempt 2 of 3)"
    )
    assert [e["kind"] for e in events].count("failure") == 1


@pytest.mark.e2e
def test_restarts_across_nodes_are_refused_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    args = [
        "launch", "--max-restarts", "2", "--nnodes", "2", "--node-rank", "0", "--rdzv",
        "127.0.0.1:29555", "train.py",
    ]
    proc: subprocess.CompletedProcess[str] = xl(args, xl_env(tmp_path / "home"), cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and "--max-restarts 2 with --nnodes 2" in lines[0]
        and "drop --max-restarts" in lines[0]
    )
    assert not (tmp_path / "home" / "runs").exists() or not any(
        (tmp_path / "home" / "runs").iterdir()
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "-"),
        (float("nan"), "-"),
        (0, "0M"),
        (512.4, "512M"),
        (999.4, "999M"),
        # Near-equal sizes read alike: never "1000M" beside "1.0G".
        (1000, "1.0G"),
        (1024, "1.0G"),
        (1126, "1.1G"),
        (81559, "79.6G"),
    ],
)
def test_memory_reads_in_one_style(value: float | None, shown: str) -> None:
    assert mib(value) == shown


def test_the_plain_view_and_the_app_format_memory_alike() -> None:
    from xl.launcher.cli import endtable  # noqa: PLC0415 - the two views under comparison
    from xl.tui import fmt  # noqa: PLC0415 - as above

    assert endtable.mib is mib and fmt.mib is mib
