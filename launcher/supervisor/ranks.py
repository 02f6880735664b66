"""This node's ranks: which process is which rank, how each one ended, and reaping.

A rank tells the supervisor who it is in its record ``ranks/rank-<r>.json`` (written by the entry
point: pid, local_rank, started_at, and at the end exit_code, traceback, error). A pid is only
taken from a process that carries this run's XL_RUN_ID: a file cannot make the supervisor signal
another process. A rank killed by a signal writes no end: it is found gone by
its pid, or reaped here when torchrun died first and it was orphaned to this subreaper.

Under ``--max-restarts N`` torchrun restarts every rank of the node when one fails: a rank that
ended and then reports another pid is its next attempt (TORCHELASTIC_RESTART_COUNT in the new
process's environment says which); its row starts over and keeps the attempt number.

``Ranks`` only keeps the table: ``scan_records`` and ``check_alive`` return what changed
(``RankChange``: a rank started, restarted, ended, or the table was renumbered), and what a start
or an end means for the run (events, the root cause, the stop) is the supervisor's loop's, which
acts on them in their order. A rank whose end is not acted on yet is left as it is until then.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from xl.launcher import runprocs
from xl.launcher.rundir import rows as run_rows
from xl.launcher.rundir.layout import RunLayout, record_rank
from xl.launcher.rundir.outcome import RankPhase, rank_outcome
from xl.launcher.rundir.runrecord import RunRecord
from xl.procfs import read_environ

# `xl launch` imports this module (for the stop grace): torchrun's is the supervisor's only
if TYPE_CHECKING:
    from xl.launcher.supervisor.torchrun import Torchrun

_PR_SET_CHILD_SUBREAPER = 36
# How long after its mtime a rank record may still change without its mtime changing: file times
# come from the kernel's coarse clock (a tick of up to 10 ms), which may also lag time.time().
_RACY_S = 0.05
_PR_SET_NAME = 15
# The keys a row this supervisor makes writes, in their order, null or not (docs/contracts.md,
# "run.json"); the figures the end measures (waited_s, samples_per_s) follow once it has them.
_WRITTEN = MappingProxyType(dict.fromkeys((
    "rank", "local_rank", "node", "node_rank", "pid", "gpu", "gpu_uuid", "state", "exit_code",
    "started_at", "ended_at", "attempt",
)))


def signal_name(code: int) -> str:
    """The signal a negative exit code stands for (``SIGKILL`` for -9)."""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def describe_exit(rank: int, code: int | None) -> str:
    if code is None:
        return f"rank {rank} ended (exit code unknown)"
    if code < 0:
        return f"rank {rank} was killed by {signal_name(code)}"
    return f"rank {rank} exited with code {code}"


def describe_end(st: RankRow) -> str:
    """A rank's end as the rank table shows it: a rank xl stopped (it sent it a signal) reads
    "stopped (-15)"; any other rank its exit ("was killed by SIGKILL", "exited with code 1"),
    never "stopped": xl did not stop it, whatever its outcome in the table."""
    if st.state is RankPhase.STOPPED and st.signalled is not None:
        code = (
            st.exit_code if st.exit_code is not None else (-st.signalled if st.signalled else None)
        )
        return f"rank {st.rank} stopped" + (f" ({code})" if code is not None else "")
    return describe_exit(st.rank, st.exit_code)


@dataclass
class RankRow:
    rank: int
    local_rank: int
    host: str  # run.json's key is node (docs/contracts.md)
    gpu: int | None
    gpu_uuid: str | None
    node_rank: int = 0
    pid: int | None = None
    state: RankPhase = RankPhase.STARTING
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    traceback: str | None = None
    error: str | None = None
    record_mtime: float = 0.0
    alive_at: float | None = None  # the last time it was seen running
    vanished: bool = False  # ended without an exit record (killed)
    signalled: int | None = None  # the last signal xl sent it
    attempt: int = 0  # torchrun's TORCHELASTIC_RESTART_COUNT for the process now in this row
    after_script: bool = False  # its script returned, then its process died (torchrun's summary)

    def row(self) -> run_rows.RankRow:
        """Its row of run.json (and of the ``ranks`` message to node 0), as it stands now."""
        return run_rows.RankRow(
            rank=self.rank,
            local_rank=self.local_rank,
            host=self.host,
            node_rank=self.node_rank,
            pid=self.pid,
            gpu=self.gpu,
            gpu_uuid=self.gpu_uuid,
            state=self.state.value,
            exit_code=self.exit_code,
            started_at=self.started_at,
            ended_at=self.ended_at,
            attempt=self.attempt,
            source=_WRITTEN,
        )

    @property
    def done(self) -> bool:
        return self.state.done

    @property
    def gone(self) -> bool:
        """Ended and no process of it left (a rank may report its end and hang in teardown)."""
        return self.done and (self.pid is None or not runprocs.alive(self.pid))

    def end(self, code: int | None, when: float | None, stopped: bool) -> None:
        """Its outcome, by the one rule (``rundir.outcome.rank_outcome``): exited on 0, else
        stopped when xl's stop explains it, else failed."""
        self.exit_code = code
        self.ended_at = when or time.time()
        self.state = rank_outcome(code, stopped=stopped)

    def restart(self, pid: int, attempt: int) -> None:
        """torchrun started this rank again (``attempt``): the row is the new process's."""
        self.pid, self.attempt, self.state = pid, attempt, RankPhase.STARTING
        self.exit_code = self.ended_at = self.started_at = self.alive_at = None
        self.traceback = self.error = None
        self.vanished, self.signalled, self.after_script = False, None, False

    def signal(self, sig: int) -> None:
        # A rank that reported its exit may still hang in teardown (e.g. a stuck NCCL
        # destructor): it is signalled too; only its recorded outcome stays as it was.
        if self.pid is None or not runprocs.alive(self.pid):
            return
        if not self.done:
            self.signalled = int(sig)
        runprocs.signal_rank(self.pid, sig)


def become_subreaper() -> None:
    """Orphaned ranks (torchrun killed) become this process's children; and name it in ps."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        # Forked from `xl launch`, it would show up as another `xl launch` in top/ps -e.
        libc.prctl(_PR_SET_NAME, b"xl-supervisor", 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: orphans go to init; they are still found by XL_RUN_ID


class Change(str, Enum):
    """What happened to a rank, for the loop to act on."""

    STARTED = "started"  # its process reported itself (its pid is known)
    RESTARTED = "restarted"  # torchrun started its next attempt (STARTED follows)
    ENDED = "ended"  # it ended: ``code`` (None: unknown), ``when`` (None: now)
    RENUMBERED = "renumbered"  # torch gave it another number, or the run's world_size changed


@dataclass(frozen=True)
class RankChange:
    change: Change
    st: RankRow | None  # None only for a world_size RENUMBERED
    code: int | None = None
    when: float | None = None


class Ranks:
    """The table of this node's ranks, kept from their records, pids and exit statuses."""

    def __init__(self, run_dir: Path, record: RunRecord) -> None:
        self.run_dir = run_dir
        self.record = record
        self._changes: list[RankChange] = []  # found since the last time they were handed out
        self.by_rank: dict[int, RankRow] = {}
        self.by_pid: dict[int, int] = {}
        self.reparented: dict[int, int] = {}  # pid -> exit code of a rank this process reaped
        self.multi_node = record.nnodes >= 2
        self.max_restarts = record.max_restarts
        nproc = record.nproc_per_node
        if nproc is None:
            raise ValueError(f"{record.run_id}: run.json has no nproc_per_node")
        node_rank = record.node_rank
        devices = record.devices
        host = record.host or socket.gethostname()
        for local in range(nproc):
            rank = node_rank * nproc + local
            dev = devices[local] if local < len(devices) else None
            self.by_rank[rank] = RankRow(
                rank=rank,
                local_rank=local,
                host=host,
                gpu=dev.index if dev else None,
                gpu_uuid=dev.uuid if dev else None,
                node_rank=node_rank,
            )

    def __iter__(self) -> Iterator[RankRow]:
        return iter(self.by_rank.values())

    def __len__(self) -> int:
        return len(self.by_rank)

    def get(self, rank: int) -> RankRow | None:
        return self.by_rank.get(rank)

    def rows(self) -> list[run_rows.RankRow]:
        """The rows of run.json. Several nodes: a rank that has not reported yet is left out, as
        its number is only a guess (torch numbers nodes in the order they join): a viewer that
        saw it would keep a row for a rank this node never had."""
        ranks = sorted(self.by_rank.values(), key=lambda r: r.rank)
        return [r.row() for r in ranks if not (self.multi_node and r.pid is None and not r.done)]

    def known_pids(self) -> set[int]:
        return {st.pid for st in self if st.pid}

    def gone(self) -> bool:
        return all(st.gone for st in self)

    # ---------------------------------------------------------------- who is who
    def hello(self, rank: int, pid: int) -> list[RankChange]:
        """A rank's first word, from a source already trusted (its checked record, a test)."""
        self.slot(rank, pid)
        self.learn_pid(rank, pid)
        return self._take()

    def _take(self) -> list[RankChange]:
        changes, self._changes = self._changes, []
        return changes

    def _ending(self, st: RankRow) -> bool:
        """Its end was found and is not acted on yet."""
        return any(c.change is Change.ENDED and c.st is st for c in self._changes)

    def slot(self, rank: int, pid: int, local_rank: int | None = None) -> RankRow | None:
        """The RankRow of global ``rank``, from the first word of that rank.

        Ranks start as guesses, node_rank * nproc + local_rank, often wrong: under c10d torch
        numbers nodes in the order they join (GROUP_RANK, not xl's node_rank) and ranks node after
        node, so arrival order and nodes with different GPU counts shift them. A rank's LOCAL_RANK
        (its record, else its environment) names its slot, which then takes the rank torch gave
        it; WORLD_SIZE fixes world_size."""
        st = self.by_rank.get(rank)
        if not self.multi_node or (st is not None and st.pid is not None):
            return st
        env = read_environ(pid, ("LOCAL_RANK", "WORLD_SIZE")) if pid > 0 else {}
        if local_rank is None and env.get("LOCAL_RANK", "").isdigit():
            local_rank = int(env["LOCAL_RANK"])
        if env.get("WORLD_SIZE", "").isdigit() and int(env["WORLD_SIZE"]) != self.record.world_size:
            self.record.update(world_size=int(env["WORLD_SIZE"]))
            self._changes.append(RankChange(Change.RENUMBERED, None))
        mine = next((s for s in self if s.local_rank == local_rank), None)
        if mine is None:
            return st  # LOCAL_RANK unknown: keep the guess
        if mine.rank == rank:
            return mine
        if mine.pid is not None:
            return None  # that slot already belongs to another rank
        # Swap keys with whatever guess held ``rank``; that one is fixed when its own rank reports.
        other = self.by_rank.pop(rank, None)
        del self.by_rank[mine.rank]
        if other is not None:
            other.rank = mine.rank
            self.by_rank[other.rank] = other
        mine.rank = rank
        self.by_rank[rank] = mine
        self._changes.append(RankChange(Change.RENUMBERED, mine))
        return mine

    def learn_pid(self, rank: int, pid: int) -> None:
        st = self.by_rank.get(rank)
        if st is None or pid <= 0 or st.pid == pid:
            return
        if self.max_restarts and (st.pid is None or (st.done and st.attempt < self.max_restarts)):
            # An ended rank with a new process: torchrun restarted it. Its environment names
            # the attempt (a process already gone is the next one); so does a rank's first
            # process when its earlier one died before it could report.
            count = read_environ(pid, ("TORCHELASTIC_RESTART_COUNT",)).get(
                "TORCHELASTIC_RESTART_COUNT", ""
            )
            attempt = int(count) if count.isdigit() else st.attempt + (st.pid is not None)
            if st.pid is not None or attempt > st.attempt:
                st.restart(pid, attempt)
                self._changes.append(RankChange(Change.RESTARTED, st))
        st.pid = pid
        self.by_pid[pid] = rank
        if st.state is RankPhase.STARTING:
            st.state = RankPhase.RUNNING
            st.started_at = st.started_at or time.time()
            self._changes.append(RankChange(Change.STARTED, st))

    # ---------------------------------------------------------------- how they end
    def scan_records(self) -> list[RankChange]:
        """Read the rank records that changed since the last look (every tick: plain strings, not
        paths, for the names and the stats); what changed, in its order."""
        self._scan()
        return self._take()

    def _scan(self, reread: RankRow | None = None) -> None:
        """``reread``: a rank found gone, whose record is read whatever its mtime says (its
        last write may share the mtime of the one read before: see _RACY_S)."""
        folder = str(RunLayout(self.run_dir).ranks)
        try:
            names = os.listdir(folder)
        except OSError:
            return
        for name in names:
            rank = record_rank(name)
            if rank is None:
                continue
            path = os.path.join(folder, name)
            try:
                mtime = os.stat(path).st_mtime
            except OSError:
                continue
            st = self.by_rank.get(rank)
            if st is not None and st is not reread and (
                mtime == st.record_mtime or self._ending(st)
            ):
                continue  # unchanged, or read again once its end was acted on
            try:
                with open(path, encoding="utf-8") as fh:
                    rec = json.load(fh)
            except (OSError, ValueError):
                continue
            local = rec.get("local_rank")
            st = self.slot(
                rank, int(rec.get("pid") or 0), local if isinstance(local, int) else None
            )
            if st is None:
                continue
            # A file's mtime is the kernel's coarse clock: a write in the same tick as the one
            # read now keeps it, so a record this fresh is read again on the next look.
            st.record_mtime = mtime if time.time() - mtime > _RACY_S else 0.0
            pid = int(rec.get("pid") or 0)
            if pid and (
                runprocs.is_run_process(pid, self.record.run_id) or not runprocs.alive(pid)
            ):
                self.learn_pid(rank, pid)
            st.started_at = rec.get("started_at") or st.started_at
            if "exit_code" in rec and not st.done:
                st.traceback = rec.get("traceback")
                st.error = rec.get("error")
                self._changes.append(
                    RankChange(Change.ENDED, st, int(rec["exit_code"]), rec.get("ended_at"))
                )

    def check_alive(self) -> list[RankChange]:
        """Ranks gone without an exit record: killed by a signal (or os._exit); what changed
        (a rank's record read meanwhile included), in its order."""
        for st in self:
            if st.pid is None or st.done or self._ending(st):
                continue
            if st.pid in self.reparented:
                self._changes.append(RankChange(Change.ENDED, st, self.reparented.pop(st.pid)))
                continue
            if runprocs.alive(st.pid):
                st.alive_at = time.time()
                continue
            self._scan(reread=st)
            if not st.done and not self._ending(st):
                st.vanished = True
                self._changes.append(RankChange(Change.ENDED, st, self._code_of_gone(st)))
        return self._take()

    def _code_of_gone(self, st: RankRow) -> int | None:
        """How a rank gone without a record ended, while that can still be read: its zombie
        (torchrun has not reaped it yet), else the signal xl sent it; None: torchrun's log will
        say (``RootCause``)."""
        from xl.launcher.causes.host import zombie_exit  # noqa: PLC0415 - a rank gone without a word only

        code = zombie_exit(st.pid) if st.pid is not None else None
        if code is None and st.signalled is not None:
            code = -st.signalled
        return code

    def reap(self, torchrun: Torchrun) -> bool:
        """Collect ended children; True when torchrun was one of them.

        waitpid(-1): torchrun, and ranks orphaned to this subreaper. Nothing else in the
        supervisor (telemetry included) may start child processes: they would be reaped here."""
        torchrun_ended = False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return torchrun_ended
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                return torchrun_ended
            if pid == 0:
                return torchrun_ended
            code = os.waitstatus_to_exitcode(status)
            if torchrun.proc is not None and pid == torchrun.proc.pid:
                torchrun.code = torchrun.proc.returncode = code
                torchrun_ended = True
            elif pid in self.by_pid:
                self.reparented[pid] = code

    def all_done(self, torchrun_code: int | None, stopping: bool) -> bool:
        """Every rank ended; one torchrun never started (it is gone) counts as failed or stopped."""
        for st in self:
            if st.done:
                continue
            if st.pid is None:
                # Never started (torchrun failed before spawning it): nothing to wait for.
                if torchrun_code is not None:
                    st.state = rank_outcome(None, stopped=stopping)
                    continue
                return False
            if runprocs.alive(st.pid):
                return False
        return True

    def settle(self, stopped: bool) -> None:
        """At the end: a rank still without an outcome was stopped, or failed with the run (the
        one rule, ``rundir.outcome.rank_outcome``: its exit code, if torchrun's summary gave one,
        cannot be 0 there)."""
        for st in self:
            if not st.done:
                st.state = rank_outcome(st.exit_code, stopped=stopped)

