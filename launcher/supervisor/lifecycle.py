"""What a rank's start, restart or end means for the run: its events, torchrun's restarts, the
suspect and the stop.

``Ranks`` finds what changed (``RankChange``); the loop hands the changes here, in their order.
A rank's end is said (its ``rank_exited`` event, the live line people read) once it is known:
a rank gone without a word waits for its exit code (its zombie, torchrun's report), and while a
failure is being decided every end waits for the decision, so the rank that failed first is
"failed" and the others are what they are, in every place, whatever order they were found in
(docs/launch.md, "Why a rank died").
``--max-restarts N``: torchrun restarts every rank of the node after a failure, N times at most.
While it has restarts left a failed rank is no cause and starts no stop; its next process is
attempt k (``restarted`` event, ``attempt`` in run.json). The run fails when torchrun gives up.
"""

from __future__ import annotations

import signal

from xl.launcher.rundir.events import RankExited, RankStarted, Restarted
from xl.launcher.rundir.outcome import RankPhase, rank_outcome
from xl.launcher.rundir.runrecord import RunRecord
from xl.launcher.supervisor.failure import RootCause
from xl.launcher.supervisor.journal import Journal
from xl.launcher.supervisor.ranks import Change, RankChange, RankRow, Ranks, describe_end
from xl.launcher.supervisor.stopping import Stopping, StopReason
from xl.launcher.supervisor.torchrun import Torchrun


class Lifecycle:
    """The ranks' starts and ends, as the run's events and decisions."""

    def __init__(
        self,
        record: RunRecord,
        journal: Journal,
        ranks: Ranks,
        torchrun: Torchrun,
        cause: RootCause,
        stopping: Stopping,
    ) -> None:
        self.record, self.journal, self.ranks, self.torchrun = record, journal, ranks, torchrun
        self.cause, self.stopping = cause, stopping
        self.attempt = 0  # torchrun's restarts so far (the highest attempt any rank reached)
        self.restart_reason: str | None = None  # the failure that will make torchrun restart
        self.held: list[RankRow] = []  # ended; their end is said once it is known
        cause.on_decided = self.say_held  # the decision's states, before its failure event

    def act(self, changes: list[RankChange]) -> bool:
        """Act on ``changes`` in their order; True when a rank started or ended (telemetry's
        set of ranks is told again)."""
        told = False
        self._say_known()
        for change in changes:
            self.journal.changed()
            st = change.st
            if st is None:
                continue  # the run's world_size: in the record already
            if change.change is Change.STARTED:
                self._started(st)
                told = True
            elif change.change is Change.ENDED:
                self._ended(st, change.code, change.when)
                told = True
            elif change.change is Change.RESTARTED:
                self._restarted(st)
        if told:
            # A survivor tearing down after its peer died ends now, before the cause is read.
            self.stopping.cut_teardowns()
        return told

    @property
    def restart_due(self) -> bool:
        """A rank failed while torchrun has restarts left: its ranks come back (keep telemetry)."""
        return self.restart_reason is not None and self.torchrun.code is None

    def _started(self, st: RankRow) -> None:
        gpu = f", GPU {st.gpu}" if st.gpu is not None else ""
        self.journal.emit(
            RankStarted(st.rank, st.pid, f"rank {st.rank} started (pid {st.pid}{gpu})")
        )
        self.stopping.catch_up(st)

    def _ended(self, st: RankRow, code: int | None, when: float | None) -> None:
        st.end(code, when, stopped=self._stopped(st, code, when))
        self._judge(st)
        self.held.append(st)
        self._say_known()

    def _stopped(self, st: RankRow, code: int | None, when: float | None) -> bool:
        """xl's stop ended ``st``: otherwise its end is its own, and a signal xl sent it after
        that end (or that did not make it) is forgotten, so it is said by its exit and may be
        the cause."""
        stop = self.stopping.current
        stopped = stop is not None and stop.ended(st, code, when)
        if not stopped:
            st.signalled = None
        elif st.signalled is None and stop is not None and stop.reason is StopReason.REQUESTED:
            # A stop the person asked for ended it, though torchrun's closing signal reached it
            # before xl's own: xl stopped it all the same.
            st.signalled = -code if code is not None and code < 0 else int(signal.SIGTERM)
        return stopped

    def _judge(self, st: RankRow) -> None:
        """What ``st``'s end means for the run: a restart to come, or a failure (suspected now,
        decided by ``RootCause.decide``; the stop begins at once)."""
        if (
            st.state is not RankPhase.FAILED
            or self.cause.failure is not None
            or self.stopping.current is not None
        ):
            return
        if st.attempt < self.ranks.max_restarts and self.torchrun.code is None:
            # torchrun restarts every rank of the node: no cause yet, no stop (the first
            # failure of an attempt is the reason; its peers end because torchrun stops them).
            if self.restart_reason is None:
                self.restart_reason = describe_end(st)
            return
        # Which rank is the cause is decided once its facts are in (RootCause.decide, each turn).
        self.cause.suspect(st)
        self.stopping.begin(StopReason.FAILURE)

    def _say_known(self) -> None:
        """Say the held ends that are known: none while a failure is being decided; a rank gone
        without a word once its exit code is read (or torchrun, which would say it, is gone)."""
        if not self.held or self.cause.deciding:
            return
        if any(st.exit_code is None for st in self.held) and self.torchrun.code is None:
            self.cause.codes_of_the_gone(self.ranks)
        for st in list(self.held):
            if st.exit_code is None and self.torchrun.code is None:
                continue
            self.held.remove(st)
            # Its outcome by the one rule, with what is known now (its code may have come
            # later; a failure decided before it ended is another rank's, and ended it unless
            # it failed of its own).
            failure = self.cause.failure
            stopped = self._stopped(st, st.exit_code, st.ended_at)
            blamed = (
                failure is None
                or (failure.rank == st.rank and failure.node_rank == st.node_rank)
                or (not stopped and not self.cause.peer_lost(st, lambda rank: None))
            )
            st.state = rank_outcome(st.exit_code, stopped=stopped, blamed=blamed)
            self.journal.emit(RankExited(st.rank, st.exit_code, describe_end(st)))

    def say_held(self) -> None:
        """The failure is decided (its states set): every held end is said, in the order the
        ranks were found, before the failure event."""
        held, self.held = self.held, []
        for st in held:
            self.journal.emit(RankExited(st.rank, st.exit_code, describe_end(st)))

    def _restarted(self, st: RankRow) -> None:
        """torchrun started ``st`` again: its first rank of a new attempt announces the restart."""
        if st.attempt <= self.attempt:
            return
        self.attempt = st.attempt
        self.record.update(attempt=st.attempt)
        why = f" after {self.restart_reason}" if self.restart_reason else ""
        total = self.ranks.max_restarts + 1
        message = f"torchrun restarted the ranks{why} (attempt {st.attempt + 1} of {total})"
        self.restart_reason = None
        self.journal.emit(Restarted(st.attempt, message))
