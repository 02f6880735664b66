"""A real terminal for tests: a private tmux server, a command in a pane, keys in, the screen
out."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class Tmux:
    """One private tmux server (its own -L socket) so tests never touch a person's sessions."""

    def __init__(self) -> None:
        self.socket = f"xl-test-{uuid.uuid4().hex[:8]}"

    def run(self, *args: str) -> str:
        # The server (started by the first call) passes its environment to every pane: never a
        # COLUMNS/LINES left in this process's C environment (a Textual test run puts them
        # there), which would pin the app's size whatever the pane's.
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        proc = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=20, env=env
        )
        return proc.stdout

    def start(
        self, name: str, command: Sequence[str], env: Mapping[str, str],
        size: tuple[int, int] = (120, 40),
    ) -> None:
        shell = " ".join(quote(a) for a in command)
        exports = " ".join(f"{k}={quote(v)}" for k, v in env.items())
        # The trailing sleep keeps the pane readable after the app exits (its exit message and
        # the command's exit code, which the test checks).
        self.run(
            "new-session", "-d", "-s", name, "-x", str(size[0]), "-y", str(size[1]),
            f"env {exports} {shell}; echo xl-exit=$?; sleep 60",
        )

    def resize(self, name: str, size: tuple[int, int]) -> None:
        self.run("resize-window", "-t", name, "-x", str(size[0]), "-y", str(size[1]))

    def screen(self, name: str) -> str:
        return self.run("capture-pane", "-p", "-t", name)

    def keys(self, name: str, *keys: str) -> None:
        self.run("send-keys", "-t", name, *keys)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=20)


def quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def wait_for(
    predicate: Callable[[], T],
    what: str,
    timeout: float = 90.0,
    screen: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it holds; on timeout the failure shows ``screen()`` when given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    shown = f"\n{screen()}" if screen is not None else ""
    raise AssertionError(f"timed out waiting for: {what}{shown}")


def tui_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of `xl` in a pane: XL_HOME and XL_CONFIG_HOME under ``home``, a colour
    terminal, this PATH and the short stop grace of procs.xl_env, then ``extra``."""
    return {
        "XL_HOME": str(home / "xlhome"),
        "XL_CONFIG_HOME": str(home / "config"),
        "TERM": "xterm-256color",
        "PATH": os.environ["PATH"],
        "XL_STOP_GRACE": "1",
        **extra,
    }
