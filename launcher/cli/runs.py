"""``xl runs [RUN] [--json]``: every run under XL_HOME, newest first as in the app's Runs screen
(``--json``: the store's order, oldest first, as scripts have read it); with RUN, that run:
its ranks' last figures, its time and its cause."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any

from xl.errors import ArgumentParser, UsageError
from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.outcome import Cause
from xl.launcher.rundir.runrecord import RunRecord, RunStatus, read_object
from xl.launcher.rundir.store import (
    GONE,
    NOT_YOURS,
    STARTING,
    UNREADABLE,
    RunInfo,
    list_runs,
    resolve_run,
)
from xl.launcher.view import timing
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
        rank: {**split, "clock": timing.clock(entry)}
        for rank, entry in ranks.items()
        if (split := timing.per_step(entry)) is not None
    }


def _failure(rec: RunRecord | None) -> dict[str, Any]:
    """``failure`` (run.json's, or null) and its ``cause`` (or null), for a run's listing."""
    failure = rec.failure_json if rec is not None else None
    cause = Cause.from_json(failure.get("cause")) if failure else None
    return {"failure": failure, "cause": cause.to_json() if cause is not None else None}


HEADER = ("RUN", "NAME", "STATUS", "RANKS", "GPUS", "STARTED", "TIME", "SCRIPT", "CAUSE")
# What gives way when a line is too wide, in this order: first each of these cells is cut (with
# "…") down to its width here, then whole columns go (the run id and its status never: the id is
# what every other command takes).
_SHRINK = ((8, 12), (7, 10), (1, 6), (2, 9))
_DROP = (8, 7, 4, 3, 5, 1, 6)


def _cut(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[: max(0, width - 1)] + "\u2026"


def fit(rows: list[tuple[str, ...]], width: int | None) -> list[str]:
    """The table's lines (header first), two spaces between columns, within ``width`` columns
    where cutting cells and leaving out columns can make it so; else (or with no ``width``)
    whole lines. A run id is never cut."""
    natural = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADER)]
    keep, widths = list(range(len(HEADER))), list(natural)
    if width is not None:
        least = list(natural)
        for col, floor in _SHRINK:
            least[col] = min(natural[col], max(floor, len(HEADER[col])))
        # As few columns left out as the narrowest cells allow; then each cell cut only as far
        # as the line needs, in _SHRINK's order.
        drops = list(_DROP)
        while drops and _span(least, keep) > width:
            keep.remove(drops.pop(0))
        if _span(least, keep) <= width:
            for col, _ in _SHRINK:
                over = _span(widths, keep) - width
                if over > 0 and col in keep:
                    widths[col] = max(least[col], widths[col] - over)
        else:
            keep = list(range(len(HEADER)))
    return [
        "  ".join(_cut(row[i], widths[i]).ljust(widths[i]) for i in keep).rstrip()
        for row in (HEADER, *rows)
    ]


def _span(widths: list[int], keep: list[int]) -> int:
    return sum(widths[i] for i in keep) + 2 * (len(keep) - 1)


def _width() -> int | None:
    """The columns to fit: the terminal's; in a pipe, ``COLUMNS`` where set, else none (whole
    lines, for the scripts that read them)."""
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return None
    return columns if columns > 0 else None


def _row(r: RunInfo) -> tuple[str, ...]:
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started_at)) if r.started_at else ""
    devices = ",".join(str(d.get("index")) for d in r.devices) or ("cpu" if r.world_size else "")
    ranks = str(r.world_size) if r.world_size else ""
    why = _failure(record.load(r.run_dir)) if r.status == RunStatus.FAILED else {}
    cause = why.get("cause") or {}
    said = (
        f"rank {why['failure'].get('rank')}: {cause.get('kind')}: {cause.get('summary')}"
        if cause and why.get("failure")
        else ""
    )
    return (
        r.run_id,
        visible(r.name or ""),
        _status(r),
        ranks,
        devices,
        started,
        _duration(r),
        visible(r.target),
        visible(said)[:80],
    )


def _json(r: RunInfo) -> dict[str, Any]:
    # ``time``: where a finished run's time went (docs/compare.md), null while it runs;
    # ``split``: where each rank's steps' time went, per step;
    # ``failure``: its root cause with ``cause`` (docs/contracts.md), null unless it failed.
    # ``stragglers``: each rank named the straggler, by its last such event (its GPU's reason).
    rec = record.load(r.run_dir)
    spent = timing.valid(rec.time if rec is not None else None)
    return {
        **r.to_json(),
        "time": spent,
        "split": _split(r),
        **_failure(rec),
        "stragglers": _stragglers(r),
    }


def _stragglers(r: RunInfo) -> list[dict[str, Any]]:
    from xl.launcher.rundir.events import parse_lines  # noqa: PLC0415 - --json only
    from xl.launcher.rundir.tail import Tail  # noqa: PLC0415 - as above
    from xl.launcher.telemetry.straggler import said  # noqa: PLC0415 - as above

    return said(parse_lines(Tail(RunLayout(r.run_dir).events).read()))


def _one(token: str, as_json: bool) -> int:
    """``xl runs RUN``: the run's line of the listing, then its end table (each rank's state and
    the run's figures), where its time went and its cause; ``--json``: its object of ``xl runs
    --json`` with run.json's ``ranks``."""
    run_dir = resolve_run(token, "runs")
    info = next((r for r in list_runs() if r.run_dir == run_dir), None)
    if info is None:  # removed since it was resolved
        raise UsageError(f"no run matches {token!r} (see 'xl runs')")
    if as_json:
        rec = record.load(run_dir)
        ranks = [row.to_json() for row in rec.ranks] if rec is not None else []
        print(json.dumps({**_json(info), "ranks": ranks}, indent=2))
        return 0
    print("\n".join(fit([_row(info)], _width())))
    if info.status in (UNREADABLE, NOT_YOURS):
        return 0
    from xl.launcher.cli.consolerun import ConsoleRun  # noqa: PLC0415 - one run's table only
    from xl.launcher.cli.endtable import end_text  # noqa: PLC0415 - as above

    run = ConsoleRun(run_dir, read_lines=False)
    run.poll()
    run.take_last_lines()
    print(end_text(run, width=max(100, _width() or 120)), end="")
    return 0


def main(argv: Sequence[str]) -> int:
    p = ArgumentParser(
        prog="xl runs",
        description=(
            "List runs, newest first (as the app's Runs screen); --json lists them oldest first. "
            "With RUN: that run, its ranks' last figures, its time and its cause."
        ),
    )
    p.add_argument(
        "run",
        nargs="?",
        metavar="RUN",
        help="one run: its id, a unique start of one, or 'last'",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON array of runs, oldest first (the order runs were made); with RUN: its own",
    )
    ns = p.parse_args(list(argv))
    if ns.run is not None:
        return _one(ns.run, ns.json)
    runs = list_runs()
    if ns.json:
        print(json.dumps([_json(r) for r in runs], indent=2))
        return 0
    if not runs:
        print("no runs yet; start one with 'xl launch SCRIPT' or 'xl demo'")
        return 0
    # The app's order (tui/screens/runs.py): newest start first; a stable sort keeps the
    # store's order among equal starts, as the app's does.
    ordered = sorted(runs, key=lambda r: r.started_at or 0, reverse=True)
    print("\n".join(fit([_row(r) for r in ordered], _width())))
    return 0
