"""End to end in a real terminal: a real detached run, watched in tmux, detached, re-attached,
stopped from the monitor; no process outlives it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from tmuxterm import Tmux, wait_for
from where import REPO

ROOT = REPO

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


# Rank, GPU ("cpu" for CPU ranks), state, step, loss.
ROW = re.compile(
    r"^\s*(\d+)\s+(?:cpu|\d+)\s+(running|straggler|stalled|exited|failed|stopped)\s+(\d+)(?:/\d+)?\s+(\S+)"
)


def rank_rows(screen: str) -> dict[int, tuple[str, int, str]]:
    rows = {}
    for line in screen.splitlines():
        m = ROW.match(line)
        if m:
            rows[int(m.group(1))] = (m.group(2), int(m.group(3)), m.group(4))
    return rows


def run_processes(run_id: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("XL_RUN_ID") == run_id:
            found.append(proc)
    return found


def test_demo_detach_attach_stop_in_tmux(tmp_path):
    env = {
        **os.environ,
        "XL_HOME": str(tmp_path / "xlhome"),
        "XL_CONFIG_HOME": str(tmp_path / "config"),
        "TERM": "xterm-256color",
    }
    tmux = Tmux()
    pass_env = {k: env[k] for k in ("XL_HOME", "XL_CONFIG_HOME", "TERM", "PATH")}
    run_dir: Path | None = None
    try:
        # The README's main job, in a real terminal: `xl demo` launches and opens the monitor.
        tmux.start("w1", [sys.executable, "-m", "xl", "demo", "--seconds", "240"], pass_env)
        run_dir = wait_for(
            lambda: _only_run(Path(env["XL_HOME"])), "the demo run directory", timeout=60
        )
        first = wait_for(
            lambda: (
                (r := rank_rows(tmux.screen("w1")))
                and len(r) == 2
                and all(v[1] > 0 for v in r.values())
                and r
            ),
            "both ranks with a step",
            timeout=120,
        )
        later = wait_for(
            lambda: (r := rank_rows(tmux.screen("w1"))) and len(r) == 2
            and all(r[k][1] > first[k][1] for k in (0, 1)) and r,
            "steps advancing on both ranks",
        )
        assert all(later[k][2] != first[k][2] for k in (0, 1)), (first, later)  # loss changes
        assert all(v[0] == "running" for v in later.values())

        # Detach: the app ends, the run goes on.
        tmux.keys("w1", "d")
        wait_for(lambda: "Detached" in tmux.screen("w1"), "detach message")
        wait_for(
            lambda: "xl-exit=0" in tmux.screen("w1"),
            "`xl demo` exits 0 when detached from a running run",
        )
        assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
        steps_at_detach = max(v[1] for v in later.values())

        # Attach again: the same run, further along.
        tmux.start("w2", [sys.executable, "-m", "xl", "attach", "last"], pass_env)
        wait_for(
            lambda: (
                (r := rank_rows(tmux.screen("w2")))
                and len(r) == 2
                and min(v[1] for v in r.values()) > steps_at_detach
            ),
            "re-attached monitor shows progress",
        )

        # Stop from the monitor, confirming the question.
        tmux.keys("w2", "s")
        wait_for(lambda: "Stop (y)" in tmux.screen("w2"), "confirmation")
        tmux.keys("w2", "y")
        wait_for(
            lambda: json.loads((run_dir / "run.json").read_text())["status"] == "stopped",
            "run stopped",
        )
        wait_for(lambda: "stopped" in tmux.screen("w2").split("\n", 3)[1], "header says stopped")
        tmux.keys("w2", "q")
        wait_for(lambda: not rank_rows(tmux.screen("w2")), "app closed")
        # Like the plain view: a stopped run is not a success.
        wait_for(lambda: "xl-exit=1" in tmux.screen("w2"), "`xl attach` of a stopped run exits 1")
    finally:
        tmux.kill()
        if (
            run_dir is not None
            and json.loads((run_dir / "run.json").read_text())["status"] == "running"
        ):
            # The test failed midway: end the run the supported way before checking processes.
            subprocess.run(
                [sys.executable, "-m", "xl", "stop", run_dir.name],
                env=env,
                capture_output=True,
                timeout=60,
            )
    # No rank, torchrun or supervisor of this run survives it.
    assert run_dir is not None
    wait_for(lambda: not run_processes(run_dir.name), "no process of the run left", timeout=30)


def _only_run(xl_home: Path) -> Path | None:
    runs = sorted(p for p in (xl_home / "runs").glob("*") if (p / "run.json").is_file())
    return runs[0] if runs else None


def _wakeups(pid: int) -> dict[int, int]:
    """Voluntary context switches (times a thread slept and woke) of each of a process's threads."""
    counts = {}
    for thread in psutil.Process(pid).threads():
        status = Path(f"/proc/{pid}/task/{thread.id}/status").read_text()
        counts[thread.id] = int(
            re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1)
        )
    return counts


def test_app_idle_sleeps_and_keys_still_work_in_tmux(tmp_path):
    """The app's input thread sleeps until a key comes (tui/driver.py) instead of waking ten times
    a second, and keys still arrive: a lone Escape (which the key parser turns into a key only
    after a short wait), a key sequence (F1), and q."""
    env = {"XL_HOME": str(tmp_path / "xlhome"), "XL_CONFIG_HOME": str(tmp_path / "config"),
           "TERM": "xterm-256color", "PATH": os.environ["PATH"]}
    tmux = Tmux()
    marker = f"xl-idle-{uuid.uuid4().hex[:8]}"
    try:
        tmux.start(
            "w",
            [
                sys.executable,
                "-c",
                f"import sys; from xl.cli import main; sys.exit(main([]))  # {marker}",
            ],
            env,
        )
        wait_for(lambda: "xl — GPUs" in tmux.screen("w"), "the GPUs screen")
        # The app itself, not the pane's shell (whose command line holds the marker too).
        app = wait_for(
            lambda: next(
                (
                    p
                    for p in psutil.process_iter(["cmdline"])
                    if (p.info["cmdline"] or [""])[0] == sys.executable
                    and marker in p.info["cmdline"][-1]
                ),
                None,
            ),
            "the app's process",
        )

        # Idle is measured once startup is over: the first poll of each screen and Textual's
        # first frames keep a thread busy for a moment after the GPUs screen first shows.
        time.sleep(2)
        before = _wakeups(app.pid)
        time.sleep(3)
        after = _wakeups(app.pid)
        woke = {tid: after[tid] - before.get(tid, 0) for tid in after}
        # Textual's own driver: its input thread alone wakes ~30 times in 3 s. Now every thread
        # sleeps until its own work (the screen's 1 s refresh) is due.
        assert max(woke.values()) <= 12, woke

        tmux.keys("w", "?")
        wait_for(lambda: "this help" in tmux.screen("w"), "the help screen")
        tmux.keys("w", "Escape")
        wait_for(lambda: "this help" not in tmux.screen("w"), "a lone Escape closes the help")
        tmux.keys("w", "F1")
        wait_for(lambda: "this help" in tmux.screen("w"), "F1 (an escape sequence) opens the help")
        tmux.keys("w", "Escape")
        wait_for(lambda: "this help" not in tmux.screen("w"), "Escape closes it again")
        tmux.keys("w", "q")
        wait_for(lambda: "xl-exit=0" in tmux.screen("w"), "q ends the app with exit code 0")
        wait_for(lambda: not app.is_running(), "the app's process gone", timeout=10)
    finally:
        tmux.kill()
