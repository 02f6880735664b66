"""Runs under the real `xl launch`, for tests/e2e/test_supervisor_*.py: a script, a launch whose
view is the plain line view (stdout is a pipe), and the stop grace xl_env sets (XL_STOP_GRACE=1).
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

from procs import XL

# XL_STOP_GRACE in procs.xl_env: every process of a stopped run is gone GRACE + 2 s later
GRACE = 1.0


def write_script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def popen_launch(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    # stdout is a pipe, not a terminal: the plain line view.
    return subprocess.Popen(
        [*XL, "launch", "--no-tui", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
