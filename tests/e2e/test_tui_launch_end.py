"""`xl launch` in a real terminal (tmux), with real CPU ranks: when the run ends, the monitor it
opened closes by itself, as torchrun returns, so `xl launch … && next` goes on; what the run came
to stays on the terminal (a failure's traceback, the outcome, the `xl logs` command) and the
exit code says it. No process of the run is left."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from procs import XL, end_run, run_json
from tmuxterm import Tmux, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

SMALL, LARGE = (80, 24), (200, 60)
ERROR = (
    "ValueError: the batch at step 3 holds a label outside the vocabulary: 50257 >= vocab_size "
    "50000 (check the tokenizer)"
)

SCRIPT = f"""\
import os
import time

import xl

rank = int(os.environ["RANK"])
for step in range(1, 13):
    xl.log(step=step, loss=1.0 / step, samples=8)
    print(f"step {{step}}", flush=True)
    if step == 3 and rank == 1 and os.environ.get("FAIL"):
        raise ValueError({ERROR.removeprefix("ValueError: ")!r})
    time.sleep(0.5)
"""


def _env(home: Path, sim_env: dict[str, str], **extra: str) -> dict[str, str]:
    return {
        "XL_HOME": str(home / "xlhome"),
        "XL_CONFIG_HOME": str(home / "config"),
        "TERM": "xterm-256color",
        "PATH": os.environ["PATH"],
        "XL_STOP_GRACE": "1",
        **sim_env,
        **extra,
    }


def _run(
    tmux: Tmux, home: Path, size: tuple[int, int], sim_env: dict[str, str], **extra: str
) -> tuple[Path, str]:
    """`xl launch --nproc 2 train.py && echo next-command-ran` in a terminal of ``size``; the run
    dir and the terminal once the command has returned."""
    command = [
        "sh",
        "-c",
        f"cd {home} && {' '.join(XL)} launch --nproc 2 train.py && echo next-command-ran",
    ]
    tmux.start("w", command, _env(home, sim_env, **extra), size=size)
    runs = home / "xlhome" / "runs"
    run_dir = wait_for(
        lambda: next((p for p in runs.glob("2*") if (p / "run.json").is_file()), None),
        "the run",
        timeout=60,
    )
    # The monitor shows the run while it trains (the app's alternate screen); at 80 columns its
    # header says the world size without its words.
    wait_for(
        lambda: any(said in tmux.screen("w") for said in ("world size 2", "  2 ranks")),
        "the monitor of the run",
        timeout=90,
        screen=lambda: tmux.screen("w"),
    )
    screen = wait_for(
        lambda: (s := tmux.screen("w")) and "xl-exit=" in s and s,
        "the command returned by itself",
        timeout=120,
        screen=lambda: tmux.screen("w"),
    )
    return run_dir, screen


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "200x60"])
def test_a_failed_run_closes_its_monitor_and_leaves_the_cause_on_the_terminal(
    simnvml, tmp_path, size
):
    (tmp_path / "train.py").write_text(SCRIPT)
    sim = simnvml(gpus=0, init_error="driver_not_loaded")  # CPU ranks
    tmux = Tmux()
    run_dir: Path | None = None
    try:
        run_dir, screen = _run(tmux, tmp_path, size, sim.env, FAIL="1")
        assert run_json(run_dir)["status"] == "failed"
        text = "".join(screen.split())  # the terminal wraps long lines: compare without the breaks
        # like torchrun: && stops here
        assert "xl-exit=1" in screen and "next-command-ran" not in screen
        assert "".join(f"xl: run {run_dir.name} failed after".split()) in text
        assert "".join(ERROR.split()) in text, screen  # the root cause, whole
        assert f"xllogs{run_dir.name}--rank1" in text, screen  # and where the rest of it is
    finally:
        tmux.kill()
        if run_dir is not None and run_json(run_dir).get("status") == "running":
            subprocess.run(
                [*XL, "stop", run_dir.name],
                env={**os.environ, **_env(tmp_path, {})},
                capture_output=True,
                timeout=60,
            )
    end_run(None, run_dir, timeout=15)


def test_a_run_that_succeeded_returns_and_the_next_command_runs(simnvml, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    sim = simnvml(gpus=0, init_error="driver_not_loaded")
    tmux = Tmux()
    run_dir: Path | None = None
    try:
        run_dir, screen = _run(tmux, tmp_path, SMALL, sim.env)
        assert run_json(run_dir)["status"] == "succeeded"
        assert "xl-exit=0" in screen and "next-command-ran" in screen
        assert f"xl: run {run_dir.name} succeeded after" in "".join(screen.splitlines())
    finally:
        tmux.kill()
        if run_dir is not None and run_json(run_dir).get("status") == "running":
            subprocess.run(
                [*XL, "stop", run_dir.name],
                env={**os.environ, **_env(tmp_path, {})},
                capture_output=True,
                timeout=60,
            )
    end_run(None, run_dir, timeout=15)
