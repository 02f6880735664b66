"""A new run's id: ``<date>-<time>-<name>-<4 hex>`` (docs/contracts.md, "Run dir").

Its own module, with the standard library's os, re and time only: `xl launch` names its run
before it imports the rest of what it runs (xl.launcher.early)."""

from __future__ import annotations

import os
import re
import time


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")[:32] or "run"


def new_run_id(name: str | None, script: str | None, module: str | None) -> str:
    """``<date>-<time>-<name>-<4 hex>``: sorts by start, says what ran (``name``, else the
    script's stem or the module's last part), and two launches in one second rarely collide
    (start_run retries when they do)."""
    if name:
        base = name
    elif script:
        base = os.path.splitext(os.path.basename(script))[0]
    else:
        base = str(module).rsplit(".", 1)[-1]
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(base)}-{os.urandom(2).hex()}"
