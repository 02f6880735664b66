"""The supervisor's telemetry: collector, sampler, log parsing and the diagnoses made from them.

Here too: collector.json, the collector's counts and where it listens (docs/contracts.md, "The
run directory"), read and written by these functions only. They live in the package itself,
with the run dir's own modules as their only imports, because the supervisor reads the port
an earlier collector of the run listened on before it imports telemetry
(launcher/supervisor/safe_telemetry.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xl.atomic import write_json_atomic
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.runrecord import read_object


def read_collector_json(run_dir: Path) -> dict[str, Any] | None:
    """collector.json as an object; None while it is missing, damaged or mid-replace."""
    return read_object(RunLayout(run_dir).collector)


def write_collector_json(run_dir: Path, status: dict[str, Any]) -> None:
    write_json_atomic(RunLayout(run_dir).collector, status)


def previous_port(run_dir: Path) -> int:
    """The port an earlier collector of the run listened on, as its ranks know it; 0 for none."""
    port = (read_collector_json(run_dir) or {}).get("port")
    if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
        return port
    return 0
