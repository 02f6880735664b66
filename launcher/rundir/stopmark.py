"""A stop asked for before the run's supervisor could take it: the ``stop`` file in the run dir.

`xl stop` writes it first, whatever the run's state; a supervisor checks it once its own stop
signals are caught and before it starts torchrun, so a run stopped while its supervisor was
still starting (a slow interpreter, a slow disk) never starts training. The file holds when the
stop was asked for (unix seconds).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from xl.launcher.rundir.layout import RunLayout


def ask_stop(run_dir: Path) -> None:
    """Leave the stop for the supervisor (OSError when the run dir cannot take it)."""
    fd = os.open(RunLayout(run_dir).stop, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, f"{time.time():.3f}\n".encode())
    finally:
        os.close(fd)


def stop_asked(run_dir: Path) -> bool:
    return os.path.exists(RunLayout(run_dir).stop)
