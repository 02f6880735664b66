"""The Monitor's log pane shows a rank's newest line, in a real terminal (tmux) at 80x24 and
200x60, with real CPU ranks and the real `xl attach`: attached to a run whose log is already
thousands of lines long, and after `s` stopped the run (the stop puts a banner and a second header
line above the pane and make it shorter: the view must move with the end of the log, not stay
where it was). No process of the run is left."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import XL, end_run, run_json
from tmuxterm import Tmux, tui_env, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

# Lines enough to fill the pane at any size before the stop comes; BURST lines at once first.
SCRIPT = """\
import os
import time

import xl

rank = int(os.environ["RANK"])
burst = int(os.environ.get("BURST", "0"))
for step in range(1, 100_000):
    if step > burst:
        xl.log(step=step, loss=1.0 / step, samples=8)
        time.sleep(0.1)
    print(f"rank {rank} wrote line {step:06d}", flush=True)
"""


NAME = "lightning_image_classifier_resnet50_finetune"


def _launch_detached(home: Path, env: dict[str, str], *options: str) -> Path:
    """`xl launch --detach --nproc 2 OPTIONS train.py`; its run dir."""
    started = subprocess.run(
        [*XL, "launch", "--detach", "--nproc", "2", *options, "train.py"],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr
    runs = home / "xlhome" / "runs"
    return wait_for(lambda: next(runs.glob("2*"), None), "the run dir", timeout=30)


def _newest_shown(screen: str) -> int:
    """The number of the newest of rank 0's lines in the pane (0: none)."""
    found = [int(m) for m in re.findall(r"rank 0 wrote line (\d{6})", "\n".join(_pane(screen)))]
    return max(found, default=0)


def _lines_in(log: Path) -> int:
    return sum(1 for line in log.read_text(errors="replace").splitlines() if "wrote line" in line)


def _stop(run_dir: Path | None, env: dict[str, str]) -> None:
    if run_dir is not None and run_json(run_dir).get("status") == "running":
        subprocess.run([*XL, "stop", run_dir.name], env=env, capture_output=True, timeout=60)


@contextlib.contextmanager
def _detached(tmp_path: Path, env: dict[str, str], *options: str) -> Iterator[tuple[Tmux, Path]]:
    """`_launch_detached`'s run and a tmux server to attach to it in: when the test ends the
    server is killed and the run stopped; a test that passed then checks every process of the
    run gone."""
    tmux = Tmux()
    run_dir: Path | None = None
    try:
        run_dir = _launch_detached(tmp_path, env, *options)
        yield tmux, run_dir
    finally:
        tmux.kill()
        _stop(run_dir, env)
    end_run(None, run_dir, timeout=15)


def _quit(tmux: Tmux) -> None:
    tmux.keys("w", "q")
    wait_for(lambda: "xl-exit=" in tmux.screen("w"), "the app left", timeout=30)


@pytest.mark.parametrize(
    "size", [(80, 24), (120, 40), (200, 60)], ids=["80x24", "120x40", "200x60"]
)
def test_attached_to_a_long_log_the_pane_shows_its_newest_line(simnvml, tmp_path, size):
    """Also what the rest of the Monitor keeps at these sizes: samples/s in the rank table at 80
    columns, the header on one line from 120 (a long run name, as `--name` gives it)."""
    (tmp_path / "train.py").write_text(SCRIPT)
    sim = simnvml(gpus=0, init_error="driver_not_loaded")  # CPU ranks
    env = {**os.environ, **tui_env(tmp_path, **sim.env), "BURST": "5000"}
    with _detached(tmp_path, env, "--name", NAME) as (tmux, run_dir):
        log = run_dir / "logs" / "rank-0.log"
        wait_for(lambda: log.is_file() and _lines_in(log) > 5000, "5,000 lines written", 120)
        written = _lines_in(log)
        tmux.start("w", [*XL, "attach", run_dir.name], tui_env(tmp_path, **sim.env), size=size)
        # The end of the log as it was when attached, or newer: not a line thousands back.
        wait_for(
            lambda: _newest_shown(tmux.screen("w")) >= written,
            f"a line numbered {written} or more in the pane",
            timeout=90,
            screen=lambda: tmux.screen("w"),
        )
        screen = tmux.screen("w")
        assert "Log — rank 0 (following)" in screen
        assert "Samples/s" in screen  # the table's header: kept at 80 columns too
        header = next(line for line in screen.splitlines() if f"[{run_dir.name}]" in line)
        if size[0] >= 120:  # the whole header on its one line
            assert "running" in header and "world size 2" in header and "devices CPU" in header
        written = _lines_in(log)  # and it goes on following
        wait_for(
            lambda: _newest_shown(tmux.screen("w")) >= written,
            f"line {written} in the pane",
            timeout=60,
            screen=lambda: tmux.screen("w"),
        )
        _quit(tmux)


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _pane(screen: str) -> list[str]:
    """The log pane's rows: below its title, above the footer (from the title's column on)."""
    lines = screen.rstrip("\n").split("\n")
    title = next((i for i, line in enumerate(lines) if "Log — rank" in line), None)
    if title is None:
        return []
    left = lines[title].index("Log — rank") - 1
    return [line[max(0, left) :].strip() for line in lines[title + 1 : -1]]


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_after_a_stop_the_rank_s_last_line_stays_in_view(simnvml, tmp_path, size):
    (tmp_path / "train.py").write_text(SCRIPT)
    sim = simnvml(gpus=0, init_error="driver_not_loaded")  # CPU ranks
    env = {**os.environ, **tui_env(tmp_path, **sim.env)}
    with _detached(tmp_path, env) as (tmux, run_dir):
        log = run_dir / "logs" / "rank-0.log"
        tmux.start("w", [*XL, "attach", run_dir.name], tui_env(tmp_path, **sim.env), size=size)
        # Running, and more lines than the pane holds: the newest is on screen as they come.
        wait_for(
            lambda: "wrote line 000080" in "\n".join(_pane(tmux.screen("w"))),
            "rank 0's 80th line in the pane",
            timeout=120,
            screen=lambda: tmux.screen("w"),
        )
        tmux.keys("w", "s")
        wait_for(lambda: "Stop run" in tmux.screen("w"), "the question", timeout=20)
        tmux.keys("w", "y")
        wait_for(
            lambda: run_json(run_dir).get("status") == "stopped",
            "the run stopped",
            timeout=60,
        )
        last = _last_line(log)
        assert "wrote line" in last, last
        # The stopped run's screen (its banner, its header's second line), the last line in
        # the pane, and still there a few polls later.
        wait_for(
            lambda: last in _pane(tmux.screen("w")) and "stopped" in tmux.screen("w"),
            f"{last!r} in the pane after the stop",
            timeout=30,
            screen=lambda: tmux.screen("w"),
        )
        for _ in range(3):
            tmux.run("refresh-client", "-t", "w")
            wait_for(lambda: "stopped" in tmux.screen("w"), "the Monitor", timeout=10)
            assert last in _pane(tmux.screen("w")), tmux.screen("w")
            subprocess.run(["sleep", "1"], timeout=5)
        _quit(tmux)
