"""The supervisor with real processes (torchrun, CPU ranks, the real `xl`): a run's outcome.

A run that succeeds keeps each rank's output apart and tells each rank its environment; a run
that fails names the rank that failed first, with its traceback, its last lines when it left no
traceback, or the signal that killed it. Every test checks that no process of the run is left.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
from pathlib import Path

import pytest
from procs import launched_run, run_json, wait_no_processes, xl_env
from supervised import GRACE, write_script

pytestmark = pytest.mark.e2e

REPORTER = """
import json, os, sys
rank = int(os.environ["RANK"])
keys = ["XL_RUN_ID", "XL_RUN_DIR", "XL_COLLECTOR", "XL_TOKEN", "CUDA_DEVICE_ORDER",
        "CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "WORLD_SIZE", "FOO"]
print("env " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
for i in range(3):
    print(f"out rank={rank} line={i}", flush=True)
    print(f"err rank={rank} line={i}", file=sys.stderr, flush=True)
print("args " + json.dumps(sys.argv[1:]), flush=True)
"""


FAILER = """
import os, threading, time
rank = int(os.environ["RANK"])
print("ready", flush=True)

def explode():
    raise ValueError(f"boom from rank {rank}")

if rank == 1:
    time.sleep(0.3)
    # A non-daemon thread keeps the failed process alive after its exception (as a stuck
    # NCCL teardown does): it must be ended too.
    threading.Thread(target=time.sleep, args=(120,)).start()
    explode()
time.sleep(120)
"""


EXITER = """
import os, sys, time
if os.environ["RANK"] == "1":
    print("train.py: error: unrecognized arguments: --lr-warmup", file=sys.stderr, flush=True)
    sys.exit(2)  # argparse's way out: no Python traceback to show
time.sleep(60)
"""


def test_run_succeeds_with_separate_rank_logs_and_busy_port_29500(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = write_script(tmp_path, "report.py", REPORTER)
    busy = socket.socket()
    try:
        busy.bind(("0.0.0.0", 29500))
        busy.listen(1)
    except OSError:
        pass  # something else already holds it: busy all the same
    args = ["--nproc", "2", "--env", "FOO=bar", str(script), "--x", "1"]
    with (
        contextlib.closing(busy),
        launched_run(args, xl_env(home), cwd=tmp_path, how="to_end") as launched,
    ):
        proc, run_dir = launched.result, launched.run_dir
        assert proc.returncode == 0, proc.stdout + proc.stderr
        run = run_json(run_dir)
        assert run["status"] == "succeeded"
        assert [r["rank"] for r in run["ranks"]] == [0, 1]
        for r in run["ranks"]:
            assert (
                r["exit_code"] == 0 and r["state"] == "exited" and r["pid"] > 0 and r["gpu"] is None
            )
        for rank in (0, 1):
            log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
            lines = log.splitlines()
            # stdout and stderr of this rank only, in the order written, whole lines.
            assert [ln for ln in lines if ln.startswith(("out ", "err "))] == [
                f"{kind} rank={rank} line={i}" for i in range(3) for kind in ("out", "err")
            ]
            env = json.loads(next(ln for ln in lines if ln.startswith("env "))[4:])
            assert env["XL_RUN_ID"] == run["run_id"]
            assert Path(env["XL_RUN_DIR"]) == run_dir
            assert env["XL_COLLECTOR"] and env["XL_TOKEN"]
            assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["CUDA_VISIBLE_DEVICES"] == ""
            assert (
                env["LOCAL_RANK"] == str(rank) and env["WORLD_SIZE"] == "2" and env["FOO"] == "bar"
            )
            assert json.loads(next(ln for ln in lines if ln.startswith("args "))[5:]) == [
                "--x",
                "1",
            ]
        kinds = [
            json.loads(ln)["kind"] for ln in (run_dir / "events.jsonl").read_text().splitlines()
        ]
        assert kinds[0] == "run_started" and kinds[-1] == "run_ended", kinds
        assert kinds.count("rank_started") == 2 and kinds.count("rank_exited") == 2, kinds
        # The plain view shows each rank's lines, prefixed, and the outcome.
        assert "[rank 1] out rank=1 line=2" in proc.stdout
        outcome, took = proc.stdout.splitlines()[-2:]
        # It logs no step: the time is said whole, not called all startup.
        assert (
            "succeeded" in outcome
            and took.startswith("time: ")
            and took.endswith(" s (not split into startup and training: no rank logged a step)")
        ), (outcome, took)
        wait_no_processes(run_dir, timeout=GRACE + 2)


def test_failing_rank_without_record_is_root_cause_with_traceback(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = write_script(tmp_path, "fail.py", FAILER)
    with launched_run(
        ["--nproc", "2", str(script)], xl_env(home), cwd=tmp_path, how="to_end"
    ) as launched:
        proc, run_dir = launched.result, launched.run_dir
        assert proc.returncode == 1, proc.stdout + proc.stderr
        run = run_json(run_dir)
        assert run["status"] == "failed"
        failure = run["failure"]
        assert failure["rank"] == 1 and failure["exit_code"] == 1
        tb = failure["traceback"]
        assert tb.startswith("Traceback (most recent call last):")
        assert "ValueError: boom from rank 1" in tb and "in explode" in tb and str(script) in tb
        # The traceback starts in the user's script, not in xl's entry point or runpy.
        assert "entry.py" not in tb and "runpy" not in tb
        ranks = {r["rank"]: r for r in run["ranks"]}
        assert ranks[1]["state"] == "failed" and ranks[1]["exit_code"] == 1
        assert ranks[0]["state"] == "stopped" and ranks[0]["exit_code"] == -signal.SIGTERM
        assert "ValueError: boom from rank 1" in (run_dir / "logs" / "rank-1.log").read_text()
        events = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]
        failures = [e for e in events if e["kind"] == "failure"]
        assert len(failures) == 1 and failures[0]["rank"] == 1
        assert "ValueError: boom from rank 1" in proc.stdout
        wait_no_processes(run_dir, timeout=GRACE + 2)


def test_rank_exiting_without_a_traceback_is_explained_by_its_last_lines(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = write_script(tmp_path, "exiter.py", EXITER)
    with launched_run(
        ["--nproc", "2", str(script)], xl_env(home), cwd=tmp_path, how="to_end"
    ) as launched:
        proc, run_dir = launched.result, launched.run_dir
        assert proc.returncode == 1, proc.stdout + proc.stderr
        failure = run_json(run_dir)["failure"]
        assert failure["rank"] == 1 and failure["exit_code"] == 2
        assert failure["message"].endswith("error: unrecognized arguments: --lr-warmup")
        assert "unrecognized arguments: --lr-warmup" in failure["traceback"]
        wait_no_processes(run_dir, timeout=GRACE + 2)


def test_rank_killed_by_a_signal_is_named_with_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = write_script(tmp_path, "segv.py", """
        import os, signal, time
        print("ready", flush=True)
        if os.environ["RANK"] == "1":
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(120)
    """)
    with launched_run(
        ["--nproc", "2", str(script)], xl_env(home), cwd=tmp_path, how="to_end"
    ) as launched:
        proc, run_dir = launched.result, launched.run_dir
        assert proc.returncode == 1, proc.stdout + proc.stderr
        run = run_json(run_dir)
        assert run["status"] == "failed"
        assert (run["failure"]["rank"], run["failure"]["exit_code"]) == (1, -signal.SIGSEGV)
        assert "SIGSEGV" in run["failure"]["message"]
        ranks = {r["rank"]: (r["state"], r["exit_code"]) for r in run["ranks"]}
        assert ranks == {0: ("stopped", -signal.SIGTERM), 1: ("failed", -signal.SIGSEGV)}
        wait_no_processes(run_dir, timeout=GRACE + 2)


@pytest.mark.parametrize("teardown", ["aborts", "prints"])
def test_a_rank_that_aborts_after_its_script_returned_is_the_cause(
    tmp_path: Path, teardown: str
) -> None:
    """A C++ abort in the interpreter's teardown (a process group's thread never joined, as gloo
    does when destroy_process_group was not called) comes after the script returned 0: the run
    failed, and rank 0 is named with its signal and its last words, not "rank None" or "exited".
    A teardown that only prints (an atexit summary) leaves a run that succeeded."""
    home = tmp_path / "home"
    last = "os.abort()" if teardown == "aborts" else "None"
    script = write_script(tmp_path, "teardown.py", f"""
        import atexit, os, sys, time
        def teardown():
            print("terminate called without an active exception", file=sys.stderr, flush=True)
            if os.environ["RANK"] == "0":
                {last}
        atexit.register(teardown)
        print("trained", flush=True)
        time.sleep(0.3 if os.environ["RANK"] == "1" else 0)
    """)
    with launched_run(
        ["--nproc", "2", str(script)], xl_env(home), cwd=tmp_path, how="to_end"
    ) as launched:
        proc, run_dir = launched.result, launched.run_dir
        run = run_json(run_dir)
        if teardown == "prints":
            assert proc.returncode == 0 and run["status"] == "succeeded", proc.stdout + proc.stderr
            assert run["failure"] is None
            said = [
                ln
                for ln in proc.stdout.splitlines()
                if ln.endswith("] terminate called without an active exception")
            ]
            assert sorted(said) == [
                f"[rank {r}] terminate called without an active exception" for r in (0, 1)
            ]
        else:
            assert proc.returncode == 1 and run["status"] == "failed", proc.stdout + proc.stderr
            assert (run["failure"]["rank"], run["failure"]["exit_code"]) == (0, -signal.SIGABRT)
            # A killed rank's last log line is evidence of its cause, not glued onto the message.
            assert (
                run["failure"]["message"]
                == "rank 0 failed first: rank 0 was killed by SIGABRT after its script had returned"
            )
            cause = run["failure"]["cause"]
            assert cause["kind"] == "exception" and cause["fix"] is None
            assert cause["summary"].startswith("aborted (SIGABRT) in ") and cause[
                "summary"
            ].endswith("after: terminate called without an active exception"), cause
            assert {r["rank"]: r["state"] for r in run["ranks"]}[0] == "failed"
            assert "last lines of rank 0:" in proc.stdout and "rank None" not in proc.stdout
            end = proc.stdout.splitlines()
            assert (
                "was killed by SIGABRT after its script had returned" in end[-3]
                and end[-2] == f"cause: {cause['summary']}"
            )
        wait_no_processes(run_dir, timeout=GRACE + 2)
