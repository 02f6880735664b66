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
import os
import time
from pathlib import Path
from typing import Any

from xl.launcher import runcgroup, runprocs
from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.events import RunEnded, append_event
from xl.launcher.rundir.layout import RESERVE, SETTLED, RunLayout
from xl.launcher.rundir.metrics import MetricsWriter
from xl.launcher.rundir.outcome import Cause, Failure, rank_outcome
from xl.launcher.rundir.rows import as_int
from xl.launcher.rundir.runrecord import RankReport, RunRecord, RunStatus, read_rank_reports
from xl.launcher.view import digest


def all_ranks_ended(run_dir: Path, rec: RunRecord) -> bool:
    """Every rank of this node wrote its exit code."""
    expected = rec.nproc_per_node or 0
    ended = [r for r in read_rank_reports(run_dir).values() if r.ended]
    return expected > 0 and len(ended) >= expected


def merge_spool(run_dir: Path) -> int:
    """Store what gone ranks spooled into metrics.jsonl; lines stored."""
    from xl.launcher.telemetry.spool import ingest_spool  # noqa: PLC0415 - psutil and the wire format, only when a run is settled here

    writer = MetricsWriter(run_dir)
    try:
        return ingest_spool(run_dir, writer, lambda _rank, _records: None)
    finally:
        writer.close()


def _ranks(rec: RunRecord, left: dict[int, RankReport], stopped: bool) -> list[dict[str, Any]]:
    """run.json's rows, each with its outcome (``outcome.rank_outcome``): what the supervisor wrote,
    completed from what each rank reported of itself."""
    by_rank = {r.rank: r.to_json() for r in rec.ranks if r.rank is not None}
    # A rank the supervisor never listed is this node's: run.json's ``node`` is its host (a rank's
    # own report says ``node`` for torchrun's GROUP_RANK, another number).
    here = {"node": rec.host, "node_rank": rec.node_rank}
    for rank, report in left.items():
        row = by_rank.setdefault(rank, {"rank": rank, "local_rank": report.local_rank, **here})
        row["pid"] = row.get("pid") or report.pid
        row["started_at"] = row.get("started_at") or report.started_at
        if report.ended:
            row.update(exit_code=report.exit_code, ended_at=report.ended_at)
    for row in by_rank.values():
        row["state"] = rank_outcome(
            as_int(row.get("exit_code")), stopped=stopped, recorded=row.get("state")
        ).value
    return [by_rank[r] for r in sorted(by_rank)]


def _failure(
    rec: RunRecord, ranks: list[dict[str, Any]], left: dict[int, RankReport], why: str
) -> Failure:
    """The root cause, told from what the ranks left: the first rank to end without exit code 0."""
    bad = [r for r in ranks if r.get("exit_code") not in (0,)]
    first = min(bad, key=lambda r: r.get("ended_at") or float("inf")) if bad else None
    if first is None:
        return Failure(
            rank=None,
            exit_code=None,
            traceback=None,
            error=None,
            message=why,
            host=rec.host,
            node_rank=rec.node_rank,
        )
    report = left.get(int(first["rank"]))
    error = report.error if report else None
    what = error or (
        f"exit code {first['exit_code']}"
        if first.get("exit_code") is not None
        else "it ended without an exit code"
    )
    return Failure(
        rank=first["rank"],
        exit_code=first.get("exit_code"),
        traceback=report.traceback if report else None,
        error=error,
        message=f"rank {first['rank']} failed first: {what} ({why})",
        host=first.get("node") or rec.host,
        node_rank=first.get("node_rank", rec.node_rank),
        cause=_cause(rec, first, report),
    )


def _cause(rec: RunRecord, first: dict[str, Any], report: RankReport | None) -> Cause | None:
    """Why, as the supervisor would have said it, from what the rank recorded (never raises:
    the run's outcome is what settling is for)."""
    try:
        from xl.launcher.causes import Evidence, explain  # noqa: PLC0415 - a failure without its supervisor only

        argv = rec.argv
        ev = Evidence(
            rank=first["rank"],
            exit_code=first.get("exit_code"),
            error=report.error if report else None,
            traceback=report.traceback if report else None,
            python=str(argv[0]) if argv else "python",
            cwd=rec.cwd,
            script=rec.spec.get("script"),
            module=rec.spec.get("module"),
        )
        return explain(ev)
    except Exception:
        return None


def last_sign_of_life(run_dir: Path, left: dict[int, RankReport]) -> float | None:
    """When the run was last seen doing something: the newest of its files' mtimes (output,
    metrics, events, run.json, rank records, spool) and of its ranks' recorded ends."""
    latest: float | None = None
    for folder in RunLayout(run_dir).life_folders():
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name == SETTLED:
                continue
            try:
                if entry.is_file(follow_symlinks=False):
                    mtime = entry.stat(follow_symlinks=False).st_mtime
                    latest = mtime if latest is None else max(latest, mtime)
            except OSError:
                continue
    for report in left.values():
        if report.ended_at is not None:
            latest = report.ended_at if latest is None else max(latest, report.ended_at)
    return latest


def settle(
    run_dir: Path, *, stopped: bool, why: str = "its supervisor was gone", ended_now: bool = False
) -> RunRecord | None:
    """End the record of a run nobody supervises any more; None when it was not ours to end
    (already final, unreadable, or settled by someone else just now). Its ``ended_at`` is its
    last sign of life (everything of it may have been killed long before someone looked), or
    now with ``ended_now`` (the caller just ended its processes)."""
    rec = record.load(run_dir)
    if rec is None or rec.final:
        return rec
    # Before anything here writes in the run dir (the marker, merged metrics, run.json).
    ended_at = None if ended_now else last_sign_of_life(run_dir, read_rank_reports(run_dir))
    with contextlib.suppress(OSError):  # the space its supervisor held for the end: for this end
        os.unlink(RunLayout(run_dir).root / RESERVE)
    try:
        os.close(os.open(RunLayout(run_dir).settled, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return None
    except OSError:
        pass  # a read-only or full disk: settle all the same, once is best effort there
    # What the run left behind in sessions and environments of their own ends with it, and
    # whatever else is still in its cgroup, however it was started.
    runprocs.end_escaped(run_dir)
    runcgroup.end_settled(run_dir, rec, rec.grace_s if rec.grace_s is not None else 1.0)
    with contextlib.suppress(OSError):
        merge_spool(run_dir)
    left = read_rank_reports(run_dir)
    stopped = stopped or rec.stop_requested
    ranks = _ranks(rec, left, stopped)
    if stopped:
        status = RunStatus.STOPPED
    elif ranks and all(r.get("exit_code") == 0 for r in ranks) and all_ranks_ended(run_dir, rec):
        status = RunStatus.SUCCEEDED
    else:
        status = RunStatus.FAILED
    rec.update(ranks=ranks)
    if status is RunStatus.FAILED and not rec.failure:
        rec.update(failure=_failure(rec, ranks, left, why).to_json())
    rec.end(status, ended_at if ended_at is not None and ended_at <= time.time() else None)
    waited = digest.close_run(run_dir, rec)  # where its time went (docs/compare.md)
    rec.update(ranks=digest.with_waits([r.to_json() for r in rec.ranks], waited))
    message = f"run {status.value} ({why}; told from what the ranks left)"
    with contextlib.suppress(OSError):
        record.save(run_dir, rec)
        append_event(run_dir, RunEnded(status.value, message))
    return rec
