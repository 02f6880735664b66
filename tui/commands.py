"""`xl launch`, `xl demo` and `xl attach` with the Textual monitor on a terminal.

The launcher owns these commands but never imports the UI (docs/architecture.md, boundaries); this
module
joins the two: on an interactive terminal it hands the launcher a viewer that opens the monitor,
anywhere else (pipes, CI, TERM=dumb) the launcher's own Rich/plain view runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xl.tui.terminal import interactive as _interactive


def _monitor_own_run(run_dir: Path, _proc: Any, notice: str | None = None) -> int:
    from xl.tui.app import run_monitor  # noqa: PLC0415 - Textual costs ~150 ms; only terminals need it

    return run_monitor(run_dir, attach_only=False, notice=notice)


def _monitor_attached(run_dir: Path) -> int:
    from xl.tui.app import run_monitor  # noqa: PLC0415 - Textual costs ~150 ms; only terminals need it

    return run_monitor(run_dir, attach_only=True)


def launch_main(argv: Sequence[str]) -> int:
    from xl.launcher.cli import launch as cmd_launch  # noqa: PLC0415 - `xl` loads only the command it runs

    return cmd_launch.main(argv, viewer=_monitor_own_run if _interactive() else None)


def demo_main(argv: Sequence[str]) -> int:
    from xl.launcher.cli import demo as cmd_demo  # noqa: PLC0415 - `xl` loads only the command it runs

    return cmd_demo.main(argv, viewer=_monitor_own_run if _interactive() else None)


def attach_main(argv: Sequence[str]) -> int:
    from xl.launcher.cli import attach as cmd_attach  # noqa: PLC0415 - `xl` loads only the command it runs

    return cmd_attach.main(argv, viewer=_monitor_attached if _interactive() else None)
