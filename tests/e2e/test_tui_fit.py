"""What a person sees in a real terminal (tmux) at 80x24 and 200x60, with the real `xl`: keys typed
fast right after `3` all land in Launch's Script field, in order; the picker's warnings for
four busy GPUs are whole; a long run id leaves room for the run's name in Runs; the Monitor's log
wraps a traceback's long last line instead of cutting it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from procs import XL
from simnvml import SimGPU, SimProcess
from tmuxterm import Tmux, wait_for
from where import FIXTURES

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

RUNS_FIXTURES = FIXTURES / "runs"
SIZES = [(80, 24), (200, 60)]
IDS = ["80x24", "200x60"]
# A `q` and digits in it: typed into the field, never taken for quit or for a screen.
SCRIPT = "experiments/q4_sweep/train_2nodes.py"
ARGS = "lr=3e-4 quit_after=12 data=[1,2]"  # Hydra style (a leading - would be a flag to tmux)
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 79.15 GiB "
    "total capacity)"
)
LONG_ID = "20260530-142501-bert-finetune-v2-ab12"  # as `xl launch --name bert-finetune-v2` names it


def _env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    return {
        "XL_HOME": str(home / "xlhome"),
        "XL_CONFIG_HOME": str(home / "config"),
        "TERM": "xterm-256color",
        "PATH": os.environ["PATH"],
        **extra,
    }


def _fields(screen: str) -> tuple[str | None, ...]:
    """What the Script and Args fields show (their rows: `Label  ▊  value  ▎`, or at 80x24, where
    the fields have no border, `Label  value` with the value past the 17-column label; None: not
    drawn)."""
    rows = {
        line.split()[0]: line
        for line in screen.splitlines()
        if line.split() and line.split()[0] in ("Script", "Args")
    }

    def value(row: str) -> str:
        return row.split("▊", 1)[1].rsplit("▎", 1)[0].strip() if "▊" in row else row[18:].strip()

    return tuple(value(row) if (row := rows.get(k)) else None for k in ("Script", "Args"))


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_keys_typed_fast_after_3_all_reach_the_script_field_in_order(simnvml, tmp_path, size):
    (tmp_path / "experiments" / "q4_sweep").mkdir(parents=True)
    (tmp_path / SCRIPT).write_text("print('hi')\n")
    sim = simnvml(gpus=2)
    for attempt in range(3):
        _type_in_launch(tmp_path, _env(tmp_path, sim.env), size, attempt)


def _type_in_launch(home: Path, env: dict[str, str], size: tuple[int, int], attempt: int) -> None:
    tmux = Tmux()
    try:
        tmux.start("w", ["sh", "-c", f"cd {home} && exec {' '.join(XL)}"], env, size=size)
        wait_for(lambda: "A100" in tmux.screen("w"), "the GPUs screen")
        # One write, as fast as a terminal delivers a paste-speed burst: the screen key and the
        # script; then tab and the arguments.
        tmux.keys("w", "-l", "3" + SCRIPT)
        tmux.keys("w", "Tab")
        tmux.keys("w", "-l", ARGS)
        # Waited for (a capture can catch a frame half drawn); lost or reordered keys never
        # get there.
        wait_for(
            lambda: _fields(tmux.screen("w")) == (SCRIPT, ARGS),
            f"both fields typed whole (attempt {attempt})",
            timeout=40,
            screen=lambda: tmux.screen("w"),
        )
        tmux.keys("w", "Escape")
        wait_for(
            lambda: "q Quit" in tmux.screen("w").rstrip("\n").split("\n")[-1], "the field left"
        )
        tmux.keys("w", "q")
        wait_for(lambda: "xl-exit=0" in tmux.screen("w"), "q quits")
    finally:
        tmux.kill()


def _panel(screen: str) -> str:
    """The picker panel's text (right of the history), without spaces: its lines wrap anywhere."""
    return "".join(
        "".join(line.split("││")[-1].strip("│").split())
        for line in screen.splitlines()
        if "││" in line
    )


OOM_KEY = "".join(OOM.split())  # compared without spaces: a wrap may fall on one


def _log_pane(screen: str) -> str | None:
    """What the Monitor's log pane shows of rank 1, without spaces (None before it shows rank 1):
    the rows below its title, above the footer, from its left edge (beside the charts at 200x60)."""
    lines = screen.splitlines()
    title = next((i for i, line in enumerate(lines) if "Log — rank 1" in line), None)
    if title is None:
        return None
    left = lines[title].index("Log — rank 1") - 1
    return "".join("".join(line[left:] for line in lines[title + 1:-1]).split())


def _busy_sleepers(n: int) -> list[subprocess.Popen[str]]:
    sleeper = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(120)"]
    procs = []
    for rank in range(n):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "XL_RUN_ID": "20260530-150000-other-9f3c",
        }
        procs.append(subprocess.Popen(sleeper, env=env, stdout=subprocess.PIPE, text=True))
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return procs


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_warnings_names_and_tracebacks_fit_the_terminal(simnvml, tmp_path, size):
    runs = tmp_path / "xlhome" / "runs"
    shutil.copytree(RUNS_FIXTURES, runs)
    # A run id as xl makes them (date, time, script, tag), with its name.
    long_run = runs / LONG_ID
    shutil.copytree(runs / "20260530-healthy", long_run)
    record = json.loads((long_run / "run.json").read_text())
    record.update(run_id=LONG_ID, name="bert-finetune-v2")
    (long_run / "run.json").write_text(json.dumps(record))
    others = _busy_sleepers(4)
    tmux = Tmux()
    try:
        sim = simnvml(
            gpus=[
                SimGPU(util_gpu=90, memory_used_mib=20_000, processes=[SimProcess(p.pid, 20_000)])
                for p in others
            ]
        )
        tmux.start(
            "w",
            ["sh", "-c", f"cd {tmp_path} && exec {' '.join(XL)}"],
            _env(tmp_path, sim.env),
            size=size,
        )
        wait_for(lambda: "A100" in tmux.screen("w"), "the GPUs screen")
        for key in ("space", "Down", "space", "Down", "space", "Down", "space"):
            tmux.keys("w", key)
        # Four busy GPUs picked: the warning is whole, above the buttons; each process named by
        # its rank and run. (Waited for: a capture can catch a frame half drawn.)
        warning = "⚠GPUs0,1,2,3arebusy(otherprocessesorload):rankswillsharethem"
        label = "r0 …other-9f3c" if size == SIZES[0] else "r0 20260530-150000-other-9f3c"
        wait_for(
            lambda: (
                (s := tmux.screen("w"))
                and warning in _panel(s)
                and "LOCAL_RANK 3" in s
                and label in s
            ),
            "four busy GPUs picked, the warning whole",
            screen=lambda: tmux.screen("w"),
        )

        tmux.keys("w", "4")
        # The name whole, beside the whole id.
        wait_for(
            lambda: any(
                LONG_ID in line and "bert-finetune-v2" in line
                for line in tmux.screen("w").splitlines()
            ),
            "Runs with the long id and its name",
            screen=lambda: tmux.screen("w"),
        )
        tmux.keys("w", "q")
        wait_for(lambda: "xl-exit=0" in tmux.screen("w"), "q quits")

        # The failed run's Monitor, rank 1 (which failed): the traceback's last line, wrapped.
        tmux.kill()
        tmux = Tmux()
        tmux.start(
            "w",
            ["sh", "-c", f"cd {tmp_path} && exec {' '.join(XL)} attach 20260530-failed"],
            _env(tmp_path, sim.env),
            size=size,
        )
        wait_for(
            lambda: "Log — rank 0" in tmux.screen("w"),
            "the Monitor",
            screen=lambda: tmux.screen("w"),
        )
        tmux.keys("w", "]")
        wait_for(
            lambda: (pane := _log_pane(tmux.screen("w"))) is not None and OOM_KEY in pane,
            "rank 1's log with the traceback's last line whole",
            screen=lambda: tmux.screen("w"),
        )
        tmux.keys("w", "q")
        wait_for(
            lambda: "xl-exit=1" in tmux.screen("w"),
            "the app gone (the run it shows failed: exit 1)",
        )
    finally:
        tmux.kill()
        for proc in others:
            proc.kill()
            proc.wait(timeout=10)
