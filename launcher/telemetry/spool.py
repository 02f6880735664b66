"""What rank processes left in ``<run_dir>/spool/``: stored once the rank that wrote it is gone.

A rank spools the lines its collector could not take (``xl.client.spool``) and replays them
itself when it reconnects; a rank that died first, or a supervisor that was restarted, leaves
files only the supervisor can store. Files are claimed by a rename before they are read, so a
rank's own replay and this ingestion never store the same lines twice.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xl import wire
from xl.launcher.rundir.layout import RunLayout, spool_owner
from xl.launcher.rundir.metrics import MetricsWriter
from xl.launcher.runprocs import alive


# edge: a spool file's metrics lines, handed on decoded as the collector hands the wire's
def ingest_spool(
    run_dir: Path,
    writer: MetricsWriter,
    on_records: Callable[[int, list[dict[str, Any]]], None],
) -> int:
    """Store the spool files of rank processes that are gone; returns records stored."""
    folder = RunLayout(run_dir).spool
    if not folder.is_dir():
        return 0
    stored = 0
    for path in sorted(folder.iterdir()):
        owner = spool_owner(
            path.name
        )  # a rank's spool file, or one it claimed to replay and never finished
        if owner is None:
            continue
        rank, pid = owner
        if pid != os.getpid() and alive(pid):
            continue  # a live rank replays its own spool on reconnect
        claimed = path.with_name(path.name + f".ingest-{os.getpid()}")
        try:
            os.rename(path, claimed)
            raw = claimed.read_bytes()
        except OSError:
            continue
        lines: list[bytes] = []
        good: list[dict[str, Any]] = []
        for line in raw.split(b"\n"):
            if not line.strip():
                continue
            try:
                good.append(wire.parse_record(line, rank))
            except wire.FrameError:
                continue  # a torn last line from a killed rank
            lines.append(line)
        writer.write_lines(lines)
        writer.flush()
        if good:
            on_records(rank, good)
        stored += len(lines)
        with contextlib.suppress(OSError):
            claimed.unlink()
    return stored
