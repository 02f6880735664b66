"""What run.json and the run dir say must be true, whatever happened to the run.

Real `xl launch` with torchrun and CPU ranks; each test does what an unlucky user would (a full
disk before launch, the run dir removed mid-run, `xl stop` before the supervisor started) and
checks what a person then reads, and that no process of the run is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from procs import (
    XL,
    kill_run,
    only_run,
    run_json,
    run_processes,
    wait_final,
    wait_for,
    wait_no_processes,
    wait_ranks_running,
    wait_run,
    xl,
    xl_env,
)
from slowstart import start_slow
from smalldisk import fill, tmpfs

pytestmark = pytest.mark.e2e

# Ranks print "ready", then wait for the test's go file, print "go" and wait for its end file.
SCRIPT = """
import os, sys, time
go = sys.argv[1]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.02)
print("go", flush=True)
while not os.path.exists(go + ".end"):
    time.sleep(0.02)
print("done", flush=True)
"""


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    return script


def _launch(tmp_path: Path, env: dict[str, str], *, umask: int | None = None) -> Path:
    def child_umask() -> None:
        if umask is not None:
            os.umask(umask)

    done = subprocess.run(
        [*XL, "launch", "--detach", "--nproc", "2", str(_script(tmp_path)), str(tmp_path / "go")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=child_umask,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return wait_run(Path(env["XL_HOME"]))


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in (run_dir / "events.jsonl").read_text().splitlines()
        if line.strip()
    ]


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs for XL_HOME (a run needs the 1 MiB it keeps for its end, and its files),
    unmounted after the test (root only: skipped elsewhere)."""
    with tmpfs(tmp_path / "home", "4m") as mnt:
        yield mnt


def test_a_full_disk_before_launch_is_one_line_exit_2_and_leaves_no_run(
    tmp_path: Path, tiny_disk: Path
) -> None:
    env = xl_env(tiny_disk)
    (tiny_disk / "runs").mkdir()
    fill(tiny_disk / "filler")
    done = xl(
        ["launch", "--nproc", "2", str(_script(tmp_path)), str(tmp_path / "go")], env, cwd=tmp_path
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0] and "XL_HOME" in lines[0], (
        done.stderr
    )
    assert "Traceback" not in done.stdout + done.stderr
    assert list((tiny_disk / "runs").iterdir()) == []
    listed = xl(["runs"], env)
    assert (
        listed.returncode == 0
        and "damaged" not in listed.stdout
        and "unreadable" not in listed.stdout
    ), listed.stdout

    # The same disk with room again: the same launch runs to the end.
    (tiny_disk / "filler").unlink()
    (tmp_path / "go").touch()
    (tmp_path / "go.end").touch()
    done = xl(
        ["launch", "--no-tui", "--nproc", "2", str(_script(tmp_path)), str(tmp_path / "go")],
        env,
        cwd=tmp_path,
    )
    run_dir = only_run(tiny_disk)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert run_json(run_dir)["status"] == "succeeded"
        wait_no_processes(run_dir, timeout=5)
    finally:
        kill_run(run_dir)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_run_dir_removed_mid_run_is_made_again_private(tmp_path: Path) -> None:
    env = xl_env(tmp_path / "home")
    run_dir = _launch(tmp_path, env, umask=0o022)
    try:
        wait_ranks_running(run_dir, 2)
        assert _mode(run_dir) == 0o700  # as launched
        subprocess.run(["rm", "-rf", str(run_dir)], check=True, timeout=30)
        (tmp_path / "go").touch()
        (tmp_path / "go.end").touch()
        # The ranks' relays and records write again: the folders they make are private.
        wait_for(
            lambda: (
                (run_dir / "ranks").is_dir()
                and len(list((run_dir / "ranks").glob("rank-*.json"))) == 2
            ),
            timeout=60,
            what="the rank records",
        )
        assert _mode(run_dir) == 0o700, oct(_mode(run_dir))
        for sub in ("ranks", "logs", "spool"):
            if (run_dir / sub).exists():
                assert _mode(run_dir / sub) == 0o700, (sub, oct(_mode(run_dir / sub)))
        wait_for(lambda: not run_processes(run_dir), timeout=30, what="the run to end")
        assert _mode(run_dir) == 0o700
    finally:
        kill_run(run_dir)


def test_makedirs_private_makes_every_missing_folder_0700_whatever_the_umask(
    tmp_path: Path,
) -> None:
    from xl.atomic import makedirs_private  # noqa: PLC0415 - the unit under test, beside its e2e test

    os.chmod(tmp_path, 0o755)
    old = os.umask(0o022)
    try:
        makedirs_private(tmp_path / "a" / "b" / "c")
        makedirs_private(tmp_path / "a" / "b" / "c")  # there already: nothing changes, no error
    finally:
        os.umask(old)
    assert [_mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o700] * 3
    assert _mode(tmp_path) == 0o755  # a folder that was there is left as it was


def _start_slow(tmp_path: Path, env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """A run started through the library, its supervisor held at the gate (tmp_path/gate)."""
    return start_slow(tmp_path, env, _script(tmp_path), str(tmp_path / "go"))


def _starting_supervisor(run_dir: Path) -> psutil.Process:
    """The run's supervisor while it starts (no pid in run.json yet): the process working in the
    run dir, as `xl stop` finds it."""

    def find() -> psutil.Process | None:
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.cwd() == str(run_dir) and "xl.launcher.supervisor" in proc.cmdline():
                    return proc
        return None

    return wait_for(find, timeout=60, what="the starting supervisor")


def _never_trained(run_dir: Path) -> None:
    run = run_json(run_dir)
    assert run["status"] == "stopped" and run.get("torchrun_pid") is None, run
    assert not list((run_dir / "logs").glob("rank-*.log"))
    assert not any(e["kind"] == "rank_started" for e in _events(run_dir))
    # The supervisor writes run.json's final status, then the run_ended event (CI saw the gap).
    wait_for(
        lambda: any(e["kind"] == "run_ended" for e in _events(run_dir)),
        timeout=10,
        what="the run_ended event",
    )
    assert [e["kind"] for e in _events(run_dir)].count("run_ended") == 1, _events(run_dir)


def test_xl_stop_while_the_supervisor_is_still_starting_means_the_run_never_trains(
    tmp_path: Path,
) -> None:
    run_dir, env = _start_slow(tmp_path, xl_env(tmp_path / "home"))
    (tmp_path / "go").touch()
    (tmp_path / "go.end").touch()  # were it to start, it would finish at once and succeed
    try:
        starting = _starting_supervisor(run_dir)
        assert run_json(run_dir)["supervisor_pid"] is None  # still starting
        stop = xl(["stop", run_dir.name], env)
        assert stop.returncode == 0 and stop.stdout.strip() == f"{run_dir.name} stopped", (
            stop.stdout + stop.stderr
        )
        wait_no_processes(run_dir, timeout=5)
        # The starting supervisor is gone: the gate opens on nothing, and nothing comes back.
        with contextlib.suppress(psutil.NoSuchProcess):
            starting.wait(timeout=60)
        (tmp_path / "gate").touch()
        _never_trained(run_dir)
        wait_no_processes(run_dir, timeout=1)
    finally:
        (tmp_path / "gate").touch()
        kill_run(run_dir)


def test_a_supervisor_that_starts_after_a_stop_was_asked_does_not_start_the_run(
    tmp_path: Path,
) -> None:
    # `xl stop` could not reach the starting supervisor (no process to signal yet): its stop file
    # is there when the supervisor gets going.
    from xl.launcher.rundir import stopmark  # noqa: PLC0415 - what `xl stop` leaves, written here at the worst moment

    run_dir, _ = _start_slow(tmp_path, xl_env(tmp_path / "home"))
    (tmp_path / "go").touch()
    (tmp_path / "go.end").touch()
    try:
        stopmark.ask_stop(run_dir)
        (tmp_path / "gate").touch()
        wait_final(run_dir, timeout=30)
        _never_trained(run_dir)
        assert "before the run started" in " ".join(e["message"] for e in _events(run_dir))
        wait_no_processes(run_dir, timeout=5)
    finally:
        (tmp_path / "gate").touch()
        kill_run(run_dir)


def test_a_slow_starting_supervisor_left_alone_trains_and_a_later_stop_stops_it(
    tmp_path: Path,
) -> None:
    run_dir, env = _start_slow(tmp_path, xl_env(tmp_path / "home"))
    try:
        _starting_supervisor(run_dir)
        assert run_json(run_dir)["supervisor_pid"] is None  # still starting
        (tmp_path / "gate").touch()
        wait_ranks_running(run_dir, 2)
        (tmp_path / "go").touch()
        stop = xl(["stop", run_dir.name], env)
        assert stop.returncode == 0 and stop.stdout.strip() == f"{run_dir.name} stopped", (
            stop.stdout + stop.stderr
        )
        run = run_json(run_dir)
        assert [r["state"] for r in run["ranks"]] == ["stopped", "stopped"], run["ranks"]
        wait_no_processes(run_dir, timeout=5)
    finally:
        (tmp_path / "gate").touch()
        kill_run(run_dir)
