"""A disk that fills mid-run and stays full: the ranks train on, `xl launch` returns when they end,
the record says what they really did and what could not be written (docs/security.md).

XL_HOME is a small tmpfs of its own (mounted here: root only), filled by a file while two real
CPU ranks under `xl launch` log a step every 0.05 s and print a long line with each. Each rank
writes the steps it took to a file outside that disk (the ground truth). The disk stays full
until `xl launch` has returned; then it is freed and `xl runs` must say the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from procs import (
    XL,
    kill_run,
    run_json,
    wait_for,
    wait_no_processes,
    wait_ranks_running,
    wait_run,
    xl,
    xl_env,
)

pytestmark = pytest.mark.e2e

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
        step += 1
        xl.log(step=step, loss=1.0 / step, samples=4)
        print(f"step {step} " + "x" * 400, flush=True)
        steps.write(f"{step}\\n")
        steps.flush()
        time.sleep(0.05)
    xl.flush(timeout=5)
    sys.exit(int(sys.argv[2]) if rank == 1 else 0)
    """
)


@pytest.fixture
def small_disk(tmp_path: Path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(disk)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)


def _fill(disk: Path) -> Path:
    """A file that takes every byte left on ``disk``."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 1 << 16, 4096, 1):  # the last pages too
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                continue
    finally:
        os.close(fd)
    return filler


def _steps(tmp_path: Path, rank: int) -> int:
    path = tmp_path / f"steps-{rank}.txt"
    return len(path.read_text().split()) if path.exists() else 0


@pytest.mark.parametrize("rank1_exit", [0, 3], ids=["both-succeed", "rank1-fails"])
def test_a_full_disk_neither_falsifies_the_record_nor_holds_up_xl(
    tmp_path: Path, small_disk: Path, rank1_exit: int
) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    home = small_disk / "home"
    env = xl_env(home)
    launch = subprocess.Popen(
        [*XL, "launch", "--no-tui", "--nproc", "2", "train.py", str(tmp_path), str(rank1_exit)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    run_dir = None
    filler = None
    try:
        run_dir = wait_run(home)
        wait_ranks_running(run_dir, 2, timeout=90)
        wait_for(
            lambda: min(_steps(tmp_path, 0), _steps(tmp_path, 1)) >= 20, timeout=60, what="20 steps"
        )
        filler = _fill(small_disk)
        at_fill = min(_steps(tmp_path, 0), _steps(tmp_path, 1))
        # The ranks train on while nothing can be written.
        wait_for(
            lambda: min(_steps(tmp_path, 0), _steps(tmp_path, 1)) >= at_fill + 60,
            timeout=60,
            what="60 steps on a full disk",
        )
        (tmp_path / "end").touch()
        out, _ = launch.communicate(timeout=120)  # it returns while the disk is still full
        shown = out.decode(errors="replace")
        assert launch.returncode == (1 if rank1_exit else 0), shown[-3000:]
        rec = run_json(run_dir)
        codes = {r["rank"]: r["exit_code"] for r in rec["ranks"]}
        if rank1_exit:
            assert rec["status"] == "failed" and codes[1] == rank1_exit, rec
            assert rec["failure"]["rank"] == 1, rec["failure"]
        else:
            assert rec["status"] == "succeeded" and codes == {0: 0, 1: 0}, rec
            assert "run failed" not in shown and "failed first" not in shown, shown[-3000:]
        assert "exit code unknown" not in shown, shown[-3000:]
        # What never reached the disk is counted per file, in run.json and an event.
        lost = rec.get("write_lost") or {}
        assert lost.get("logs/rank-0.log", 0) > 0 and lost.get("logs/rank-1.log", 0) > 0, rec
        events = [
            json.loads(line)
            for line in (run_dir / "events.jsonl").read_text().splitlines()
            if line.strip()
        ]
        said = [e for e in events if e["kind"] == "write_lost"]
        assert said and said[0]["files"] == lost, events
        ended = [e for e in events if e["kind"] == "run_ended"]
        assert [e["status"] for e in ended] == [rec["status"]], events
        assert not any(e["kind"] == "rank_exited" and e.get("exit_code") is None for e in events), (
            events
        )
        # Space back: the run reads the same, nothing about it is "running" or "gone".
        filler.unlink()
        filler = None
        listed = xl(["runs", "--json"], env, timeout=60)
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        assert row["status"] == rec["status"], row
    finally:
        (tmp_path / "end").touch()
        if filler is not None:
            filler.unlink(missing_ok=True)
        if launch.poll() is None:
            launch.kill()
            launch.wait(timeout=30)
        if run_dir is not None:
            try:
                wait_no_processes(run_dir, timeout=60)
            finally:
                kill_run(run_dir)


def test_a_run_whose_supervisor_died_on_a_full_disk_is_settled_true_once_space_is_back(
    tmp_path: Path, small_disk: Path
) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    home = small_disk / "home"
    env = xl_env(home)
    launch = subprocess.Popen(
        [*XL, "launch", "--no-tui", "--nproc", "2", "train.py", str(tmp_path), "0"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run_dir = None
    filler = None
    try:
        run_dir = wait_run(home)
        wait_ranks_running(run_dir, 2, timeout=90)
        wait_for(
            lambda: min(_steps(tmp_path, 0), _steps(tmp_path, 1)) >= 20, timeout=60, what="20 steps"
        )
        filler = _fill(small_disk)
        os.kill(int(run_json(run_dir)["supervisor_pid"]), 9)  # nobody left to write the end
        at_fill = min(_steps(tmp_path, 0), _steps(tmp_path, 1))
        wait_for(
            lambda: min(_steps(tmp_path, 0), _steps(tmp_path, 1)) >= at_fill + 40,
            timeout=60,
            what="40 steps on a full disk",
        )
        (tmp_path / "end").touch()
        launch.wait(timeout=120)
        wait_no_processes(run_dir, timeout=60)
        filler.unlink()
        filler = None
        listed = xl(["runs", "--json"], env, timeout=60)
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        assert row["status"] == "succeeded", row  # from the ranks' own records, written in place
        rec = run_json(run_dir)
        assert rec["status"] == "succeeded" and {r["exit_code"] for r in rec["ranks"]} == {0}, rec
    finally:
        (tmp_path / "end").touch()
        if filler is not None:
            filler.unlink(missing_ok=True)
        if launch.poll() is None:
            launch.kill()
            launch.wait(timeout=30)
        if run_dir is not None:
            try:
                wait_no_processes(run_dir, timeout=60)
            finally:
                kill_run(run_dir)
