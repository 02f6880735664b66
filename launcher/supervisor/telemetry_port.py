"""The supervisor's one door to telemetry (collector, sampler, log parsing, diagnoses).

Telemetry must never take the run down with it: every call goes through ``call``, which says
what failed in supervisor.log and carries on. Without telemetry (it did not start) the run goes
on with its logs and lifecycle only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from xl.launcher.rundir.metrics import dumps_line
from xl.launcher.supervisor.journal import Journal, say
from xl.launcher.telemetry.service import Telemetry


class TelemetryPort:
    def __init__(self) -> None:
        self.telemetry: Telemetry | None = None
        self.stopped = False
        self.error = ""  # why it did not start

    @property
    def running(self) -> bool:
        return self.telemetry is not None and not self.stopped

    def start(self, run_dir: Path, token: str, emit: Callable[[dict[str, Any]], None], **where: Any) -> dict[str, str]:
        """Start it; returns what the ranks' environment needs (XL_COLLECTOR, XL_TOKEN)."""
        try:
            self.telemetry = Telemetry(run_dir, token=token, emit_event=emit, **where)
            env = dict(self.telemetry.start())
        except Exception as exc:
            say(f"telemetry did not start: {exc!r}")
            self.error = (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__
            self.telemetry = None
            return {"XL_TOKEN": token}
        env.setdefault("XL_TOKEN", token)
        return env

    def call(self, method: str, *args: Any) -> Any:
        if self.telemetry is None:
            return None
        try:
            return getattr(self.telemetry, method)(*args)
        except Exception as exc:  # telemetry must never take the run down with it
            say(f"telemetry.{method} failed: {exc!r}")
            return None

    def feed_log_line(self, rank: int, line: str) -> None:
        self.call("feed_log_line", rank, line)

    def stop(self) -> None:
        """Flush and stop it, once."""
        if not self.stopped:
            self.stopped = True
            self.call("stop")


def forward_records(journal: Journal) -> Callable[[list[dict[str, Any]]], None]:
    """Node > 0: what its telemetry samples goes to node 0 over the link, as metrics lines."""

    def forward(records: list[dict[str, Any]]) -> None:
        for rec in records:
            journal.send({"type": "rec", "rank": rec["rank"], "line": dumps_line(rec).decode()})

    return forward
