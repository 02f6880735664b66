"""The supervisor's loop: start torchrun, watch ranks and nodes once every tick, finish the run.

run.json (through ``xl.launcher.rundir.record``, replaced atomically on every change)::

    run_id, name, status (running|succeeded|failed|stopped), spec, argv, env (what xl set), cwd,
    devices [{index, uuid, name}], nnodes, node_rank, nproc_per_node, world_size, host,
    started_at, ended_at (unix s), supervisor_pid, torchrun_pid, torchrun_exit_code, grace_s,
    stop_requested_at, attempt, ranks [{rank, local_rank, node, node_rank, pid, gpu, gpu_uuid,
    state, exit_code, started_at, ended_at, attempt}], failure {rank, exit_code, traceback, error,
    message, node, node_rank} | null

Rank ``state``: starting|running|exited|failed|stopped. ``exit_code`` < 0 means killed by that signal.

events.jsonl kinds written here: run_started, rank_started (pid), rank_exited (exit_code), failure
(exit_code), restarted (attempt), stop_requested, run_ended (status); telemetry adds its diagnoses through ``emit``.
Also in the run dir: ranks/rank-<r>.json (what the entry point reports), logs/torchrun.log
(torchrun's own output), supervisor.log. Rank output is written by each rank's own relay and only
read here (``LogSink``): training never waits on the supervisor.

Each job is a collaborator: ``Ranks`` (who is who, how each ended), ``LogSink`` (rank output),
``RootCause`` (the failure), ``Stopping`` (the stop), ``Hub`` / ``Follower`` (other nodes),
``Journal`` (run.json, events), ``TelemetryPort``. The supervisor wires them and says what a
rank's start or end means for the run.

``--max-restarts N``: torchrun restarts every rank of the node after a failure, N times at most.
While it has restarts left a failed rank is no cause and starts no stop; its next process is
attempt k (``restarted`` event, ``attempt`` in run.json). The run fails when torchrun gives up.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from xl.launcher import provenance, runprocs
from xl.launcher.multinode import nodelink
from xl.launcher.multinode.join import format_address
from xl.launcher.rundir import digest
from xl.launcher.rundir import record as run_record
from xl.launcher.rundir.record import RunStatus
from xl.launcher.rundir.stopmark import stop_asked
from xl.launcher.supervisor.failure import TORCHRUN_LOG, RootCause
from xl.launcher.supervisor.follower import Follower
from xl.launcher.supervisor.guard import crash_line, private_umask, raise_fd_limit
from xl.launcher.supervisor.hub import Hub, resolve_hub
from xl.launcher.supervisor.journal import Journal, say
from xl.launcher.supervisor.logsink import LOGS_DIR, LogSink
from xl.launcher.supervisor.nodewatch import rank_frames
from xl.launcher.supervisor.ranks import (
    RECORDS_DIR,
    RankPhase,
    Ranks,
    RankState,
    Torchrun,
    become_subreaper,
    describe_end,
)
from xl.launcher.supervisor.stopping import Stopping, StopReason, StopSignals, grace_from_env
from xl.launcher.supervisor.telemetry_port import TelemetryPort, forward_records

_TICK_S = 0.1
_ESCAPED_SCAN_S = 2.0  # how often the processes that left the run's environment are recorded
_LINK_CLOSE_S = 3.0


def _debug(what: str) -> None:
    if os.environ.get("XL_DEBUG_TIMING"):
        print(f"{time.time():.3f} {what}", file=sys.stderr, flush=True)


class Supervisor:
    def __init__(self, run_dir: Path) -> None:
        raise_fd_limit()  # before the collector sizes its connection cap
        self.user_umask = private_umask()
        record = run_record.load(run_dir)
        if record is None:
            raise FileNotFoundError(f"no readable {run_record.RUN_FILE} in {run_dir}")
        self.run_dir = run_dir
        self.record = record
        self.run_id = record.run_id
        self.node_rank = int(record.get("node_rank") or 0)
        self.host = str(record.get("host") or socket.gethostname())
        grace = float(record.get("grace_s") or grace_from_env())
        self.hub_address, self.token = resolve_hub(record, secrets.token_hex(16))
        self.sel = selectors.DefaultSelector()
        self.signals = StopSignals()
        self.torchrun = Torchrun()
        self.port = TelemetryPort()
        self.journal = Journal(run_dir, record)
        self.ranks = Ranks(run_dir, record, self._rank_started, self._rank_ended, self.journal.changed)
        self.ranks.on_restarted = self._rank_restarted
        self.attempt = 0  # torchrun's restarts so far (the highest attempt any rank reached)
        self.escaped: list[tuple[int, float]] = []  # recorded in escaped.json (xl.launcher.runprocs)
        self.escaped_scan_at = 0.0
        self.escape_seen: list[tuple[int, float]] = []  # the last scan's finds, recorded once seen twice
        self.restart_reason: str | None = None  # the failure that will make torchrun restart
        self.sink = LogSink(run_dir, self.journal.write_failed)
        self.sink.forward = self.journal.send_log
        self.cause = RootCause(run_dir, self.host, self.node_rank, self.journal)
        self.digester = digest.Digester(run_dir)  # read as the run goes: its end reads only the rest
        self.stopping = Stopping(self.run_id, grace, self.ranks, self.torchrun, self.journal.changed)
        self.follower: Follower | None = None  # node > 0: made in start, with its link
        self.hub: Hub | None = None  # node 0 of several
        if self.hub_address is not None and self.node_rank == 0:
            self.hub = Hub(
                self.hub_address,
                int(record.get("nnodes") or 1),
                self.journal,
                self.cause,
                self.stopping,
                self.sink,
                on_ranks=self._ranks_changed,
                stop_nodes=lambda stop: self.port.call("stop_nodes", stop),
                rank_frames=lambda: rank_frames(self.port.telemetry),
            )
            self.stopping.tell_nodes = self.hub.tell_nodes

    # ---------------------------------------------------------------- startup
    def start(self) -> None:
        _debug("supervisor start")
        become_subreaper()
        self.signals.install(self.sel)
        if self._stopped_before_start():
            return
        if self.hub_address is not None and self.node_rank > 0:
            link = nodelink.NodeLink(*self.hub_address, self.token, self.node_rank, self.host)
            link.start()
            self.journal.link = link
            self.follower = Follower(self.hub_address, link, self.journal, self.cause, self.stopping, self.torchrun)
        (self.run_dir / LOGS_DIR).mkdir(mode=0o700, exist_ok=True)
        (self.run_dir / RECORDS_DIR).mkdir(mode=0o700, exist_ok=True)
        devices = self.record.get("devices") or []
        where = "GPUs " + ",".join(str(d["index"]) for d in devices) if devices else "CPU"
        # First, before telemetry can add any diagnosis of its own.
        count = len(self.ranks)
        self.journal.emit({"kind": "run_started", "message": f"starting {count} rank{'' if count == 1 else 's'} on {where}"})
        env = dict(os.environ)
        env.update(self.record.get("env") or {})
        _debug("before telemetry")
        env.update(self._start_telemetry())
        if self.follower is not None:
            # This node's ranks send their xl.log frames straight to node 0's collector.
            env["XL_COLLECTOR"] = format_address(*self.follower.hub)
        _debug("after telemetry")
        env.update({"XL_RUN_ID": self.run_id, "XL_RUN_DIR": str(self.run_dir), "XL_SUPERVISOR_PID": str(os.getpid())})
        if self.follower is not None:
            self.follower.wait_for_node_0(str(self.record.spec.get("rdzv") or ""), self._stop_came)
        if self._stopped_before_start():  # asked while telemetry started, or node 0 was awaited
            return
        with open(self.run_dir / LOGS_DIR / TORCHRUN_LOG, "ab") as log:
            self.torchrun.proc = subprocess.Popen(
                self.record.get("argv"),
                cwd=self.record.get("cwd") or None,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                close_fds=True,
                umask=self.user_umask,  # the run dir is private; the training's own files are not
            )
        self.record.update(
            status=RunStatus.RUNNING,
            supervisor_pid=os.getpid(),
            supervisor_started_at=runprocs.create_time(os.getpid()),
            torchrun_pid=self.torchrun.proc.pid,
            started_at=self.record.get("started_at") or time.time(),
            grace_s=self.stopping.grace,
            versions=provenance.collect(self.record.spec, bool(self.record.devices)),  # for xl compare (docs/compare.md)
        )
        self.digester.follow()
        self.save()
        self._ranks_changed()

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
        self.journal.emit({"kind": "stop_requested", "message": f"stop requested ({why}) before the run started"})
        self.record.update(stop_requested_at=time.time())
        self.stopping.begin(StopReason.REQUESTED)
        return True

    def _start_telemetry(self) -> dict[str, str]:
        where: dict[str, Any] = {}
        if self.hub is not None:
            where = self.hub.collector_hooks()
        elif self.follower is not None:
            where = {"forward": forward_records(self.journal)}
        env = self.port.start(self.run_dir, self.token, self.journal.emit, **where)
        if self.port.telemetry is not None:
            self.sink.on_line = self.port.feed_log_line
        elif self.hub is not None:
            # Every node sends to node 0's collector: without it (another program may hold its port,
            # waiting for the token) the run must not start at all (issue 25, docs/security.md).
            message = (f"node 0's collector cannot listen on {format_address(*self.hub.address)} ({self.port.error}): "
                       "another program may hold that port; set XL_COLLECTOR_PORT to a free port, the same on every node")
            self.journal.emit({"kind": "failure", "rank": None, "message": message})
            self.cause.set(self.cause.local(None, None, None, None, message), time.time())
            raise RuntimeError(message)
        return env

    # ---------------------------------------------------------------- the loop
    def run_loop(self) -> None:
        while True:
            for key, _ in self.sel.select(_TICK_S):
                key.data()  # the signal pipe's drain
            self.sink.tail()
            self._turn()
            if self.torchrun.code is not None and self._all_done():
                _debug("torchrun done")
                self.sink.drain()
                if not self.stopping.leftovers(self.signals.requested is not None) and not self._nodes_pending():
                    return

    def _turn(self) -> None:
        if self.ranks.reap(self.torchrun):
            self.record.update(torchrun_exit_code=self.torchrun.code)
        self.ranks.scan_records()
        self.ranks.check_alive()
        if self.hub is not None:
            self.hub.poll()
            self.hub.check_nodes()
        elif self.follower is not None:
            self.follower.poll()
        if self.signals.requested and self.stopping.state is None:
            self.journal.emit({"kind": "stop_requested", "message": f"stop requested ({self.signals.requested})"})
            self.record.update(stop_requested_at=time.time())
            self.stopping.begin(StopReason.REQUESTED)
        if self.torchrun.code is not None and self.stopping.state is None and not self._all_done():
            # torchrun is gone but ranks are not: it was killed. End them.
            failure = self.cause.torchrun_died(self.torchrun.code)
            self.journal.emit({"kind": "failure", "rank": None, "exit_code": self.torchrun.code, "message": failure.message})
            self.stopping.begin(StopReason.TORCHRUN_DIED)
        self.stopping.advance()
        self._record_escaped()
        self.stopping.end_exit_barrier(self.hub is not None and self.hub.busy(), self.journal.emit)
        if self.journal.dirty:
            self.save()
        if self.port.running and self.ranks.gone() and not self._nodes_pending() and not self._restart_due():
            # Every rank process is gone, so nothing can log any more: flush telemetry now,
            # while torchrun tears down (~0.5 s), not after it.
            self.port.stop()

    def _record_escaped(self) -> None:
        """Descendants without the run's environment, for `xl stop` and settling to find once
        this supervisor is gone (xl.launcher.runprocs.escaped)."""
        now = time.monotonic()
        if now < self.escaped_scan_at:
            return
        self.escaped_scan_at = now + _ESCAPED_SCAN_S
        seen = runprocs.escaped_descendants(os.getpid(), self.run_id)
        # A process in the middle of exiting has lost its environment too: one that is still
        # there a scan later has escaped.
        found = [item for item in seen if item in self.escape_seen]
        self.escape_seen = seen
        if found != self.escaped:
            try:
                runprocs.save_escaped(self.run_dir, found)
                self.escaped = found
            except OSError as exc:
                self.journal.write_failed(runprocs.ESCAPED_FILE, exc)

    def _all_done(self) -> bool:
        return self.ranks.all_done(self.torchrun.code, self.stopping.state is not None)

    def _restart_due(self) -> bool:
        """A rank failed while torchrun has restarts left: its ranks come back (keep telemetry)."""
        return self.restart_reason is not None and self.torchrun.code is None

    def _nodes_pending(self) -> bool:
        return self.hub is not None and self.hub.pending()

    # ---------------------------------------------------------------- what a rank's start or end means
    def _rank_started(self, st: RankState) -> None:
        gpu = f", GPU {st.gpu}" if st.gpu is not None else ""
        self.journal.emit({"kind": "rank_started", "rank": st.rank, "pid": st.pid, "message": f"rank {st.rank} started (pid {st.pid}{gpu})"})
        self._ranks_changed()
        self.journal.changed()
        self.stopping.catch_up(st)

    def _rank_ended(self, st: RankState, code: int | None, when: float | None) -> None:
        self.journal.changed()
        stop = self.stopping.state
        st.end(code, when, stopped=st.signalled is not None or (stop is not None and stop.explains(code)))
        self.journal.emit({"kind": "rank_exited", "rank": st.rank, "exit_code": code, "message": describe_end(st)})
        self._ranks_changed()
        if st.state is not RankPhase.FAILED or self.cause.failure is not None or self.stopping.state is not None:
            return
        if st.attempt < self.ranks.max_restarts and self.torchrun.code is None:
            # torchrun restarts every rank of the node: no cause yet, no stop (the first
            # failure of an attempt is the reason; its peers end because torchrun stops them).
            if self.restart_reason is None:
                self.restart_reason = describe_end(st)
            return
        failure = self.cause.blame_rank(st, self.sink.drain)
        self.journal.emit({"kind": "failure", "rank": st.rank, "exit_code": st.exit_code, "message": failure.message})
        self.stopping.begin(StopReason.FAILURE)

    def _rank_restarted(self, st: RankState) -> None:
        """torchrun started ``st`` again: its first rank of a new attempt announces the restart."""
        self.journal.changed()
        if st.attempt <= self.attempt:
            return
        self.attempt = st.attempt
        self.record.update(attempt=st.attempt)
        why = f" after {self.restart_reason}" if self.restart_reason else ""
        message = f"torchrun restarted the ranks{why} (attempt {st.attempt + 1} of {self.ranks.max_restarts + 1})"
        self.restart_reason = None
        self.journal.emit({"kind": "restarted", "attempt": st.attempt, "message": message})

    def _ranks_changed(self) -> None:
        """Every rank for telemetry; other nodes' ranks are flagged ``remote`` (not sampled here)."""
        remote = self.hub.remote_ranks() if self.hub is not None else []
        self.port.call("set_ranks", self.ranks.to_json() + [{**r, "remote": True} for r in remote])

    def save(self, waited: dict[int, float] | None = None) -> None:
        local = self.ranks.to_json()
        self.journal.send({"type": "ranks", "ranks": local})
        remote = self.hub.remote_ranks() if self.hub is not None else []
        ranks = sorted(local + remote, key=lambda r: int(r.get("rank") or 0))
        self.journal.save(digest.with_waits(ranks, waited) if waited else ranks, self.cause.to_json())

    # ---------------------------------------------------------------- the end
    def abort(self, exc: BaseException) -> None:
        """A bug here must not leave ranks behind nor a run that says "running" forever.

        Descriptors go first (out of them may be why it crashed): the rest needs a few."""
        self.sink.close_all()
        with contextlib.suppress(Exception):
            self.port.stop()
        runprocs.kill_all(runprocs.find_run_pids(self.run_id))
        if self.torchrun.proc is not None:
            runprocs.signal_pid(self.torchrun.proc.pid, signal.SIGKILL)
        if self.cause.failure is None:
            self.cause.failure = self.cause.local(None, None, None, None, f"supervisor error: {exc!r}")

    def finish(self) -> RunStatus:
        self.cause.fill_from_torchrun_log(self.ranks, self.journal.emit)
        status = self.cause.conclude(self.stopping.requested, self.torchrun.code, self.stopping.barrier_ended, self.ranks)
        self.ranks.settle(stopped=status is RunStatus.STOPPED)
        if self.hub is not None:
            self.hub.settle(status)
        _debug("finish start")
        self.port.stop()
        _debug("telemetry stopped")
        self.sink.close_logs()
        self.record.end(status)
        # The time accounting goes in with the final status: whoever sees the end sees it too.
        self.save(digest.close_run(self.run_dir, self.record, self.digester))
        self.journal.emit({"kind": "run_ended", "status": status.value, "message": f"run {status.value}"})
        link = self.journal.link
        if link is not None:
            failure = None if self.cause.remote else self.cause.to_json()
            link.send({"type": "end", "status": status.value, "failure": failure, "at": self.cause.at or time.time()})
            if not link.close(_LINK_CLOSE_S):
                say("node 0 did not take this node's last records; they are here")
        return status


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m xl.launcher.supervisor RUN_DIR", file=sys.stderr)
        return 2
    sup = Supervisor(Path(argv[0]))
    if sup.record.final:
        return sup.record.exit_code  # stopped (xl stop) before this supervisor could start it
    try:
        sup.start()
        if sup.torchrun.proc is not None:
            sup.run_loop()
    except BaseException as exc:
        crash_line(f"crashed: {exc!r}; ending the run")
        with contextlib.suppress(Exception):
            sup.abort(exc)
        with contextlib.suppress(Exception):
            traceback.print_exc()
    return sup.finish().exit_code
