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
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import (
    XL,
    end_run,
    run_json,
    wait_for,
    wait_no_processes,
    wait_ranks_running,
    wait_run,
    xl,
    xl_env,
)
from smalldisk import fill, tmpfs

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
    if rank == 0:
        with open(os.path.join(here, "done-0.tmp"), "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(os.path.join(here, "done-0.tmp"), os.path.join(here, "done-0"))
    elif int(sys.argv[2]):
        # Rank 1 fails once rank 0 has ended: the stop a failure begins ends a rank still
        # training (its true exit is then -15), and these tests hold each rank's own exit.
        for _ in range(2400):
            try:
                with open(os.path.join(here, "done-0")) as fh:
                    stat = open(f"/proc/{int(fh.read())}/stat").read()
                if stat[stat.rfind(")") + 2] == "Z":
                    break
            except FileNotFoundError as exc:
                if exc.filename != os.path.join(here, "done-0"):
                    break  # rank 0's process is gone
            time.sleep(0.05)
    sys.exit(int(sys.argv[2]) if rank == 1 else 0)
    """
)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", "16m", mode="0700") as disk:
        yield disk


def _fill(disk: Path) -> Path:
    """A file that takes every byte left on ``disk``."""
    return fill(disk / "filler")


def _steps(tmp_path: Path, rank: int) -> int:
    path = tmp_path / f"steps-{rank}.txt"
    return len(path.read_text().split()) if path.exists() else 0


def _listed_status(env: dict[str, str]) -> str:
    """The one run's status as `xl runs --json` tells it."""
    listed = xl(["runs", "--json"], env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    return row["status"]


def _launch(
    tmp_path: Path, env: dict[str, str], rank1_exit: int, *, shown: bool = True
) -> subprocess.Popen[bytes]:
    """`xl launch --no-tui` of the test's 2 ranks (rank 1 exits with ``rank1_exit``); what it
    prints comes back on its stdout (``shown``), or is dropped."""
    out = subprocess.PIPE if shown else subprocess.DEVNULL
    return subprocess.Popen(
        [*XL, "launch", "--no-tui", "--nproc", "2", "train.py", str(tmp_path), str(rank1_exit)],
        env=env,
        cwd=tmp_path,
        stdout=out,
        stderr=subprocess.STDOUT if shown else subprocess.DEVNULL,
    )


def _end_launch(
    tmp_path: Path, filler: Path | None, launch: subprocess.Popen, run_dir: Path | None
) -> None:
    """Whatever the test saw: the ranks told to end, the disk's space back, the launch and every
    process of the run gone."""
    (tmp_path / "end").touch()
    if filler is not None:
        filler.unlink(missing_ok=True)
    end_run(launch, run_dir)


@pytest.mark.parametrize("rank1_exit", [0, 3], ids=["both-succeed", "rank1-fails"])
def test_a_full_disk_neither_falsifies_the_record_nor_holds_up_xl(
    tmp_path: Path, small_disk: Path, rank1_exit: int
) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    home = small_disk / "home"
    env = xl_env(home)
    launch = _launch(tmp_path, env, rank1_exit)
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
        assert _listed_status(env) == rec["status"]
    finally:
        _end_launch(tmp_path, filler, launch, run_dir)


def test_a_run_whose_supervisor_died_on_a_full_disk_is_settled_true_once_space_is_back(
    tmp_path: Path, small_disk: Path
) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    home = small_disk / "home"
    env = xl_env(home)
    launch = _launch(tmp_path, env, 0, shown=False)
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
        # from the ranks' own records, written in place
        assert _listed_status(env) == "succeeded"
        rec = run_json(run_dir)
        assert rec["status"] == "succeeded" and {r["exit_code"] for r in rec["ranks"]} == {0}, rec
    finally:
        _end_launch(tmp_path, filler, launch, run_dir)


def _leave_free(disk: Path, free: int) -> Path:
    """Fill ``disk``, then give back ``free`` bytes of it (whole pages on a tmpfs)."""
    filler = _fill(disk)
    os.truncate(filler, max(0, filler.stat().st_size - free))
    return filler


def _launched_ranks(tmp_path: Path) -> list[int]:
    """Live processes running this test's train.py (a refused launch must leave none)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(tmp_path).encode() in cmdline and b"train.py" in cmdline:
            found.append(int(pid))
    return found


def test_a_disk_without_room_for_the_run_s_reserve_refuses_the_run_in_one_line(
    tmp_path: Path, small_disk: Path
) -> None:
    """256 KiB free: enough for a run dir and its run.json, not for the 1 MiB its end is kept
    in. The run is refused before it starts (it would train with nowhere to write its end);
    the same disk with room runs it."""
    (tmp_path / "train.py").write_text(SCRIPT)
    home = small_disk / "home"
    (home / "runs").mkdir(parents=True)
    env = xl_env(home)
    filler = _leave_free(small_disk, 256 << 10)
    try:
        done = xl(
            ["launch", "--no-tui", "--nproc", "2", "train.py", str(tmp_path), "0"],
            env,
            cwd=tmp_path,
            timeout=120,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert (
            "No space left on device" in lines[0] and "1 MiB" in lines[0] and "XL_HOME" in lines[0]
        ), lines
        assert "Traceback" not in done.stdout + done.stderr
        assert list((home / "runs").iterdir()) == [], "a refused run leaves no run dir"
        assert _steps(tmp_path, 0) == 0 and _launched_ranks(tmp_path) == [], (
            "nothing of the run started"
        )
        listed = xl(["runs", "--json"], env)
        assert listed.returncode == 0 and json.loads(listed.stdout) == [], (
            listed.stdout + listed.stderr
        )
    finally:
        filler.unlink()
        for started in (home / "runs").iterdir():  # a run that should not have started
            (tmp_path / "end").touch()
            end_run(None, started, timeout=60)
    # Room again: the same launch runs, and its reserve is given back at its end.
    (tmp_path / "end").touch()
    done = xl(
        ["launch", "--no-tui", "--nproc", "2", "train.py", str(tmp_path), "0"],
        env,
        cwd=tmp_path,
        timeout=180,
    )
    (run_dir,) = list((home / "runs").iterdir())
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert run_json(run_dir)["status"] == "succeeded"
        assert not (run_dir / ".reserve").exists()
    finally:
        end_run(None, run_dir, timeout=60)


@pytest.mark.parametrize("rank1_exit", [0, 3], ids=["both-succeed", "rank1-fails"])
def test_a_disk_full_from_the_start_still_ends_true_and_xl_launch_returns(
    tmp_path: Path, small_disk: Path, rank1_exit: int
) -> None:
    """Room for the run's reserve and little more: the run dir is made, then nothing fits (the
    ranks' logs, metrics, events). The ranks train on; `xl launch` returns when they end, with
    their real exits; what could not be written is counted; with space back `xl runs` agrees."""
    (tmp_path / "train.py").write_text(SCRIPT)
    home = small_disk / "home"
    (home / "runs").mkdir(parents=True)
    env = xl_env(home)
    filler = _leave_free(small_disk, (1 << 20) + (32 << 10))
    launch = _launch(tmp_path, env, rank1_exit)
    run_dir = None
    try:
        wait_for(
            lambda: min(_steps(tmp_path, 0), _steps(tmp_path, 1)) >= 60,
            timeout=120,
            what="60 steps on a disk full from the start",
        )
        run_dir = wait_run(home)
        assert (run_dir / ".reserve").stat().st_size == 1 << 20, (
            "the run's end is kept from its start"
        )
        (tmp_path / "end").touch()
        out, _ = launch.communicate(timeout=120)  # it returns while the disk is still full
        shown = out.decode(errors="replace")
        assert launch.returncode == (1 if rank1_exit else 0), shown[-3000:]
        assert "exit code unknown" not in shown and "Traceback" not in shown, shown[-3000:]
        rec = run_json(run_dir)
        codes = {r["rank"]: r["exit_code"] for r in rec["ranks"]}
        if rank1_exit:
            assert rec["status"] == "failed" and codes == {0: 0, 1: rank1_exit}, rec
            assert rec["failure"]["rank"] == 1, rec["failure"]
        else:
            assert rec["status"] == "succeeded" and codes == {0: 0, 1: 0}, rec
            assert "run failed" not in shown and "failed first" not in shown, shown[-3000:]
        lost = rec.get("write_lost") or {}
        assert lost.get("logs/rank-0.log", 0) > 0 and lost.get("logs/rank-1.log", 0) > 0, rec
        events = [
            json.loads(line)
            for line in (run_dir / "events.jsonl").read_text().splitlines()
            if line.strip()
        ]
        assert [e["status"] for e in events if e["kind"] == "run_ended"] == [rec["status"]], events
        assert [e["files"] for e in events if e["kind"] == "write_lost"] == [lost], events
        # ... and said where the person watching sees it.
        assert "the disk refused writes: never written:" in shown, shown[-3000:]
        filler.unlink()
        filler = None
        assert _listed_status(env) == rec["status"]
    finally:
        _end_launch(tmp_path, filler, launch, run_dir)
