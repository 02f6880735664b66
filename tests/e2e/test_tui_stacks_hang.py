"""The Monitor's `k` on a real hang, in a real terminal (tmux) at 80x24 and 200x60: with the
victim (rank 0) chosen, the verdict is still the whole run's and names rank 1, the view has a
footer with its keys, `?` shows them, `]` shows the culprit's stacks. Ctrl-C then stops the run
`xl launch` started, and nothing of it is left."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from procs import XL, end_run, run_json
from tmuxterm import Tmux, wait_for
from where import SUPPORT

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

HANG = SUPPORT / "hang_ddp.py"


def _events_tail(run_dir: Path) -> str:
    """The run's last events and the supervisor log's end: what a wait that timed out had to go
    on."""
    said = []
    for name in ("events.jsonl", "supervisor.log"):
        try:
            said += [f"{name}:", *(run_dir / name).read_text(errors="replace").splitlines()[-15:]]
        except OSError as exc:
            said.append(f"{name}: {exc}")
    return "\n" + "\n".join(said)


def _flat(text: str) -> str:
    return "".join(text.split())  # the terminal wraps long lines: compare without the breaks


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_k_on_a_hang_shows_the_whole_run_s_verdict_with_its_keys(simnvml, tmp_path, size):
    sim = simnvml(gpus=0, init_error="driver_not_loaded")  # CPU ranks
    env = {
        "XL_HOME": str(tmp_path / "xlhome"),
        "XL_CONFIG_HOME": str(tmp_path / "config"),
        "TERM": "xterm-256color",
        "PATH": os.environ["PATH"],
        "XL_STOP_GRACE": "1",
        "XL_STALL_MIN_S": "3",
        **sim.env,
    }
    tmux = Tmux()
    run_dir: Path | None = None
    try:
        command = [
            "sh",
            "-c",
            f"cd {tmp_path} && exec {' '.join(XL)} launch --nproc 2 {HANG} --mode sleep --rank 1 "
            "--at 3",
        ]
        tmux.start("w", command, env, size=size)
        runs = tmp_path / "xlhome" / "runs"
        run_dir = wait_for(
            lambda: next((p for p in runs.glob("2*") if (p / "run.json").is_file()), None),
            "the run",
            timeout=60,
        )
        # The hang is named (the banner) once the run stalls; rank 0, the first row, is chosen.
        wait_for(
            lambda: (
                "never entered" in _flat(tmux.screen("w"))
                or "waitsinall_reduce" in _flat(tmux.screen("w"))
            ),
            "the hang banner",
            timeout=120,
            screen=lambda: tmux.screen("w") + _events_tail(run_dir),
        )
        tmux.keys("w", "k")

        def stacks_of_rank_0(screen: str) -> bool:
            flat, footer = _flat(screen), screen.rstrip("\n").split("\n")[-1]
            # not "every rank is there"
            return (
                "verdict(all2ranks):rank1neverenteredall_reduce#" in flat
                and "rank0pid" in flat
                and "r Ask again" in footer
                and "esc Close" in footer
                and "? Help" in footer
            )

        # Waited for as a whole: a capture can catch a frame half drawn.
        wait_for(
            lambda: stacks_of_rank_0(tmux.screen("w")),
            "rank 0's stacks under the whole run's verdict, with a footer",
            timeout=60,
            screen=lambda: tmux.screen("w"),
        )
        tmux.keys("w", "?")
        wait_for(
            lambda: "Stacks" in tmux.screen("w") and "ask every rank again" in tmux.screen("w"),
            "the stacks view's help",
            timeout=20,
            screen=lambda: tmux.screen("w"),
        )
        tmux.keys("w", "Escape")
        wait_for(
            lambda: "ask every rank again" not in tmux.screen("w"), "the help closed", timeout=20
        )
        tmux.keys("w", "]")
        wait_for(
            lambda: all(
                k in _flat(tmux.screen("w"))
                for k in ("rank1pid", "astray", "verdict(all2ranks):rank1neverentered")
            ),
            "rank 1's stacks under the same verdict",
            timeout=20,
            screen=lambda: tmux.screen("w"),
        )
        tmux.keys("w", "Escape")
        wait_for(lambda: "r Ask again" not in tmux.screen("w"), "back to the Monitor", timeout=20)
        tmux.keys("w", "C-c")
        wait_for(
            lambda: "xl-exit=1" in tmux.screen("w"),
            "Ctrl-C stopped the run and the command returned",
            timeout=60,
            screen=lambda: tmux.screen("w"),
        )
        assert run_json(run_dir)["status"] == "stopped"
    finally:
        tmux.kill()
        if run_dir is not None and run_json(run_dir).get("status") == "running":
            subprocess.run(
                [*XL, "stop", run_dir.name],
                env={**os.environ, **env},
                capture_output=True,
                timeout=60,
            )
    end_run(None, run_dir, timeout=15)
