"""The Monitor of a 128-rank run in a real terminal (tmux) at 80x24: the outliers and a row per
node fit, `enter` shows a node's ranks and `esc` comes back. The run is held in memory
(big_monitor_run.py, run as a script): its slow node, failed and stalled ranks are the test's."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import psutil
import pytest
from tmuxterm import Tmux, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

BIGRUN = Path(__file__).with_name("big_monitor_run.py")


def _row(screen: str, start: str) -> str:
    return next((line for line in screen.splitlines() if line.strip().startswith(start)), "")


def test_a_128_rank_run_at_80x24(tmp_path):
    tmux = Tmux()
    pid_file = tmp_path / "pid"
    env = {
        "XL_HOME": str(tmp_path / "xlhome"),
        "XL_CONFIG_HOME": str(tmp_path / "config"),
        "TERM": "xterm-256color",
    }
    try:
        tmux.start("m", [sys.executable, str(BIGRUN), "128", str(pid_file)], env, size=(80, 24))

        def screen() -> str:
            return tmux.screen("m")

        # The footer says what enter does.
        wait_for(
            lambda: "gpu-node-007" in screen() and "Node's ranks" in screen(),
            "the node rows",
            screen=screen,
        )
        shown = screen()
        assert "slowest (median rank 500ms):  rank 41 1.12s ×2.2 data on" in shown, shown
        assert "failed:  rank 77 on gpu-node-009 exit 3" in shown, shown
        assert "stalled:  rank 100" in shown, shown
        slow = _row(shown, "gpu-node-005")
        assert "data 56%" in slow and "slow ×2.2" in slow, shown
        even = _row(shown, "gpu-node-000")
        assert "compute 80%" in even and "slow" not in even and "…" not in even, shown
        assert "straggler" in shown and "data" in _row(shown, "straggler"), shown

        tmux.keys("m", *["Down"] * 5)
        wait_for(
            lambda: "Log — rank 40" in screen(), "the log of node 5's first rank", screen=screen
        )
        tmux.keys("m", "Enter")
        wait_for(
            lambda: "node gpu-node-005: its 8 ranks" in screen(), "the node's ranks", screen=screen
        )
        ranks = [
            line.split()[0]
            for line in screen().splitlines()
            if line.split() and line.split()[0].isdigit()
        ]
        assert ranks == [str(r) for r in range(40, 48)], screen()
        tmux.keys("m", "Escape")
        wait_for(
            lambda: "its 8 ranks" not in screen() and "Node  " in _row(screen(), "Node"),
            "back to the nodes",
            screen=screen,
        )
        tmux.keys("m", "q")
        wait_for(lambda: "xl-exit=0" in screen(), "the app gone", screen=screen)
    finally:
        tmux.kill()
    if pid_file.exists():
        pid = int(pid_file.read_text())
        wait_for(
            lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie",
            "the app's process gone",
            timeout=20,
        )
