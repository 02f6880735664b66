"""Whether this process talks to a person's terminal: the app and the monitor need one.

Textual-free, so `xl launch` and `xl attach` decide between the monitor and the plain view
without loading the app.
"""

from __future__ import annotations

import os
import sys

NOT_A_TERMINAL = (
    "xl: the app needs an interactive terminal (stdin and stdout are not both one); "
    "in scripts use `xl gpus`, `xl doctor` or `xl runs`"
)


def interactive() -> bool:
    """stdin and stdout are a terminal that can show the app (not TERM=dumb, a pipe or a file)."""
    if os.environ.get("TERM", "") in ("", "dumb"):
        return False
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError):  # closed or replaced streams
        return False
