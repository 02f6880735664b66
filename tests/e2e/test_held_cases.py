"""Cases that held when they were first tried, attacked again for real so they keep holding
(docs/security.md): binary output from a rank; a stopped (SIGSTOP) rank; ten launches at once;
`xl stop` while `xl attach` follows the run; 10,000 metric keys; 64 CPU ranks. And one that
failed once and was tested only on its parsers: a rank printing huge digit lines, against the
real supervisor. (`xl serve` and the exporter: test_security_servers.py.)

Real `xl launch` on real torchrun with CPU ranks; every test checks that nothing it started is
left.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
from procs import (
    XL,
    end_run,
    kill_run,
    run_dirs,
    run_json,
    wait_final,
    wait_for,
    wait_no_processes,
    wait_ranks_running,
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


BINARY = textwrap.dedent(
    """
    import os, random, sys
    rng = random.Random(int(os.environ["RANK"]) + 7)
    sent = bytearray()
    for i in range(200):
        chunk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
        if i % 17 == 0:
            chunk += b"\\x1b]52;c;aGVsbG8=\\x07\\x00\\xff\\xfe\\r"
        os.write(1, chunk)
        sent += chunk
    os.write(1, b"\\nthe end\\n")
    sent += b"\\nthe end\\n"
    with open(sys.argv[1] + os.environ["RANK"], "wb") as fh:
        fh.write(sent)
    """
)


def test_binary_output_from_ranks_is_kept_byte_for_byte_and_ends_nothing(tmp_path: Path) -> None:
    """Random bytes, NULs, invalid UTF-8 and escapes on a rank's stdout: the run succeeds, each
    rank's log holds exactly what it wrote (the script's own copy is the truth), and `xl logs`
    to a pipe gives those bytes back."""
    home = tmp_path / "home"
    env = xl_env(home)
    (tmp_path / "train.py").write_text(BINARY)
    truth = tmp_path / "sent-"
    # To a pipe the plain view passes the ranks' bytes on as they are (not text: bytes).
    done = subprocess.run(
        [*XL, "launch", "--no-tui", "--nproc", "2", "train.py", str(truth)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        timeout=180,
    )
    run_dir = wait_run(home)
    try:
        assert done.returncode == 0, (done.stdout[-2000:] + done.stderr[-2000:]).decode(
            errors="replace"
        )
        assert b"Traceback" not in done.stdout + done.stderr
        assert run_json(run_dir)["status"] == "succeeded"
        for rank in (0, 1):
            sent = (tmp_path / f"sent-{rank}").read_bytes()
            log = (run_dir / "logs" / f"rank-{rank}.log").read_bytes()
            assert sent in log, (
                f"rank {rank}: {len(sent)} bytes sent, the log does not hold them as sent"
            )
        piped = subprocess.run(
            [*XL, "logs", run_dir.name, "--rank", "1"], env=env, capture_output=True, timeout=60
        )
        assert piped.returncode == 0, piped.stderr
        assert (tmp_path / "sent-1").read_bytes() in piped.stdout
        wait_no_processes(run_dir, timeout=60)
    finally:
        kill_run(run_dir)


STEPPING = textwrap.dedent(
    """
    import os, sys, time
    import xl
    rank = int(os.environ["RANK"])
    print("ready", flush=True)
    step = 0
    while True:
        step += 1
        xl.log(step=step, loss=1.0 / step)
        with open(f"{sys.argv[1]}-{rank}", "a") as fh:
            fh.write(f"{step}\\n")
        time.sleep(0.05)
    """
)


def _steps(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def test_a_stopped_rank_is_ended_by_xl_stop_with_the_rest_and_the_run_says_stopped(
    tmp_path: Path,
) -> None:
    """SIGSTOP one rank (a debugger's breakpoint, a job-control mistake): the other trains on;
    `xl stop` ends both, the frozen one too (SIGTERM alone never reaches it), and nothing is
    left."""
    home = tmp_path / "home"
    env = xl_env(home)
    (tmp_path / "train.py").write_text(STEPPING)
    steps = tmp_path / "steps"
    done = xl(
        ["launch", "--detach", "--nproc", "2", "train.py", str(steps)],
        env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = wait_run(home)
    try:
        run = wait_ranks_running(run_dir, 2, timeout=90)
        pid1 = next(r["pid"] for r in run["ranks"] if r["rank"] == 1)
        wait_for(lambda: _steps(Path(f"{steps}-1")) >= 5, timeout=60, what="rank 1's steps")
        os.kill(pid1, signal.SIGSTOP)
        at_stop = _steps(Path(f"{steps}-1"))
        before = _steps(Path(f"{steps}-0"))
        wait_for(
            lambda: _steps(Path(f"{steps}-0")) >= before + 40, timeout=60, what="rank 0 going on"
        )
        assert _steps(Path(f"{steps}-1")) == at_stop, "rank 1 is stopped"
        stopped = xl(["stop", run_dir.name], env, timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        rec = wait_final(run_dir, timeout=90)
        assert rec["status"] == "stopped", rec
        wait_no_processes(run_dir, timeout=60)
    finally:
        end_run(None, run_dir, timeout=30)


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


def test_xl_stop_while_xl_attach_follows_the_run_ends_both_truthfully(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = xl_env(home)
    (tmp_path / "train.py").write_text(STEPPING)
    done = xl(
        ["launch", "--detach", "--nproc", "2", "train.py", str(tmp_path / "steps")],
        env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = wait_run(home)
    attach = subprocess.Popen(
        [*XL, "attach", "--no-tui", run_dir.name],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_ranks_running(run_dir, 2, timeout=90)
        wait_for(lambda: _steps(tmp_path / "steps-0") >= 10, timeout=60, what="steps")
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            stops = list(pool.map(lambda _: xl(["stop", run_dir.name], env, timeout=120), range(2)))
        assert all(s.returncode == 0 for s in stops), [s.stdout + s.stderr for s in stops]
        out, _ = attach.communicate(timeout=120)
        shown = out.decode(errors="replace")
        assert attach.returncode != 0 and "stopped" in shown, shown[-2000:]
        assert "Traceback" not in shown
        assert run_json(run_dir)["status"] == "stopped"
        events = [
            json.loads(line)
            for line in (run_dir / "events.jsonl").read_text().splitlines()
            if line.strip()
        ]
        assert [e["status"] for e in events if e["kind"] == "run_ended"] == ["stopped"], events
        wait_no_processes(run_dir, timeout=60)
    finally:
        if attach.poll() is None:
            attach.kill()
            attach.wait(timeout=30)
        end_run(None, run_dir, timeout=30)


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


HOSTILE_LINES = textwrap.dedent(
    """
    import os, sys, time
    import xl
    rank = int(os.environ["RANK"])
    here = sys.argv[1]
    print("ready", flush=True)
    step = 0
    while not os.path.exists(os.path.join(here, "go")):
        step += 1
        if rank == 0:
            # The shapes that once held the supervisor's loop for seconds each.
            print("1" * 60_000 + " it/s", flush=True)
            print("x" * 32_000 + " it/s", flush=True)
            print("{'loss': " + "9" * 20_000, flush=True)
        else:
            xl.log(step=step, loss=1.0 / step)
        with open(os.path.join(here, f"steps-{rank}"), "a") as fh:
            fh.write(f"{step}\\n")
        time.sleep(0.05)
    """
)


def _stored_steps(run_dir: Path, rank: int) -> int:
    text = (run_dir / "metrics.jsonl").read_text(errors="replace")
    steps = [
        json.loads(line).get("step")
        for line in text.splitlines()
        if f'"rank": {rank}' in line or f'"rank":{rank}' in line
    ]
    return max([s for s in steps if isinstance(s, int)], default=0)


def test_a_rank_that_prints_huge_digit_lines_holds_up_neither_the_records_nor_xl_stop(
    tmp_path: Path,
) -> None:
    """60,000 digits then " it/s" once held the supervisor's loop 19 s a line. Rank 0 prints such
    lines without end while rank 1 logs steps: rank 1's records are stored as they come, and
    `xl stop` ends the run; rank 0's log keeps its lines whole."""
    home = tmp_path / "home"
    env = xl_env(home)
    (tmp_path / "train.py").write_text(HOSTILE_LINES)
    done = xl(
        ["launch", "--detach", "--nproc", "2", "train.py", str(tmp_path)],
        env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = wait_run(home)
    try:
        wait_ranks_running(run_dir, 2, timeout=90)
        wait_for(
            lambda: _steps(tmp_path / "steps-0") >= 100,
            timeout=120,
            what="300 hostile lines from rank 0",
        )
        now = _steps(tmp_path / "steps-1")
        wait_for(
            lambda: _stored_steps(run_dir, 1) >= now, timeout=60, what=f"rank 1's step {now} stored"
        )
        stopped = xl(["stop", run_dir.name], env, timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert wait_final(run_dir, timeout=90)["status"] == "stopped"
        with open(run_dir / "logs" / "rank-0.log", "rb") as fh:
            whole = sum(1 for line in fh if line == b"1" * 60_000 + b" it/s\n")
        assert whole >= 100, whole
        wait_no_processes(run_dir, timeout=60)
    finally:
        (tmp_path / "go").touch()
        end_run(None, run_dir, timeout=30)
