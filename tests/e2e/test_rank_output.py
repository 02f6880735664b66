"""Every line a rank prints arrives, whole and in order, and the output relay never ends training:
binary output is kept byte for byte, and huge digit lines hold up neither the records nor
`xl stop`.

Real `xl launch --no-tui` with real torchrun and CPU ranks (gloo where ranks talk), stdout into
a file as in a batch job. Each test checks that no process of the run is left.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from procs import (
    XL,
    end_run,
    kill_run,
    only_run,
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


def _launch(
    tmp_path: Path, body: str, nproc: int, *args: str, timeout: float = 300
) -> tuple[subprocess.CompletedProcess[bytes], Path, bytes]:
    """`xl launch --no-tui` of ``body`` with stdout into a file: (process, run dir, the file's
    bytes)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    home = tmp_path / "home"
    out = tmp_path / "train.out"
    with open(out, "wb") as fh:
        proc = subprocess.run(
            [*XL, "launch", "--no-tui", "--nproc", str(nproc), str(script), *args],
            env=xl_env(home),
            cwd=tmp_path,
            stdout=fh,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )
    run_dir = only_run(home)
    wait_no_processes(run_dir, timeout=20)
    return proc, run_dir, out.read_bytes()


def test_a_million_lines_from_each_of_two_ranks_all_reach_the_file(tmp_path: Path) -> None:
    """Before, the plain view read a rank's log from its last MiB when it first saw the rank:
    400k-800k of 1M lines were missing from `> file`, silently."""
    n = 1_000_000
    proc, run_dir, out = _launch(
        tmp_path,
        """
        import os, sys
        r = os.environ["RANK"]
        write = sys.stdout.write
        for i in range(int(sys.argv[1])):
            write(f"r{r} {i}\\n")
        """,
        2,
        str(n),
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    for rank in (0, 1):
        tag = f"[rank {rank}] r{rank} ".encode()
        mine = [line[len(tag) :] for line in out.split(b"\n") if line.startswith(tag)]
        assert len(mine) == n, (rank, len(mine))
        assert mine == [str(i).encode() for i in range(n)]  # in order, each whole, prefixed once
    assert run_json(run_dir)["status"] == "succeeded"


def test_shutdown_output_arrives_and_each_exit_comes_after_the_rank_s_last_line(
    tmp_path: Path,
) -> None:
    """torchrun shows an atexit print, a stderr line and a logging record at shutdown: xl too
    (before, fds 1 and 2 went to /dev/null before atexit handlers ran). Rank 1 fails only once
    rank 0's handlers have run: else torchrun may stop rank 0 first, under either launcher."""
    proc, run_dir, out = _launch(
        tmp_path,
        """
        import atexit, logging, os, sys, time
        rank = int(os.environ["RANK"])
        done = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank-0-handlers.done")
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        log = logging.getLogger("train")
        if rank == 0:
            atexit.register(lambda: open(done, "w").close())  # registered first: runs last
        atexit.register(lambda: log.info("logging at exit of rank %d", rank))
        atexit.register(lambda: sys.stderr.write(f"stderr at exit of rank {rank}\\n"))
        atexit.register(lambda: print(f"print at exit of rank {rank}"))
        print(f"hello from rank {rank}")
        if rank == 1:
            deadline = time.monotonic() + 60
            while not os.path.exists(done) and time.monotonic() < deadline:
                time.sleep(0.02)
            raise ValueError("rank 1 gives up")
        """,
        2,
    )
    assert proc.returncode == 1
    text = out.decode()
    lines = text.splitlines()
    for rank in (0, 1):
        for what in ("print at exit", "stderr at exit", "logging at exit"):
            assert f"[rank {rank}] {what} of rank {rank}" in lines, (rank, what, text)
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert f"logging at exit of rank {rank}" in log
        # "rank R exited" is printed after every line of that rank.
        exited = next(i for i, line in enumerate(lines) if f"xl: rank {rank} exited" in line)
        last = max(i for i, line in enumerate(lines) if line.startswith(f"[rank {rank}] "))
        assert last < exited, text
    assert "[rank 1] ValueError: rank 1 gives up" in lines


def test_a_rank_that_closes_its_outputs_and_raises_keeps_its_record_and_traceback(
    tmp_path: Path,
) -> None:
    proc, run_dir, _ = _launch(
        tmp_path,
        """
        import os
        print("about to close my outputs", flush=True)
        os.close(1)
        os.close(2)
        raise RuntimeError("no stdout, no stderr")
        """,
        1,
    )
    assert proc.returncode == 1
    record = json.loads((run_dir / "ranks" / "rank-0.json").read_text())
    assert record["exit_code"] == 1
    assert "RuntimeError: no stdout, no stderr" in record["traceback"]
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "about to close my outputs" in log and "RuntimeError: no stdout, no stderr" in log
    assert "failed" in run_json(run_dir)["status"]


def test_a_rank_that_keeps_a_duplicate_of_stdout_ends_without_waiting_on_its_relay(
    tmp_path: Path,
) -> None:
    """DeepSpeed keeps a dup of fd 1; a child of the rank may hold it too: the relay ends once
    the rank is gone and the pipe is read, not when every copy of the pipe is closed."""
    script = tmp_path / "holder.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, subprocess, sys, time
            from xl.launcher.rank import relay
            out = relay.start(sys.argv[1])
            keep = os.dup(1)
            child = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
            )
            print(out.pid, child.pid, flush=True)
            os.write(keep, b"through the duplicate\\n")
            """
        )
    )
    log = tmp_path / "logs" / "rank-0.log"
    proc = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    relay_pid, child_pid = (int(x) for x in log.read_text().split()[:2])
    try:
        # The sleeping child still holds the pipe's write end, yet the relay is done.
        assert psutil.Process(child_pid).is_running()
        wait_for(
            lambda: (
                not psutil.pid_exists(relay_pid)
                or psutil.Process(relay_pid).status() == psutil.STATUS_ZOMBIE
            ),
            timeout=20,
            what="the relay to end",
        )
        assert psutil.Process(child_pid).is_running()
        assert "through the duplicate" in log.read_text()
    finally:
        psutil.Process(child_pid).kill()


GLOO_RANKS = """
import os, pathlib, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
print("ready", flush=True)
go = pathlib.Path(sys.argv[1])
while not go.exists():
    time.sleep(0.05)
for i in range(50_000):
    print(f"after {i}")
dist.barrier()
print("done", flush=True)
"""


def _relays(rank_pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(rank_pid).children() if p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("kills", [1, 4], ids=["killed-once", "killed-every-time"])
def test_a_killed_relay_never_ends_the_rank(tmp_path: Path, kills: int) -> None:
    """Before, killing rank 1's relay killed rank 1 (BrokenPipeError on its next print) and the
    run failed blaming rank 0's gloo error. Now another relay takes over (killed once), and
    after repeated deaths the rank writes its log itself (killed every time)."""
    script = tmp_path / "train.py"
    script.write_text(GLOO_RANKS)
    home = tmp_path / "home"
    go = tmp_path / "go"
    out = open(tmp_path / "train.out", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        [*XL, "launch", "--no-tui", "--nproc", "2", str(script), str(go)],
        env=xl_env(home),
        cwd=tmp_path,
        stdout=out,
        stderr=subprocess.PIPE,
    )
    run_dir = wait_run(home)
    try:
        run = wait_ranks_running(run_dir, 2, timeout=120)
        rank1 = next(r["pid"] for r in run["ranks"] if r["rank"] == 1)
        for _ in range(kills):
            relay = wait_for(lambda: _relays(rank1), timeout=30, what="rank 1's relay")[0]
            relay.send_signal(signal.SIGKILL)
            relay.wait(timeout=10)
        go.touch()
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err.decode()[-3000:]
        log = (run_dir / "logs" / "rank-1.log").read_text()
        lines = log.splitlines()
        assert "after 49999" in lines and "done" in lines, log[-3000:]
        assert "rank 1's output relay died (killed by signal 9)" in log, [
            ln for ln in lines if "xl" in ln
        ]
        if kills > 1:
            assert "the rank now writes this log itself" in log
            record = json.loads((run_dir / "ranks" / "rank-1.json").read_text())
            assert "rank 1's output relay died" in record["relay"]
        assert run_json(run_dir)["status"] == "succeeded"
        assert "[rank 1] done" in (tmp_path / "train.out").read_text()
        wait_no_processes(run_dir, timeout=20)
    finally:
        out.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        kill_run(run_dir)


def test_a_bar_s_latest_redraw_is_parsed_while_the_rank_hangs_mid_line(tmp_path: Path) -> None:
    """tqdm writes '\\r<bar>' and no newline: the bar a hung rank stopped at reaches telemetry
    (before, it waited for the next write, which never came). Under --no-instrument, where the
    bars are the only steps there are and none is held back (launcher/telemetry/logfeed.py)."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import pathlib, sys, time
            print("ready", flush=True)
            for step in range(1, 8):
                sys.stdout.write(f"\\r{step * 10}%|####      | {step}/10 [00:01<00:02,  2.95it/s]")
                sys.stdout.flush()
                time.sleep(0.05)
            go = pathlib.Path(sys.argv[1])
            while not go.exists():
                time.sleep(0.05)
            """
        )
    )
    home = tmp_path / "home"
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [*XL, "launch", "--no-tui", "--no-instrument", "--nproc", "1", str(script), str(go)],
        env=xl_env(home),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    run_dir = wait_run(home)
    try:
        wait_ranks_running(run_dir, 1, timeout=120)

        def steps() -> list[int]:
            try:
                text = (run_dir / "metrics.jsonl").read_text()
            except OSError:
                return []
            recs = [json.loads(line) for line in text.splitlines() if line.strip()]
            return [int(r["step"]) for r in recs if r.get("kind") == "train" and "step" in r]

        # Still running, no newline written: its last redraw (step 7) was parsed anyway.
        wait_for(lambda: 7 in steps(), timeout=30, what="the last redraw's step in metrics.jsonl")
        assert proc.poll() is None
        assert steps().count(7) == 1
        go.touch()
        proc.communicate(timeout=120)
        assert proc.returncode == 0
        assert steps().count(7) == 1  # not parsed a second time when the line ended
        wait_no_processes(run_dir, timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        kill_run(run_dir)


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


def _steps(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


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
