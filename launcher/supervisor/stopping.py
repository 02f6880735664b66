"""Stopping a run: why it stops, the grace between SIGTERM and SIGKILL, and the signals that ask.

A stop is a value (``Stop``: its reason, when it began, whether the grace ran out); ``Stopping``
moves it on: SIGTERM to every rank at once (and to processes of the run that never reported,
found by XL_RUN_ID in their environment), SIGKILL to whatever is left after the grace.
``xl stop`` and Ctrl-C reach the supervisor as SIGTERM / SIGINT (``StopSignals``).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from xl import envnames, settings
from xl.launcher import runprocs
from xl.launcher.supervisor.ranks import RankRow, Ranks

# `xl launch` imports this module (for the stop grace): torchrun's is the supervisor's only
if TYPE_CHECKING:
    from xl.launcher.rundir.events import Event
    from xl.launcher.supervisor.torchrun import Torchrun

DEFAULT_GRACE_S = 10.0
# The ends a stop's signal gives a rank: its death by SIGTERM or SIGKILL, or 128 + the signal,
# as a script's own handler or a shell between torchrun and Python exits.
STOP_EXITS = frozenset(
    {-signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGTERM, 128 + signal.SIGKILL}
)
# After the grace's SIGKILL of the ranks, torchrun's own: this much later, so that it reaps them
# and says how each ended (how a rank gone without a word died is only in its report).
TORCHRUN_AFTER_S = 1.0


def grace_from_env() -> float:
    """Seconds between SIGTERM and SIGKILL when a run stops (``XL_STOP_GRACE``, default 10)."""
    return settings.number(envnames.STOP_GRACE, DEFAULT_GRACE_S, floor=0.0)


class StopReason(str, Enum):
    REQUESTED = "requested"  # xl stop, Ctrl-C, or another node stopped
    FAILURE = "failure"  # a rank (here or on another node) failed first
    TORCHRUN_DIED = "torchrun_died"  # torchrun ended with ranks running, or left processes


@dataclass
class Stop:
    reason: StopReason
    since: float  # monotonic
    at: float = field(default_factory=time.time)  # the same moment by the clock ranks record
    killed: bool = False  # the grace ran out: SIGKILL was sent to the ranks
    killed_at: float = 0.0  # monotonic, when it was
    torchrun_killed: bool = False  # TORCHRUN_AFTER_S later: SIGKILL to torchrun too
    cut: set[int] = field(default_factory=set)  # pids of the teardowns it ended at once
    extra: list[int] = field(default_factory=list)  # processes of the run that never reported

    def explains(self, code: int | None) -> bool:
        """A rank ending with ``code`` during this stop was stopped: by its signal, without a
        code xl could read (torchrun reaped it), or, on a requested stop, by losing a peer
        that was stopped first."""
        return code is None or code < 0 or self.reason is StopReason.REQUESTED

    def ended(self, st: RankRow, code: int | None, when: float | None) -> bool:
        """This stop ended ``st`` (its end: ``code``, ``when`` by its record): not a rank that
        recorded its own end before the stop began, nor a rank xl signalled whose end is not the
        one its signal gives (a rank that recorded its own exit ignores SIGTERM through its
        teardown, so its exit 3 or its exception's 1 is its own; a running rank dies of it)."""
        if code is not None and code > 0 and when is not None and when <= self.at:
            return False
        if st.signalled is None or self.reason is StopReason.REQUESTED:
            return self.explains(code)
        return code is None or code in STOP_EXITS


class StopSignals:
    """SIGTERM / SIGINT ask for a stop (``requested`` names the signal); SIGHUP is ignored;
    every signal wakes the loop's select through a pipe."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self.wake_fd = -1

    def install(self, sel: selectors.BaseSelector) -> None:
        rfd, wfd = os.pipe()
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        sel.register(rfd, selectors.EVENT_READ, self.drain)
        self.wake_fd = rfd

        def on_stop(signum: int, _frame: Any) -> None:
            self.requested = signal.Signals(signum).name

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the loop

    def drain(self) -> None:
        with contextlib.suppress(OSError):
            os.read(self.wake_fd, 512)


class Stopping:
    """The run's stop, from its first SIGTERM to the last SIGKILL; also ends a torchrun stuck
    at the multi-node exit barrier after its ranks are done."""

    def __init__(
        self,
        run_id: str,
        grace: float,
        ranks: Ranks,
        torchrun: Torchrun,
    ) -> None:
        self.run_id = run_id
        self.grace = grace
        self.ranks = ranks
        self.torchrun = torchrun
        # The stop in force (None: none). A new one is a change of the run's record: the loop
        # compares it with the one it last saved (``Supervisor.turn``), wherever it began.
        self.current: Stop | None = None
        self.barrier_since: float | None = None  # multi-node: when torchrun outlived its ranks
        self.barrier_ended = False  # xl ended torchrun stuck at its exit barrier

    @property
    def requested(self) -> bool:
        return self.current is not None and self.current.reason is StopReason.REQUESTED

    def begin(self, reason: StopReason) -> bool:
        """Stop the run for ``reason``; False when a stop was already under way (it stays)."""
        if self.current is not None:
            return False
        self.current = Stop(reason=reason, since=time.monotonic())
        if reason is StopReason.REQUESTED:
            self.torchrun.signal(signal.SIGTERM)
        for st in self.ranks:
            st.signal(signal.SIGTERM)
        # Ranks that never reported (e.g. still importing) are found by their environment, and
        # what left a rank's session or environment as this subreaper's descendant.
        self.current.extra = self._unknown_pids()
        for pid in self.current.extra:
            runprocs.signal_rank(pid, signal.SIGTERM)
        return True

    def catch_up(self, st: RankRow) -> None:
        """A rank that started while everything is being stopped gets the same treatment."""
        if self.current is not None:
            st.signal(signal.SIGKILL if self.current.killed else signal.SIGTERM)

    def advance(self) -> None:
        """SIGKILL for every rank left once the grace has passed; for torchrun a moment later
        (``TORCHRUN_AFTER_S``), if it has not ended by then."""
        stop = self.current
        if stop is None or stop.torchrun_killed:
            return
        now = time.monotonic()
        if not stop.killed:
            self.cut_teardowns()
            if now - stop.since < self.grace:
                return
            stop.killed, stop.killed_at = True, now
            for st in self.ranks:
                st.signal(signal.SIGKILL)
            runprocs.kill_all(stop.extra + self._unknown_pids())
        if now - stop.killed_at >= TORCHRUN_AFTER_S:
            stop.torchrun_killed = True
            self.torchrun.signal(signal.SIGKILL)

    def cut_teardowns(self) -> None:
        """A rank whose script ended with the loss of a peer (its collective broke) while that
        peer died of its own, and whose process still tears down: ended now, as torchrun's
        closing signal ends it, not at the grace's end (it has nothing left to save). xl's entry
        lets a stop's SIGTERM pass in a rank's teardown so that a rank's own failure prints
        whole; that one keeps its teardown until the grace. Asked as soon as ends are known
        (``Lifecycle``), before anything is explained, and on each turn of the stop."""
        stop = self.current
        if stop is None or stop.reason is not StopReason.FAILURE or stop.killed:
            return
        from xl.launcher.causes.words import peer_loss  # noqa: PLC0415 - a failure only

        def lost_peer(st: RankRow) -> bool:
            return peer_loss(f"{st.error or ''}\n{st.traceback or ''}") is not None

        died = any(
            st.done and (st.vanished or st.exit_code not in (0, None)) and not lost_peer(st)
            for st in self.ranks
        )
        if not died:
            return
        for st in self.ranks:
            if (st.done and not st.vanished and st.exit_code not in (0, None)
                    and st.pid is not None and st.pid not in stop.cut and lost_peer(st)):
                stop.cut.add(st.pid)
                st.signal(signal.SIGKILL)

    def leftovers(self, signalled: bool) -> bool:
        """Kill any process still carrying this run's id, or descending from this supervisor;
        True while some remain."""
        pids = sorted(
            set(runprocs.find_run_pids(self.run_id)) | set(runprocs.descendants(os.getpid()))
        )
        if not pids:
            return False
        if self.current is None:
            self.begin(StopReason.REQUESTED if signalled else StopReason.TORCHRUN_DIED)
            return True
        if self.current.killed:
            runprocs.kill_all(pids)
        return True

    def end_exit_barrier(self, nodes_busy: bool) -> Event | None:
        """Multi-node: a torchrun whose ranks have all ended waits at its exit barrier for every
        other node's torchrun (up to 300 s), and the torchrun of a node that failed never comes.
        This node's ranks are done, so its run is over: after the grace, end torchrun; the
        ranks' exit codes decide the status. Nothing of the other nodes needs it any more (their
        torchrun just logs that its own exit barrier failed, or that the c10d store it used is
        gone).

        Node 0's torchrun serves the c10d store: ending it while another node's ranks work on
        (they may finish well after these, e.g. saving a checkpoint) has that node's torchrun
        lose its store and kill them. Its barrier is ended only once no node is busy
        (``nodes_busy``). Returns the event that says so, the turn it ends it, for the loop to
        record."""
        if not self.ranks.multi_node or self.current is not None or self.torchrun.proc is None:
            return None
        if self.torchrun.code is not None or not self.ranks.gone() or nodes_busy:
            self.barrier_since = None
            return None
        now = time.monotonic()
        if self.barrier_since is None:
            self.barrier_since = now
            return None
        # Not less than 2 s: on success the other nodes arrive within torchrun's monitor tick.
        wait = max(self.grace, 2.0)
        if not self.barrier_ended and now - self.barrier_since >= wait:
            self.barrier_ended = True
            # The launch imports this module for grace_from_env alone: the events load here.
            from xl.launcher.rundir.events import EventKind, Notice  # noqa: PLC0415 - see above

            self.torchrun.signal(signal.SIGTERM)
            return Notice(
                EventKind.EXIT_BARRIER,
                "this node's ranks are done but torchrun still waited for the other nodes "
                f"after {wait:g}s (one failed or was stopped?); ending it",
            )
        if self.barrier_ended and now - self.barrier_since >= wait + 1.0:
            # Its SIGTERM handler only runs once the store call it blocks in returns; it has
            # no rank left to tear down, so SIGKILL loses nothing.
            self.torchrun.signal(signal.SIGKILL)
        return None

    def _unknown_pids(self) -> list[int]:
        known = self._known_pids()
        found = set(runprocs.find_run_pids(self.run_id, exclude=known)) | set(
            runprocs.descendants(os.getpid())
        )
        return sorted(found - known)

    def _known_pids(self) -> set[int]:
        pids = self.ranks.known_pids()
        if self.torchrun.proc is not None:
            pids.add(self.torchrun.proc.pid)
        return pids
