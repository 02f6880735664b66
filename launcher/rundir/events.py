"""events.jsonl: lifecycle and diagnoses, one JSON object a line (docs/contracts.md, "events.jsonl").

The one place an event line is made and appended, for the supervisor, its telemetry and the
viewers that end an orphaned run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.outcome import Failure


def event_line(event: dict[str, Any]) -> str:
    """``event`` as its line, with ``t`` (now) and ``rank`` (None) filled in when missing."""
    event.setdefault("t", time.time())
    event.setdefault("rank", None)
    return json.dumps(event, default=str) + "\n"


def append_event(run_dir: Path, event: dict[str, Any]) -> None:
    """Append one event to ``run_dir``'s events.jsonl (OSError when it cannot be written)."""
    line = event_line(event)
    with open(RunLayout(run_dir).events, "a", encoding="utf-8") as fh:
        fh.write(line)


def failure_event(failure: Failure) -> dict[str, Any]:
    """The ``failure`` event of ``failure``: the one way it is written (one event per failure),
    with the same ``cause`` as run.json's ``failure``."""
    return {
        "kind": "failure",
        "rank": failure.rank,
        "exit_code": failure.exit_code,
        "node": failure.host,
        "node_rank": failure.node_rank,
        "message": failure.message,
        "cause": failure.cause.to_json() if failure.cause is not None else None,
    }
