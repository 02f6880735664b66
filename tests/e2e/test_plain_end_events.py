"""The plain view of `xl launch --no-tui` with its output in a file (`> out.txt 2>&1`) loses no
event of a short run, however it ends: real 2-rank gloo CPU runs that succeed, whose rank 1
raises, whose rank 1 is SIGKILLed, several of each at once. The supervisor saves run.json's final
status first and appends its ``run_ended`` event after: every event in events.jsonl, the last
(`HH:MM:SS xl: run failed`) too, is printed once, before the end table and the closing line. In
a terminal the live view's last frame ends with the same event and the closing line follows it.
No process of a run is left.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from procs import XL, end_run, only_run, run_json, wait_no_processes, xl_env
from supervised import write_script
from tmuxterm import Tmux, wait_for

pytestmark = pytest.mark.e2e

# Ends right after the process group is made: the run's end is as short as a run's can be.
SCRIPT = """
import os, signal
import torch.distributed as dist
dist.init_process_group("gloo")
how = os.environ["HOW"]
if how != "succeeds" and dist.get_rank() == 1:
    if how == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("rank 1 read a bad batch")
if how == "succeeds":
    # Leave together: a rank that tears gloo down while its peer still connects its mesh fails
    # that peer ("Connection closed by peer"), and the run that was to succeed does not.
    dist.barrier()
    dist.destroy_process_group()
"""

RUNS = 3  # of each way to end, side by side: a busy machine is where the end is raced
STATUS = {"succeeds": "succeeded", "raises": "failed", "killed": "failed"}


def _events(run_dir: Path) -> list[dict[str, Any]]:
    text = (run_dir / "events.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _line(ev: dict[str, Any]) -> str:
    """The plain view's line of ``ev`` (a 2-rank run's events are one line each)."""
    return f"{time.strftime('%H:%M:%S', time.localtime(ev['t']))} xl: {ev['message']}"


@pytest.mark.timeout(420)
@pytest.mark.parametrize("how", ["succeeds", "raises", "killed"])
def test_every_event_is_printed_before_the_end_table_in_a_file(tmp_path: Path, how: str) -> None:
    script = write_script(tmp_path, "train.py", SCRIPT)
    homes = [tmp_path / f"home-{i}" for i in range(RUNS)]
    outs = [tmp_path / f"out-{i}.txt" for i in range(RUNS)]
    launches: list[subprocess.Popen[bytes]] = []
    try:
        for home, out in zip(homes, outs, strict=True):
            with out.open("wb") as f:
                launches.append(
                    subprocess.Popen(
                        [*XL, "launch", "--no-tui", "--nproc", "2", str(script)],
                        env=xl_env(home, HOW=how),
                        cwd=tmp_path,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                    )
                )
        codes = [p.wait(timeout=300) for p in launches]
        for home, out, code in zip(homes, outs, codes, strict=True):
            run_dir, text = only_run(home), out.read_text()
            status = run_json(run_dir)["status"]
            assert (status, code) == (STATUS[how], 0 if how == "succeeds" else 1), text
            lines = text.splitlines()
            # the end table: its title line, then its border
            border = next(i for i, line in enumerate(lines) if line.startswith("+-"))
            title = border - 1
            assert f"{run_dir.name}  {status}" in lines[title], text
            closing = [
                i
                for i, line in enumerate(lines)
                if line.startswith(f"xl: run {run_dir.name} {status} after")
            ]
            assert len(closing) == 1, text
            events = _events(run_dir)
            assert events[-1]["kind"] == "run_ended", events
            for ev in events:
                assert _line(ev) in lines[:title], f"{ev}\n{text}"
            # the run's own end: once, the last event printed, before the table
            ended = [
                i
                for i, line in enumerate(lines)
                if re.fullmatch(r"\d\d:\d\d:\d\d xl: run \w+", line)
            ]
            assert [lines[i] for i in ended] == [_line(events[-1])], text
            assert lines[ended[0]].endswith(f" xl: run {status}"), text
            assert ended[0] < title < closing[0], text
            other = "failed" if status == "succeeded" else "succeeded"
            assert f"xl: run {other}" not in text, text
            wait_no_processes(run_dir, timeout=30)
    finally:
        for launch, home in zip(launches, homes, strict=False):
            end_run(launch, only_run(home) if (home / "runs").is_dir() else None, timeout=30)


@pytest.mark.timeout(240)
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_live_view_in_a_terminal_ends_with_the_run_ended_event(tmp_path: Path) -> None:
    """`xl launch --no-tui` in a real terminal draws the live table (not the plain lines): its
    last frame's events end with `xl: run failed`, and the closing line comes after it."""
    write_script(tmp_path, "train.py", SCRIPT)
    home = tmp_path / "xlhome"
    env = {
        "XL_HOME": str(home),
        "TERM": "xterm-256color",
        "PATH": os.environ["PATH"],
        "XL_STOP_GRACE": "1",
        "HOW": "raises",
    }
    command = ["sh", "-c", f"cd {tmp_path} && {' '.join(XL)} launch --no-tui --nproc 2 train.py"]
    tmux = Tmux()
    run_dir: Path | None = None
    try:
        tmux.start("w", command, env, size=(160, 50))
        screen = wait_for(
            lambda: (s := tmux.screen("w")) and "xl-exit=" in s and s,
            "the command returned by itself",
            timeout=180,
            screen=lambda: tmux.screen("w"),
        )
        run_dir = only_run(home)
        assert run_json(run_dir)["status"] == "failed" and "xl-exit=1" in screen, screen
        lines = screen.splitlines()
        # the live table (heavy box), never the plain view's lines and ASCII end table
        assert any("┃" in line for line in lines), screen
        assert not any(line.startswith("+-") for line in lines), screen
        assert "reopens it" not in screen, screen
        ended = [i for i, line in enumerate(lines) if re.search(r"\d\d:\d\d:\d\d xl: run ", line)]
        closing = [i for i, line in enumerate(lines) if f"run {run_dir.name} failed after" in line]
        assert len(ended) == 1 and lines[ended[0]].strip().endswith("xl: run failed"), screen
        assert len(closing) == 1 and ended[0] < closing[0], screen
        assert "xl: run succeeded" not in screen, screen
    finally:
        tmux.kill()
        end_run(None, run_dir, timeout=30)
