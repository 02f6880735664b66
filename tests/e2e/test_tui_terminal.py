"""What a terminal shows, in a real one (tmux) at 80x24 and at 200x60: the columns and footer
keys that matter, the Launch command box, the Monitor's charts after a resize, Ctrl-C in the
monitor `xl launch` opened; and the app with no terminal at all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from procs import XL, run_json, wait_no_processes
from simnvml import SimGPU, SimProcess
from tmuxterm import Tmux, wait_for
from where import FIXTURES

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

RUNS_FIXTURES = FIXTURES / "runs"
LONG_NAME = "llama-3-8b-instruct-lora-finetune-v2"
SMALL, LARGE = (80, 24), (200, 60)
LONG_SCRIPT = "experiments/2026/llama-3-8b-instruct/stage-2/finetune_with_lora.py"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """Recorded runs (one with a long name, which must not push the run id off an 80-column
    table) and a training script in the working folder."""
    runs = tmp_path / "xlhome" / "runs"
    shutil.copytree(RUNS_FIXTURES, runs)
    record = runs / "20260530-failed" / "run.json"
    data = json.loads(record.read_text())
    data["name"] = LONG_NAME
    record.write_text(json.dumps(data))
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def _env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    return {
        "XL_HOME": str(home / "xlhome"),
        "XL_CONFIG_HOME": str(home / "config"),
        "TERM": "xterm-256color",
        "PATH": os.environ["PATH"],
        "XL_STOP_GRACE": "1",
        **extra,
    }


def _switch(tmux: Tmux, key: str, shown: str, what: str) -> str:
    """Press a screen key until ``shown`` is on screen (a key pressed as the app starts, or right
    after a lone Escape, can be taken for part of an escape sequence); returns the screen."""
    for _ in range(3):
        tmux.keys("w", key)
        try:
            return wait_for(lambda: (s := tmux.screen("w")) and shown in s and s, what, timeout=10)
        except AssertionError:
            continue
    return wait_for(
        lambda: (s := tmux.screen("w")) and shown in s and s,
        what,
        timeout=1,
        screen=lambda: tmux.screen("w"),
    )


def _lines(screen: str) -> list[str]:
    return screen.rstrip("\n").split("\n")


def _footer_keeps_help_and_quit(tmux: Tmux, where: str) -> None:
    wait_for(lambda: (f := _lines(tmux.screen("w"))[-1]) and "? Help" in f and "q Quit" in f,
             f"`? Help` and `q Quit` in the footer of {where}", timeout=10)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "200x60"])
def test_screens_keep_what_matters_at_any_size(simnvml, home, size):
    sleeper = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(120)"]
    rank = subprocess.Popen(
        sleeper,
        env={
            **os.environ,
            "RANK": "3",
            "LOCAL_RANK": "1",
            "XL_RUN_ID": "20260530-142501-train-ab12",
        },
        stdout=subprocess.PIPE,
        text=True,
    )
    tmux = Tmux()
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
        sim = simnvml(
            gpus=[
                SimGPU(),
                SimGPU(
                    util_gpu=90, memory_used_mib=20_000, processes=[SimProcess(rank.pid, 20_000)]
                ),
                SimGPU(),
                SimGPU(),
            ]
        )
        tmux.start(
            "w", ["sh", "-c", f"cd {home} && exec {' '.join(XL)}"], _env(home, sim.env), size=size
        )
        # The run and rank of the process (at 80 columns the run id without its date and time).
        label = "r3 …train-ab12" if size == SMALL else "r3 20260530-142501-train-ab12"
        screen = wait_for(
            lambda: (s := tmux.screen("w")) and label in s and s,
            "the GPUs table with the run and rank",
            screen=lambda: tmux.screen("w"),
        )
        assert "Processes" in screen  # the processes column, header and all
        _footer_keeps_help_and_quit(tmux, "GPUs")

        screen = _switch(tmux, "4", "20260530-wide", "the Runs list")
        for run in (
            "20260530-failed", "20260530-healthy", "20260530-straggler", "20260530-twonode",
            "20260530-wide",
        ):
            assert f" {run} " in screen, screen  # whole ids, whatever the names
        _footer_keeps_help_and_quit(tmux, "Runs")

        # The two-node run in its Monitor: Node and GPU columns whole.
        rows = [line for line in _lines(screen) if "20260530-" in line]
        for _ in range(next(i for i, line in enumerate(rows) if "20260530-twonode" in line)):
            tmux.keys("w", "Down")
        tmux.keys("w", "Enter")
        screen = wait_for(
            lambda: (s := tmux.screen("w")) and "trn-a07" in s and s,
            "the Monitor of the two-node run",
        )
        header = next(line for line in _lines(screen) if "Rank" in line and "State" in line)
        assert header.split()[:4] == ["Node", "Rank", "GPU", "State"], header
        _footer_keeps_help_and_quit(tmux, "the Monitor")
        # Charts only where there is room (a Monitor opened small and then grown: test_tui_keys).
        if size == LARGE:
            wait_for(
                lambda: "samples/s" in tmux.screen("w"),
                "the charts",
                timeout=10,
                screen=lambda: tmux.screen("w"),
            )
        else:
            assert "samples/s" not in screen

        # Launch: the command box stays whole beside its button, above the footer.
        tmux.keys("w", "Escape")
        wait_for(lambda: "xl — Runs" in tmux.screen("w"), "escape: back to Runs")
        _switch(tmux, "3", "Script", "Launch")
        # The Script field has the focus; a path long enough to wrap the command at 80 columns.
        tmux.keys("w", "-l", LONG_SCRIPT)
        screen = wait_for(
            lambda: (s := tmux.screen("w")) and "lora.py" in "".join(_lines(s)[-4:]) and s,
            "the command",
            timeout=10,
            screen=lambda: tmux.screen("w"),
        )
        lines = _lines(screen)
        first = next(i for i, line in enumerate(lines) if "│ xl launch" in line)
        assert "Launch" in lines[first].split("│")[-1], lines[first]  # the button beside the box
        # the box's bottom edge, above the footer
        assert lines[-2].lstrip().startswith("╰"), lines[-3:]
        tmux.keys("w", "Escape")
        wait_for(
            lambda: "q Quit" in _lines(tmux.screen("w"))[-1],
            "escape left the field: the screen keys are back",
        )
        tmux.keys("w", "q")
        wait_for(lambda: "xl-exit=0" in tmux.screen("w"), "q quits")
    finally:
        tmux.kill()
        rank.kill()
        rank.wait(timeout=10)


TINY = """\
import time

import xl

for step in range(1, 2400):
    xl.log(step=step, loss=1.0 / step, samples=8)
    time.sleep(0.05)
"""


def test_ctrl_c_in_the_monitor_of_xl_launch_stops_the_run(simnvml, home):
    """As torchrun: Ctrl-C in the monitor `xl launch` opened stops the run, nothing is left of
    it, and the command exits 1 (stopped); not Textual's "press ctrl+q" toast."""
    (home / "tiny.py").write_text(TINY)
    sim = simnvml(gpus=0, init_error="driver_not_loaded")  # CPU ranks
    tmux = Tmux()
    run_dir: Path | None = None
    try:
        command = ["sh", "-c", f"cd {home} && exec {' '.join(XL)} launch --nproc 2 tiny.py"]
        tmux.start("w", command, _env(home, sim.env), size=LARGE)
        runs = home / "xlhome" / "runs"
        run_dir = wait_for(
            lambda: next(
                (
                    p
                    for p in runs.glob("2*")
                    if (p / "run.json").is_file() and not (RUNS_FIXTURES / p.name).exists()
                ),
                None,
            ),
            "the new run",
        )
        wait_for(
            lambda: tmux.screen("w").count("running") >= 3,
            "both ranks running in the monitor",
            timeout=120,
        )
        tmux.keys("w", "C-c")
        wait_for(
            lambda: "xl-exit=1" in tmux.screen("w"),
            "the command exits 1 once the run stopped",
            timeout=60,
        )
        assert run_json(run_dir)["status"] == "stopped"
        assert "stopped" in tmux.screen("w")
    finally:
        tmux.kill()
        if run_dir is not None and run_json(run_dir).get("status") == "running":
            subprocess.run(
                [*XL, "stop", run_dir.name],
                env={**os.environ, **_env(home, {})},
                capture_output=True,
                timeout=60,
            )
    wait_no_processes(run_dir, timeout=15)


def test_the_app_without_a_terminal_says_so_and_exits_2(home):
    env = {**os.environ, **_env(home, {})}
    out = home / "out.txt"
    with out.open("w") as fh:
        proc = subprocess.run([*XL], stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.PIPE,
                              text=True, env=env, timeout=30)
    assert proc.returncode == 2
    assert out.read_text() == ""  # no escape codes in the file
    assert (
        len(proc.stderr.strip().splitlines()) == 1
        and "needs an interactive terminal" in proc.stderr
    )
    assert "\x1b" not in proc.stderr

    piped = subprocess.run(
        f"{' '.join(XL)} < /dev/null | head; echo rc=${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert piped.stdout.strip() == "rc=2" and "needs an interactive terminal" in piped.stderr

    # `xl attach` into a file keeps its plain view (not the app, not this refusal).
    with out.open("w") as fh:
        attach = subprocess.run(
            [*XL, "attach", "20260530-healthy"],
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=60,
        )
    assert attach.returncode == 0, attach.stderr
    text = out.read_text()
    assert "succeeded" in text and "\x1b[" not in text
