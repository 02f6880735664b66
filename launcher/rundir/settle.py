"""The record of a run whose supervisor is gone, made true from what the ranks left.

Training outlives its supervisor (SIGKILL, the OOM killer, a crash): the ranks write their own
logs and ``ranks/rank-<r>.json`` (exit code, traceback), and spool what ``xl.log`` could not send
(``spool/``). Once no process of the run is left, whoever notices first (a rank's entry point as
it ends, ``xl runs``, ``xl attach``, ``xl stop``, ``xl launch``'s watch) settles the run here:
the spooled metrics merged into metrics.jsonl, every rank's outcome from its record, the status
(stopped if a stop was asked for, succeeded if every rank exited 0, else failed and why), one
``run_ended`` event. An exclusive marker file makes that happen once, whoever races.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from xl.launcher import runprocs
from xl.launcher.rundir import digest, record
from xl.launcher.rundir.events import append_event
from xl.launcher.rundir.metrics import MetricsWriter
from xl.launcher.rundir.record import RunRecord, RunStatus

RANKS_DIR = "ranks"
_MARK = ".settled"
# Where a run leaves signs of life: its own files, and the folders its ranks and relays write in.
_LIFE_DIRS = ("", "logs", RANKS_DIR, "spool")


def rank_records(run_dir: Path) -> dict[int, dict[str, Any]]:
    """``ranks/rank-<r>.json`` by rank (unreadable ones left out)."""
    out: dict[int, dict[str, Any]] = {}
    try:
        names = os.listdir(run_dir / RANKS_DIR)
    except OSError:
        return out
    for name in names:
        if not (name.startswith("rank-") and name.endswith(".json") and name[5:-5].isdigit()):
            continue
        try:
            data = json.loads((run_dir / RANKS_DIR / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            out[int(name[5:-5])] = data
    return out


def all_ranks_ended(run_dir: Path, rec: RunRecord) -> bool:
    """Every rank of this node wrote its exit code."""
    expected = int(rec.get("nproc_per_node") or 0)
    ended = [r for r in rank_records(run_dir).values() if isinstance(r.get("exit_code"), int)]
    return expected > 0 and len(ended) >= expected


def merge_spool(run_dir: Path) -> int:
    """Store what gone ranks spooled into metrics.jsonl; lines stored."""
    from xl.launcher.telemetry.spool import ingest_spool  # noqa: PLC0415 - psutil and the wire format, only when a run is settled here

    writer = MetricsWriter(run_dir)
    try:
        return ingest_spool(run_dir, writer, lambda _rank, _records: None)
    finally:
        writer.close()


def _ranks(rec: RunRecord, left: dict[int, dict[str, Any]], stopped: bool) -> list[dict[str, Any]]:
    by_rank = {int(r["rank"]): dict(r) for r in rec.ranks if isinstance(r.get("rank"), int)}
    for rank, data in left.items():
        row = by_rank.setdefault(rank, {"rank": rank, "local_rank": data.get("local_rank"), "node": data.get("node")})
        row["pid"] = row.get("pid") or data.get("pid")
        row["started_at"] = row.get("started_at") or data.get("started_at")
        code = data.get("exit_code")
        if isinstance(code, int):
            row.update(exit_code=code, ended_at=data.get("ended_at"))
    for row in by_rank.values():
        code = row.get("exit_code")
        if code == 0:
            row["state"] = "exited"
        elif row.get("state") not in ("exited", "failed", "stopped"):
            row["state"] = "stopped" if stopped else "failed"
    return [by_rank[r] for r in sorted(by_rank)]


def _failure(ranks: list[dict[str, Any]], left: dict[int, dict[str, Any]], why: str) -> dict[str, Any]:
    bad = [r for r in ranks if r.get("exit_code") not in (0,)]
    first = min(bad, key=lambda r: r.get("ended_at") or float("inf")) if bad else None
    if first is None:
        return {"rank": None, "exit_code": None, "traceback": None, "error": None, "message": why}
    data = left.get(int(first["rank"]), {})
    error = data.get("error")
    what = error or (f"exit code {first['exit_code']}" if first.get("exit_code") is not None else "it ended without an exit code")
    return {
        "rank": first["rank"],
        "exit_code": first.get("exit_code"),
        "traceback": data.get("traceback"),
        "error": error,
        "message": f"rank {first['rank']} failed first: {what} ({why})",
    }


def last_sign_of_life(run_dir: Path, left: dict[int, dict[str, Any]]) -> float | None:
    """When the run was last seen doing something: the newest of its files' mtimes (output,
    metrics, events, run.json, rank records, spool) and of its ranks' recorded ends."""
    latest: float | None = None
    for sub in _LIFE_DIRS:
        try:
            entries = list(os.scandir(run_dir / sub))
        except OSError:
            continue
        for entry in entries:
            if entry.name == _MARK:
                continue
            try:
                if entry.is_file(follow_symlinks=False):
                    mtime = entry.stat(follow_symlinks=False).st_mtime
                    latest = mtime if latest is None else max(latest, mtime)
            except OSError:
                continue
    for data in left.values():
        ended = data.get("ended_at")
        if isinstance(ended, (int, float)) and not isinstance(ended, bool):
            latest = float(ended) if latest is None else max(latest, float(ended))
    return latest


def settle(run_dir: Path, *, stopped: bool, why: str = "its supervisor was gone", ended_now: bool = False) -> RunRecord | None:
    """End the record of a run nobody supervises any more; None when it was not ours to end
    (already final, unreadable, or settled by someone else just now). Its ``ended_at`` is its
    last sign of life (everything of it may have been killed long before someone looked), or
    now with ``ended_now`` (the caller just ended its processes)."""
    rec = record.load(run_dir)
    if rec is None or rec.final:
        return rec
    # Before anything here writes in the run dir (the marker, merged metrics, run.json).
    ended_at = None if ended_now else last_sign_of_life(run_dir, rank_records(run_dir))
    try:
        os.close(os.open(run_dir / _MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return None
    except OSError:
        pass  # a read-only or full disk: settle all the same, once is best effort there
    # What the run left behind in sessions and environments of their own ends with it.
    runprocs.end_escaped(run_dir)
    with contextlib.suppress(OSError):
        merge_spool(run_dir)
    left = rank_records(run_dir)
    stopped = stopped or rec.get("stop_requested_at") is not None
    ranks = _ranks(rec, left, stopped)
    if stopped:
        status = RunStatus.STOPPED
    elif ranks and all(r.get("exit_code") == 0 for r in ranks) and all_ranks_ended(run_dir, rec):
        status = RunStatus.SUCCEEDED
    else:
        status = RunStatus.FAILED
    rec.update(ranks=ranks)
    if status is RunStatus.FAILED and not rec.failure:
        rec.update(failure=_failure(ranks, left, why))
    rec.end(status, ended_at if ended_at is not None and ended_at <= time.time() else None)
    waited = digest.close_run(run_dir, rec)  # where its time went (docs/compare.md)
    rec.update(ranks=digest.with_waits(rec.ranks, waited))
    message = f"run {status.value} ({why}; told from what the ranks left)"
    with contextlib.suppress(OSError):
        record.save(run_dir, rec)
        append_event(run_dir, {"kind": "run_ended", "status": status.value, "message": message})
    return rec
