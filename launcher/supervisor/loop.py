"""The supervisor's loop: start torchrun, watch ranks and nodes once every tick, finish the run.

run.json (through ``xl.launcher.rundir.runrecord``, replaced atomically on every change; every key
is in docs/contracts.md, "run.json")::

    run_id, name, status (running|succeeded|failed|stopped), spec, argv, env (what xl set), cwd,
    devices [{index, uuid, name}], nnodes, node_rank, nproc_per_node, world_size, host,
    started_at, ended_at (unix s), supervisor_pid, supervisor_started_at, torchrun_pid,
    torchrun_exit_code, grace_s, stop_requested_at, attempt, versions, ranks [{rank, local_rank,
    node, node_rank, pid, gpu, gpu_uuid, state, exit_code, started_at, ended_at, attempt,
    waited_s}], failure {rank, exit_code, traceback, error, message, node, node_rank, cause} |
    null, metrics_bytes_lost, write_lost, time

Rank ``state``: starting|running|exited|failed|stopped. ``exit_code`` < 0 means killed by that
signal.

events.jsonl (``xl.launcher.rundir.events``): run_started, stop_requested and run_ended are
written here; rank_started, rank_exited and restarted by ``Lifecycle``; the one failure event by
``RootCause``; telemetry adds its diagnoses through the journal.
Also in the run dir: ranks/rank-<r>.json (what the entry point reports), logs/torchrun.log
(torchrun's own output), supervisor.log. Rank output is written by each rank's own relay and only
read here (``LogSink``): training never waits on the supervisor.

Each job is a collaborator: ``Ranks`` (who is who, how each ended), ``Lifecycle`` (what a rank's
start or end means), ``LogSink`` (rank output), ``RootCause`` (the failure), ``Stopping`` (the
stop), ``Hub`` / ``Follower`` (other nodes), ``Journal`` (run.json, events), ``SafeTelemetry``,
``Escapes``. Each turn the loop takes what its parts return and acts on it: what ``Ranks``
found changed goes to ``Lifecycle``, a stop begun (by whichever part) is saved in run.json, the
writes the disk refused (``Escapes``, ``LogSink``) go to the journal, which says each once. It
keeps its own ``Phase``. Torchrun starts first: what only the loop, the end or several nodes need is
imported after it, or there only.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xl import cgroup as xl_cgroup
from xl import envnames
from xl.launcher import runprocs
from xl.launcher.multinode.protocol import RanksMessage
from xl.launcher.rundir import layout
from xl.launcher.rundir import runrecord as run_record
from xl.launcher.rundir.events import EventKind, Notice, RunEnded
from xl.launcher.rundir.rows import RankRow
from xl.launcher.rundir.runrecord import DeviceRow, RunStatus
from xl.launcher.rundir.stopmark import stop_asked
from xl.launcher.supervisor.failure import RootCause
from xl.launcher.supervisor.journal import Journal, hold_reserve
from xl.launcher.supervisor.logsink import LogSink
from xl.launcher.supervisor.nodes import Nodes, resolve
from xl.launcher.supervisor.ranks import RankChange, Ranks, become_subreaper
from xl.launcher.supervisor.resilience import crash_line, private_umask, raise_fd_limit
from xl.launcher.supervisor.safe_telemetry import SafeTelemetry
from xl.launcher.supervisor.stopping import (
    Stop,
    Stopping,
    StopReason,
    StopSignals,
    grace_from_env,
)
from xl.launcher.supervisor.torchrun import Torchrun

# imported where they are needed: after torchrun started, or on several nodes only
if TYPE_CHECKING:
    from xl.launcher.supervisor.escapes import Escapes
    from xl.launcher.supervisor.lifecycle import Lifecycle
    from xl.launcher.view.digest import Digester, RankFigures

_TICK_S = 0.1


def _debug(what: str) -> None:
    if os.environ.get(envnames.DEBUG_TIMING):
        print(f"{time.time():.3f} {what}", file=sys.stderr, flush=True)


def _starting(count: int, devices: Sequence[DeviceRow]) -> str:
    where = "GPUs " + ",".join(str(d.index) for d in devices) if devices else "CPU"
    return f"starting {count} rank{'' if count == 1 else 's'} on {where}"


class Phase(str, Enum):
    """Where the supervisor is. A stop (a failure, `xl stop`, torchrun's death) is kept by
    ``Stopping`` (``Stopping.current``), beside this: the run goes on RUNNING until torchrun and
    its ranks are over."""

    STARTING = "starting"  # torchrun not started (after ``start``: never, a stop came first)
    RUNNING = "running"  # torchrun started; ranks come, go, fail, are stopped
    # torchrun and every rank ended: their last output, leftovers, other nodes
    DRAINING = "draining"
    ENDED = "ended"  # ``finish`` recorded the outcome


def _with_figures(row: RankRow, figures: dict[str, float] | None) -> RankRow:
    """``row`` with what the end measured of its rank (close_run), where it measured it."""
    if not figures:
        return row
    return replace(row, waited_s=figures.get("waited_s", row.waited_s),
                   samples_per_s=figures.get("samples_per_s", row.samples_per_s))


def _instrumented(ranks_env: dict[str, Any]) -> bool:
    """Whether the ranks instrument torch (--no-instrument sets XL_INSTRUMENT=0 in their
    environment, read as the rank entry's instrument.enabled reads it): only then do they announce
    their first step, so only then are the bars they print before it held back
    (launcher/telemetry/logfeed.py)."""
    return str(ranks_env.get(envnames.INSTRUMENT, "1")).strip() not in ("0", "no", "false")


class Supervisor:
    def __init__(self, run_dir: Path) -> None:
        raise_fd_limit()  # before the collector sizes its connection cap
        self.user_umask = private_umask()
        record = run_record.load(run_dir)
        if record is None:
            raise FileNotFoundError(f"no readable {layout.RUN} in {run_dir}")
        self.run_dir = run_dir
        self.layout = layout.RunLayout(run_dir)
        self.record = record
        self.run_id = record.run_id
        self.phase = Phase.STARTING
        self.node_rank = record.node_rank
        self.host = record.host or socket.gethostname()
        grace = record.grace_s or grace_from_env()
        token = os.urandom(16).hex()  # as secrets.token_hex(16), without its imports
        hub_address, self.token, link = resolve(record, token, self.host)
        self.sel = selectors.DefaultSelector()
        self.signals = StopSignals()
        self.torchrun = Torchrun()
        self.telemetry = SafeTelemetry(self.token)
        self.journal = Journal(run_dir, record, link)  # node > 0: every record goes to node 0 too
        self.ranks = Ranks(run_dir, record)
        # Every line goes to telemetry's parser (nothing while it is not running). A node > 0's
        # output stays in its run dir: node 0 asks for it (xl logs there) and takes its ranks'
        # last lines as each exits (Follower.send_tails).
        self.sink = LogSink(
            run_dir, on_line=self.telemetry.feed_log_line, wants=self.telemetry.wants_lines
        )
        self.cause = RootCause(run_dir, self.host, self.node_rank, self.journal)
        # reads the run as it goes, from torchrun's start: its end reads only the rest
        self.digester: Digester | None = None
        self.stopping = Stopping(self.run_id, grace, self.ranks, self.torchrun)
        self.saved_stop: Stop | None = None  # the stop run.json was last saved with
        self.nodes = Nodes.of(hub_address, record, self.journal, self.cause, self.stopping,
                              self.sink, self.torchrun)

    # ---------------------------------------------------------------- startup
    def start(self) -> None:
        """Start torchrun as early as it can be: on one node, before telemetry is even imported
        (its port is held for it, ``SafeTelemetry.reserve``); what the loop needs beyond that
        loads while torchrun starts (~2 s). Several nodes: telemetry first, as node 0's collector
        must listen on its fixed port before any node's ranks start."""
        _debug("supervisor start")
        become_subreaper()
        self.signals.install(self.sel)
        if self._stopped_before_start():
            return
        self.nodes.link()
        self.layout.logs.mkdir(mode=0o700, exist_ok=True)
        self.layout.ranks.mkdir(mode=0o700, exist_ok=True)
        # First, before telemetry can add any diagnosis of its own.
        starting = _starting(len(self.ranks), self.record.devices)
        self.journal.emit(Notice(EventKind.RUN_STARTED, starting))
        env = dict(os.environ)
        env.update(self.record.rank_env)
        one_node = self.nodes.alone
        _debug("before telemetry")
        env.update(self.telemetry.reserve(self.run_dir) if one_node else self._start_telemetry())
        _debug("after telemetry")
        env.update({envnames.RUN_ID: self.run_id, envnames.RUN_DIR: str(self.run_dir),
                    envnames.SUPERVISOR_PID: str(os.getpid())})
        rdzv = str(self.record.spec.get("rdzv") or "")
        env.update(self.nodes.ranks_env(rdzv, self._stop_came, self.telemetry))
        # asked while telemetry started, or node 0 was awaited; or the nodes' environments
        # differ where a run cannot work (Nodes.check_env): it ends before torchrun starts
        if self._stopped_before_start() or self.stopping.current is not None:
            return
        # The record's command as it is, with the port torchrun's store gets on one node
        # (Torchrun.start).
        cgroup = self.record.cgroup
        argv = self.torchrun.start(self.record.argv, cwd=self.record.cwd, env=env,
                                   log=self.layout.torchrun_log, umask=self.user_umask,
                                   cgroup=cgroup)
        self.record.update(argv=argv)
        pid = self.torchrun.proc.pid if self.torchrun.proc is not None else None
        if cgroup and pid and not xl_cgroup.holds(cgroup, pid) and runprocs.alive(pid):
            self.record.update(cgroup=None, cgroup_reason=f"torchrun could not enter {cgroup}")
            xl_cgroup.remove(cgroup, wait=0.0)
        self.phase = Phase.RUNNING
        runprocs.give_way()
        _debug("torchrun started")
        if one_node:
            self._start_telemetry()
        self._started()

    def _started(self) -> None:
        """What the run's record and the loop need once torchrun runs (its start overlaps this)."""
        from xl.launcher import provenance  # noqa: PLC0415 - after torchrun started: its start does not wait for this
        from xl.launcher.view.digest import Digester  # noqa: PLC0415 - after torchrun started: its start does not wait for this

        self.record.update(
            status=RunStatus.RUNNING,
            supervisor_pid=os.getpid(),
            supervisor_started_at=runprocs.create_time(os.getpid()),
            torchrun_pid=self.torchrun.proc.pid if self.torchrun.proc is not None else None,
            started_at=self.record.started_at or time.time(),
            grace_s=self.stopping.grace,
            # for xl compare (docs/compare.md)
            versions=provenance.collect(self.record.spec, bool(self.record.devices)),
        )
        self.digester = Digester(self.run_dir).follow()
        # made now, while torchrun starts (their imports overlap that start)
        _ = self.life, self.escapes
        hold_reserve(self.run_dir)
        self.save()
        self._ranks_changed()
        _debug("loop ready")

    def _stop_came(self, wait: float) -> bool:
        for key, _ in self.sel.select(wait):
            key.data()  # the signal pipe's drain
        return self.signals.requested is not None or stop_asked(self.run_dir)

    def _stopped_before_start(self) -> bool:
        """`xl stop` (its stop file or SIGTERM) came while this supervisor was starting: torchrun
        never starts, and the run ends stopped. Checked once SIGTERM is caught."""
        if not self._stop_came(0.0):
            return False
        why = self.signals.requested or "xl stop"
        said = f"stop requested ({why}) before the run started"
        self.journal.emit(Notice(EventKind.STOP_REQUESTED, said))
        self.record.update(stop_requested_at=time.time())
        self.stopping.begin(StopReason.REQUESTED)
        self.nodes.tell(self.telemetry)
        return True

    def _start_telemetry(self) -> dict[str, str]:
        instrumented = _instrumented({**os.environ, **self.record.rank_env})
        hooks = self.nodes.telemetry_hooks(self.journal)
        env = self.telemetry.start(self.run_dir, self.journal.emit, hooks,
                                   instrumented=instrumented)
        _debug("telemetry started")
        self.nodes.telemetry_failed(self.telemetry)
        return env

    # ---------------------------------------------------------------- the loop
    def run_loop(self) -> None:
        while True:
            for key, _ in self.sel.select(_TICK_S):
                key.data()  # the signal pipe's drain
            self.sink.tail()
            self._turn()
            if self.phase is Phase.RUNNING and self.torchrun.code is not None and self._all_done():
                _debug("torchrun done")
                self.phase = Phase.DRAINING
            if self.phase is Phase.DRAINING:
                self.sink.drain()
                leftovers = self.stopping.leftovers(self.signals.requested is not None)
                self.nodes.tell(self.telemetry)
                if not leftovers and not self.nodes.pending():
                    return

    def _turn(self) -> None:
        if self.ranks.reap(self.torchrun):
            self.record.update(torchrun_exit_code=self.torchrun.code)
        # lazily: a rank's end found in its record is acted on before its pid is looked at
        self.turn(look() for look in (self.ranks.scan_records, self.ranks.check_alive))

    def turn(self, found: Iterable[list[RankChange]]) -> None:
        """One turn of the loop on what the ranks' table ``found`` changed (each batch acted on,
        in its order, before the next is taken): then other nodes, a stop asked for, torchrun's
        death, the cause, the stop's next step, and the record. Fed typed changes, it runs with
        no rank process at all (tests/launcher/supervisor/test_turns.py)."""
        for changes in found:
            self.act(changes)
        if self.nodes.poll(self.telemetry):
            self._ranks_changed()
        if self.signals.requested and self.stopping.current is None:
            said = f"stop requested ({self.signals.requested})"
            self.journal.emit(Notice(EventKind.STOP_REQUESTED, said))
            self.record.update(stop_requested_at=time.time())
            self.stopping.begin(StopReason.REQUESTED)
        if (self.torchrun.code is not None and self.stopping.current is None
                and not self._all_done()):
            # torchrun is gone but ranks are not: it was killed. End them.
            self.cause.torchrun_died(self.torchrun.code)
            self.stopping.begin(StopReason.TORCHRUN_DIED)
        self.cause.decide(self.ranks, self.torchrun.code, self.sink.drain)
        # A stop begun this turn, or the failure it began at once decided: the other nodes hear
        # it, with its cause.
        self.nodes.tell(self.telemetry)
        self.stopping.advance()
        self.journal.refused(self.escapes.scan())
        self.journal.refused(self.sink.refused())  # other nodes' output, written here
        if (ended := self.stopping.end_exit_barrier(self.nodes.busy())) is not None:
            self.journal.emit(ended)
        if self.journal.dirty or self.stopping.current is not self.saved_stop:  # a stop began
            self.saved_stop = self.stopping.current
            self.save()
        if (self.telemetry.running and self.ranks.gone() and not self.nodes.pending()
                and not self.life.restart_due):
            # Every rank process is gone, so nothing can log any more: flush telemetry now,
            # while torchrun tears down (~0.5 s), not after it.
            self.telemetry.stop()

    def _all_done(self) -> bool:
        return self.ranks.all_done(self.torchrun.code, self.stopping.current is not None)

    @cached_property
    def escapes(self) -> Escapes:
        """The run's descendants that left it: looked for once torchrun runs (``_started``)."""
        from xl.launcher.supervisor.escapes import Escapes  # noqa: PLC0415 - after torchrun started: its start does not wait for this

        return Escapes(self.run_dir, self.run_id)

    @cached_property
    def life(self) -> Lifecycle:
        """What a rank's start or end means: made on first use (``_started`` makes it, as its
        import overlaps torchrun's start; nothing changes before torchrun runs)."""
        from xl.launcher.supervisor.lifecycle import Lifecycle  # noqa: PLC0415 - after torchrun started: its start does not wait for this

        return Lifecycle(self.record, self.journal, self.ranks, self.torchrun, self.cause,
                         self.stopping)

    def act(self, changes: list[RankChange]) -> None:
        """Hand what ``Ranks`` found changed to ``Lifecycle``, in its order."""
        if self.life.act(changes):
            self._ranks_changed()

    def _ranks_changed(self) -> None:
        """Every rank for telemetry; other nodes' ranks are flagged ``remote`` (not sampled
        here)."""
        from xl.launcher.telemetry.roster import RankInfo  # noqa: PLC0415 - once ranks start, as telemetry: not on the path to torchrun

        infos = [RankInfo.of(row) for row in self.ranks.rows()]
        infos += [RankInfo.of(row, remote=True) for row in self.nodes.remote_ranks()]
        self.telemetry.set_ranks([info for info in infos if info is not None])

    def save(self, waited: RankFigures | None = None) -> None:
        local = self.ranks.rows()
        self.journal.send(RanksMessage(tuple(local)))
        ranks = sorted(local + self.nodes.remote_ranks(), key=lambda r: r.rank or 0)
        if waited:  # what the end measured of each rank
            ranks = [_with_figures(row, waited.get(row.rank)) if row.rank is not None else row
                     for row in ranks]
        self.journal.save(ranks, self.cause.failure)

    # ---------------------------------------------------------------- the end
    def abort(self, exc: BaseException) -> None:
        """A bug here must not leave ranks behind nor a run that says "running" forever.

        Descriptors go first (out of them may be why it crashed): the rest needs a few."""
        self.sink.close_all()
        with contextlib.suppress(Exception):
            self.telemetry.stop()
        runprocs.kill_all(runprocs.find_run_pids(self.run_id))
        if self.torchrun.proc is not None:
            runprocs.signal_pid(self.torchrun.proc.pid, signal.SIGKILL)
        if self.cause.failure is None:
            crashed = f"supervisor error: {exc!r}"
            self.cause.failure = self.cause.local(None, None, None, None, crashed)

    def finish(self) -> RunStatus:
        # The run's end is its cgroup's: whatever is still in it (however it was started) ends.
        from xl.launcher import runcgroup  # noqa: PLC0415 - the end only: not on the path to torchrun

        runcgroup.end(self.record, self.stopping.grace)
        self.cause.fill_from_torchrun_log(self.ranks, self.torchrun.code)
        status = self.cause.conclude(self.stopping.requested, self.torchrun.code,
                                     self.stopping.barrier_ended, self.ranks, self.sink.drain)
        self.ranks.settle(stopped=status is RunStatus.STOPPED)
        self.nodes.settle(status)
        _debug("finish start")
        self.telemetry.stop()
        _debug("telemetry stopped")
        self.sink.close_logs()
        self.journal.refused(self.sink.refused())
        self.journal.at_end(self.telemetry.metrics_bytes_lost())
        self.record.end(status)
        # The time accounting goes in with the final status: whoever sees the end sees it too.
        from xl.launcher.view.digest import close_run  # noqa: PLC0415 - the end only: not on the path to torchrun

        self.save(close_run(self.run_dir, self.record, self.digester))
        self.journal.emit(RunEnded(status.value, f"run {status.value}"))
        self.phase = Phase.ENDED
        self.nodes.end(status, self.cause)
        return status


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m xl.launcher.supervisor RUN_DIR", file=sys.stderr)
        return 2
    _debug("supervisor main")
    sup = Supervisor(Path(argv[0]))
    if sup.record.final:
        return sup.record.exit_code  # stopped (xl stop) before this supervisor could start it
    try:
        sup.start()
        if sup.phase is Phase.RUNNING:
            sup.run_loop()
    except BaseException as exc:
        crash_line(f"crashed: {exc!r}; ending the run")
        with contextlib.suppress(Exception):
            sup.abort(exc)
        with contextlib.suppress(Exception):
            import traceback  # noqa: PLC0415 - a crash only

            traceback.print_exc()
    return sup.finish().exit_code
