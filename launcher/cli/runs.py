"""``xl runs [--json]``: every run under XL_HOME, newest first as in the app's Runs screen
(``--json``: the store's order, oldest first, as scripts have read it)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from xl.errors import ArgumentParser
from xl.launcher.rundir import record, timing
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.outcome import Cause
from xl.launcher.rundir.record import RunRecord, RunStatus, read_object
from xl.launcher.rundir.store import GONE, NOT_YOURS, STARTING, UNREADABLE, RunInfo, list_runs
from xl.textsafe import visible


def _duration(info: RunInfo) -> str:
    if info.started_at is None or info.status in (UNREADABLE, NOT_YOURS):
        return ""  # a damaged run.json tells neither its start nor its end
    end = info.ended_at or time.time()
    s = int(max(0.0, end - info.started_at))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _status(info: RunInfo) -> str:
    if info.status == UNREADABLE:
        return "unreadable (run.json damaged)"
    if info.supervisor == STARTING:
        return STARTING
    if info.status == RunStatus.RUNNING and info.supervisor == GONE:
        return "running (supervisor gone; 'xl stop' cleans up)"
    return info.status


def _split(info: RunInfo) -> dict[str, Any] | None:
    """Each rank's per-step split from a finished run's digest.json (``{}``: no step was timed);
    None while it runs, or with no digest (a run ended by an older xl)."""
    if info.ended_at is None:
        return None
    ranks = (read_object(RunLayout(info.run_dir).digest) or {}).get("ranks")
    if not isinstance(ranks, dict):
        return None
    return {
        rank: split
        for rank, entry in ranks.items()
        if (split := timing.per_step(entry)) is not None
    }


def _failure(rec: RunRecord | None) -> dict[str, Any]:
    """``failure`` (run.json's, or null) and its ``cause`` (or null), for a run's listing."""
    failure = rec.failure_json if rec is not None else None
    cause = Cause.from_json(failure.get("cause")) if failure else None
    return {"failure": failure, "cause": cause.to_json() if cause is not None else None}


def main(argv: Sequence[str]) -> int:
    p = ArgumentParser(
        prog="xl runs",
        description=(
            "List runs, newest first (as the app's Runs screen); --json lists them oldest first."
        ),
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON array of runs, oldest first (the order runs were made)",
    )
    ns = p.parse_args(list(argv))
    runs = list_runs()
    if ns.json:
        # ``time``: where a finished run's time went (docs/compare.md), null while it runs;
        # ``split``: where each rank's steps' time went, per step;
        # ``failure``: its root cause with ``cause`` (docs/contracts.md), null unless it failed.
        out = []
        for r in runs:
            rec = record.load(r.run_dir)
            spent = timing.valid(rec.time if rec is not None else None)
            out.append({**r.to_json(), "time": spent, "split": _split(r), **_failure(rec)})
        print(json.dumps(out, indent=2))
        return 0
    if not runs:
        print("no runs yet; start one with 'xl launch SCRIPT' or 'xl demo'")
        return 0
    rows = []
    # The app's order (tui/screens/runs.py): newest start first; a stable sort keeps the
    # store's order among equal starts, as the app's does.
    for r in sorted(runs, key=lambda r: r.started_at or 0, reverse=True):
        started = (
            time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started_at)) if r.started_at else ""
        )
        devices = ",".join(str(d.get("index")) for d in r.devices) or (
            "cpu" if r.world_size else ""
        )
        ranks = str(r.world_size) if r.world_size else ""
        why = _failure(record.load(r.run_dir)) if r.status == RunStatus.FAILED else {}
        cause = why.get("cause") or {}
        said = (
            f"rank {why['failure'].get('rank')}: {cause.get('kind')}: {cause.get('summary')}"
            if cause and why.get("failure")
            else ""
        )
        rows.append(
            (
                r.run_id,
                r.name or "",
                _status(r),
                ranks,
                devices,
                started,
                _duration(r),
                r.target,
                visible(said)[:80],
            )
        )
    header = ("RUN", "NAME", "STATUS", "RANKS", "GPUS", "STARTED", "TIME", "SCRIPT", "CAUSE")
    if sys.stdout.isatty():
        from rich.console import Console  # noqa: PLC0415 - Rich loads only for a terminal; a pipe gets plain columns
        from rich.table import Table  # noqa: PLC0415 - as above

        table = Table(*header, box=None, pad_edge=False)
        for row in rows:
            table.add_row(*row)
        Console().print(table)
        return 0
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    for row in (header, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0
