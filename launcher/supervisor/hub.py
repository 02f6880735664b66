"""Node 0 of a multi-node run: its view of the other nodes (xl.launcher.multinode.nodelink).

Node 0's collector listens where every node can reach it and node 0's run dir becomes the run's
one view. Every other node gathers its own ranks' metrics and output in its own run dir and
sends node 0 its ranks, their last output lines, lifecycle events, a summary of their metrics
each second and its failure; node 0 adds them (``ranks`` of every node, ``node_rank`` on each),
ends its part when another node fails or is lost, tells the others to end theirs, and waits for
their ends before finishing.

The collector's thread puts what arrives in ``inbox``; the supervisor's loop takes it out each
turn (``poll``), so what is kept here is only ever touched by the loop.
"""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from xl import envnames, settings
from xl.errors import UsageError
from xl.launcher.multinode.join import (
    format_address,
    hub_address,
    listen_host,
    valid_token,
)
from xl.launcher.multinode.nodelink import StopCommand
from xl.launcher.multinode.protocol import (
    EndMessage,
    EventMessage,
    FailureMessage,
    FingerprintMessage,
    LogMessage,
    NodeMessage,
    RanksMessage,
    RefusedMessage,
)
from xl.launcher.rundir.events import EventKind, FromNode, NodeNotice, NodeRefused, Notice
from xl.launcher.rundir.outcome import (
    DONE_STATES,
    LIVE_STATES,
    Cause,
    CauseKind,
    Failure,
    rank_outcome,
)
from xl.launcher.rundir.rows import RankRow
from xl.launcher.rundir.runrecord import RunRecord, RunStatus
from xl.launcher.supervisor.failure import RootCause
from xl.launcher.supervisor.journal import Journal, say
from xl.launcher.supervisor.logsink import LogSink
from xl.launcher.supervisor.nodewatch import (
    Verdict,
    judge,
    node_timeout,
    quiet_message,
    supervisor_gone_message,
)
from xl.launcher.supervisor.safe_telemetry import NodeHooks
from xl.launcher.supervisor.stopping import Stopping, StopReason
from xl.units import ranks_text

if TYPE_CHECKING:  # its fingerprint is read as a node's first message comes
    from xl.doctor.api import Fingerprint

# A node whose link closed without its end is lost after nodewatch.LINK_CLOSED_S (a supervisor
# that restarts its connection comes back well within it); one that went silent, after
# XL_NODE_TIMEOUT seconds; unless its ranks' own frames show it is up (nodewatch). After its own
# ranks are done node 0 waits for every other node's end: without limit while that node is heard
# from with ranks running (under c10d global rank 0 may well be there, finishing last), else up
# to the stop grace plus _NODE_END_WAIT_S (XL_NODE_END_WAIT, for tests only, shortens it).
_NODE_END_WAIT_S = 10.0


def _node_end_wait() -> float:
    return settings.number(envnames.NODE_END_WAIT, _NODE_END_WAIT_S, floor=0.0)


# Node 0 records at most this many refused joins (a wrong XL_TOKEN), one per node, host and
# address: a peer cannot fill events.jsonl with them (collector.json counts every one).
_MAX_REFUSED_EVENTS = 16

Inbox = queue.SimpleQueue[tuple[int, str, list[NodeMessage] | None, float]]


def resolve_hub(record: RunRecord, token: str) -> tuple[tuple[str, int] | None, str]:
    """Node 0's collector address (None: single node, or no view of the others) and the token.

    Every node of a run shares its XL_TOKEN; a node > 0 without a valid one keeps its records
    here only."""
    if record.nnodes < 2:
        return None, token
    try:
        hub = hub_address(record.rdzv or "", os.environ)
    except UsageError as exc:
        say(f"no view of the other nodes: {exc}")
        return None, token
    given = os.environ.get(envnames.TOKEN)
    if valid_token(given):
        return hub, str(given)
    if record.node_rank > 0:
        say(f"no valid {envnames.TOKEN}: this node's records stay here only")
        return None, token
    return hub, token


def refused_event(node: int, host: str, peer: str) -> NodeRefused:
    """A node with a wrong XL_TOKEN, said with its number and address only."""
    where = f"host {host or '?'}" + (f", from {peer}" if peer else "")
    return NodeRefused(
        host,
        node,
        peer,
        f"a node {node} ({where}) tried to join with a wrong {envnames.TOKEN} and was refused; "
        "waiting on for this run's nodes: start them with the exact command this node printed",
    )


@dataclass
class RemoteNode:
    """Node 0's view of another node, from what its link sent."""

    node: int
    host: str = ""
    ranks: list[RankRow] = field(default_factory=list)
    seen: float = 0.0  # monotonic
    closed_at: float | None = None  # monotonic; its link closed without its end
    status: RunStatus | None = None  # its run ended with this
    lost: bool = False
    partial: dict[int, bytes] = field(default_factory=dict)
    idle_since: float | None = None  # monotonic; when node 0 learnt that none of its ranks runs
    orphaned: bool = False  # its link is down while its ranks still send (nodewatch)
    quiet: bool = False  # orphaned, then its ranks stopped sending too: its part is over
    strange_logs: int = 0  # output it sent for ranks it does not have (dropped)
    # Its fingerprint (its link's first message); ``joined`` once it sent that or anything else
    # (a node without one is compared without it).
    fingerprint: Fingerprint | None = None
    joined: bool = False

    @property
    def busy(self) -> bool:
        """Heard from (not lost), its part not ended, and some rank of it starting or running."""
        return self.status is None and not self.lost and not self.quiet and self.idle_since is None

    @property
    def over(self) -> bool:
        return self.status is not None or self.lost or self.quiet

    def rank_numbers(self) -> list[int]:
        return sorted(r.rank for r in self.ranks if r.rank is not None)

    def take_ranks(self, ranks: Iterable[RankRow]) -> None:
        """Its ranks as it sent them, each with its node; idle once none starts or runs."""
        self.ranks = [replace(r, host=r.host or self.host, node_rank=self.node) for r in ranks]
        if any(r.state in LIVE_STATES for r in self.ranks):
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = time.monotonic()


def never_joined(never: list[int]) -> Notice:
    """Which nodes never joined a run that ended first."""
    names = ", ".join(map(str, never))
    return Notice(EventKind.NODES_NEVER_JOINED, f"node(s) {names} never joined: the run ended "
                  "before they did")


def joined(nodes: dict[int, RemoteNode]) -> list[int]:
    """The other nodes that joined: sent their fingerprint, or anything at all."""
    return sorted(n for n, remote in nodes.items() if remote.joined)


def fingerprints(nodes: dict[int, RemoteNode]) -> dict[int, Fingerprint | None]:
    """What each node that joined sent of itself (None: nothing)."""
    return {n: r.fingerprint for n, r in sorted(nodes.items()) if r.joined}


def ended(nodes: dict[int, RemoteNode], which: list[int]) -> bool:
    """Each of these nodes ended its part, or its link closed."""
    return all((r := nodes.get(n)) is None or r.over or r.closed_at is not None for n in which)


class Hub:
    def __init__(
        self,
        address: tuple[str, int],
        nnodes: int,
        journal: Journal,
        cause: RootCause,
        stopping: Stopping,
        sink: LogSink,
    ) -> None:
        self.address = address
        self.nnodes = nnodes
        self.journal, self.cause, self.stopping, self.sink = journal, cause, stopping, sink
        self.nodes: dict[int, RemoteNode] = {}
        self.inbox: Inbox = queue.SimpleQueue()
        self.timeout = node_timeout()
        self.local_done_at: float | None = None
        self.waited = False  # gave up waiting for some node's end
        self.told = False  # the other nodes were told to stop
        self.never_said = False  # said which nodes never joined a run that ended first
        self.refused_seen: set[tuple[int, str, str]] = set()

    def collector_hooks(self) -> NodeHooks:
        """Where telemetry's collector listens, and how it hands over what nodes send."""
        host, port = self.address
        return NodeHooks(
            host=listen_host(host),
            port=port,
            advertise=host,
            on_node=lambda node, name, msgs: self.inbox.put((node, name, msgs, time.time())),
            on_node_closed=lambda node: self.inbox.put((node, "", None, time.time())),
        )

    def collector_failed(self, error: str) -> str:
        """Every node sends to node 0's collector: without it (another program may hold its port,
        waiting for the token) the run must not start at all, as a squatter there would be sent
        every node's records (docs/security.md). The failure is recorded; returns its message."""
        where = format_address(*self.address)
        fix = "set XL_COLLECTOR_PORT to a free port, the same on every node"
        message = (f"node 0's collector cannot listen on {where} ({error}): "
                   f"another program may hold that port; {fix}")
        taken = f"node 0's collector port {where} is taken ({error})"
        cause = Cause(CauseKind.PORT_IN_USE, taken, fix, [error])
        self.cause.set(self.cause.local(None, None, None, None, message, cause), time.time())
        return message

    def remote_ranks(self) -> list[RankRow]:
        """The other nodes' rows of run.json, as their links sent them."""
        return [r for node in self.nodes.values() for r in node.ranks]

    # ---------------------------------------------------------------- what came in
    def poll(self) -> bool:
        """What the other nodes' links sent since the last turn (the collector thread queues it);
        True when another node's set of ranks changed (telemetry is told every rank)."""
        ranks_changed = False
        while True:
            try:
                node, host, msgs, when = self.inbox.get_nowait()
            except queue.Empty:
                return ranks_changed
            if msgs and isinstance(refused := msgs[0], RefusedMessage):
                self._refused(node, host, refused)  # not a node of this run: no RemoteNode
                continue
            remote = self.nodes.get(node)
            if remote is None:
                # Until its ranks are known, a node that is heard from counts as busy.
                remote = self.nodes[node] = RemoteNode(node, seen=time.monotonic())
            if msgs is None:  # its link closed
                if not remote.over:
                    remote.closed_at = time.monotonic() - max(0.0, time.time() - when)
                continue
            remote.host = host or remote.host
            remote.seen, remote.closed_at = time.monotonic(), None
            remote.joined = remote.joined or bool(msgs)
            for msg in msgs:
                ranks_changed = self._message(remote, msg) or ranks_changed

    def _refused(self, node: int, host: str, refused: RefusedMessage) -> None:
        """A node with a wrong XL_TOKEN tried to join: say so; the run waits on for the right one
        (a node of this run)."""
        peer = refused.peer
        key = (node, host, peer)
        if key in self.refused_seen or len(self.refused_seen) >= _MAX_REFUSED_EVENTS:
            return
        self.refused_seen.add(key)
        self.journal.emit(refused_event(node, host, peer))

    def _message(self, remote: RemoteNode, msg: NodeMessage) -> bool:
        """Act on one message of ``remote``; True when it brought that node's ranks."""
        if isinstance(msg, LogMessage):
            rank = msg.rank
            if not any(r.rank == rank for r in remote.ranks):
                # Only the ranks it has: a peer with the token once sent 25,000 made-up ones, a
                # file each.
                remote.strange_logs += 1
                if remote.strange_logs == 1:
                    say(f"node {remote.node} sent output of rank {rank}, which it does not have; "
                        "dropped (and any more such)")
                return False
            data = msg.data.encode("utf-8", "surrogateescape")
            remote.partial[rank] = self.sink.append(rank, data, remote.partial.get(rank, b""))
        elif isinstance(msg, RanksMessage):
            remote.take_ranks(msg.ranks)
            self.journal.changed()
            return True
        elif isinstance(msg, EventMessage):
            # The run's own run_started/run_ended are node 0's; another node's are its part's.
            self.journal.emit(FromNode(dict(msg.event), remote.host, remote.node))
            if msg.kind is EventKind.STOP_REQUESTED and self.stopping.current is None:
                # Someone stopped that node: its collectives are gone, so is the run.
                self.journal.record.update(stop_requested_at=time.time())
                self.stopping.begin(StopReason.REQUESTED)
        elif isinstance(msg, FingerprintMessage):
            from xl.doctor.api import Fingerprint  # noqa: PLC0415 - a node's first message only

            remote.fingerprint = Fingerprint.from_json(msg.fingerprint)
        elif isinstance(msg, FailureMessage):
            self._failure(remote, msg)
        elif isinstance(msg, EndMessage):
            remote.status = msg.status
            if msg.failure is not None and msg.status is RunStatus.FAILED:
                self._failure(remote, msg.failure)
            self.journal.changed()
        return False

    def _failure(self, remote: RemoteNode, msg: FailureMessage) -> None:
        """Another node's root cause becomes the run's when it came first."""
        if not msg.own:
            return  # a failure node 0 told it about, coming back
        if self.stopping.requested:
            return
        failure = msg.failure
        where = f"node {remote.node} ({failure.host or remote.host})"
        message = f"{where}: {failure.message or 'failed'}"
        current = self.cause.failure
        if current is not None and current.node_rank == remote.node and current.rank is not None:
            # That node's root cause already, completed by its last word (e.g. the signal that
            # killed the rank, read from its torchrun's summary at its end).
            if failure.rank is not None:
                current.rank = failure.rank
            if failure.exit_code is not None:
                current.exit_code = failure.exit_code
            if failure.traceback is not None:
                current.traceback = failure.traceback
            if failure.error is not None:
                current.error = failure.error
            current.message = message
            current.cause = failure.cause or current.cause
            self.journal.changed()
            return
        if current is not None and (self.cause.at is None or msg.at >= self.cause.at):
            return
        adopted = replace(failure, message=message, host=failure.host or remote.host,
                          node_rank=remote.node)
        self.cause.set(adopted, msg.at)
        self.stopping.begin(StopReason.FAILURE)

    # ---------------------------------------------------------------- each turn
    def check_nodes(self, rank_frames: Callable[[], dict[int, float]]) -> None:
        """A node whose link closed without its end, or that went silent, is lost: the run is
        over; unless its ranks still send (its supervisor alone is gone or frozen).
        ``rank_frames``: {rank: unix time of its last frame to the collector}."""
        now = time.monotonic()
        frames = rank_frames() if any(not r.over for r in self.nodes.values()) else {}
        for remote in self.nodes.values():
            if remote.over:
                continue
            heard = [frames[r] for r in remote.rank_numbers() if r in frames]
            ranks_heard = now - max(0.0, time.time() - max(heard)) if heard else None
            verdict = judge(now, remote.seen, remote.closed_at, ranks_heard, self.timeout)
            if verdict is not Verdict.LOST:
                self._judged(remote, verdict)
                continue
            closed = remote.closed_at is not None
            remote.lost = True
            since = remote.closed_at if remote.closed_at is not None else remote.seen
            running = [r.rank for r in remote.ranks
                       if r.rank is not None and r.state in LIVE_STATES]
            silent = f"nothing came from it for {self.timeout:g}s"
            how = "its supervisor's connection closed" if closed else silent
            ranks = f" with {ranks_text(running)} running" if running else ""
            message = (f"node {remote.node} ({remote.host or '?'}) was lost{ranks}: {how} "
                       "(killed, or its machine went down)")
            lost = NodeNotice(EventKind.NODE_LOST, remote.node, message, node=remote.host)
            self.journal.emit(lost)
            cause = Cause(CauseKind.KILLED, f"node {remote.node}'s supervisor is gone: {how}",
                          None, [message])
            failure = Failure(None, None, None, None, message, remote.host, remote.node, cause)
            self._failure(remote, FailureMessage(failure, time.time() - (now - since), own=True))
            self.journal.changed()

    def _judged(self, remote: RemoteNode, verdict: Verdict) -> None:
        """Say once that a node's supervisor is gone while its ranks train on, and when they
        end."""
        if verdict is Verdict.ORPHANED and not remote.orphaned:
            remote.orphaned = True
            closed, ranks = remote.closed_at is not None, remote.rank_numbers()
            message = supervisor_gone_message(remote.node, remote.host, closed, ranks)
            kind = EventKind.NODE_SUPERVISOR_LOST
            self.journal.emit(NodeNotice(kind, remote.node, message, node=remote.host))
        elif verdict is Verdict.QUIET:
            remote.quiet = True
            message = quiet_message(remote.node, remote.host)
            quiet = NodeNotice(EventKind.NODE_QUIET, remote.node, message, node=remote.host)
            self.journal.emit(quiet)
            self.journal.changed()
        elif verdict is Verdict.ALIVE and remote.orphaned and remote.closed_at is None:
            remote.orphaned = False  # its supervisor speaks again (thawed)

    def busy(self) -> bool:
        """Another node is heard from and still has ranks running."""
        return any(remote.busy for remote in self.nodes.values())

    def pending(self) -> bool:
        """Node 0, its own ranks done: True while it still waits for another node's end.

        A node that is heard from (its heartbeat: check_nodes declares it lost once that
        stops) and has ranks running is waited for as long as that lasts, unless the run is
        being stopped (it was told to stop too: its own grace ends its ranks); a node whose ranks
        are done, or that was never heard from, for the stop grace plus _NODE_END_WAIT_S since
        node 0 knew (its end follows its ranks' within its own exit barrier's grace). A run that
        was stopped or failed waits for no node that never joined: it has nothing to end."""
        if self.waited:
            return False
        now = time.monotonic()
        if self.local_done_at is None:
            self.local_done_at = now
        over = {n for n, r in self.nodes.items() if r.over}
        waiting = [n for n in range(1, self.nnodes) if n not in over]
        never = [n for n in waiting if n not in self.nodes]
        if never and self.stopping.current is not None:
            waiting = [n for n in waiting if n in self.nodes]
            if not self.never_said:
                self.never_said = True
                self.journal.emit(never_joined(never))
        if not waiting:
            return False
        limit = self.stopping.grace + _node_end_wait()
        for n in waiting:
            remote = self.nodes.get(n)
            if remote is not None and remote.busy and self.stopping.current is None:
                return True
            since = self.local_done_at
            if remote is not None:
                since = max(since, remote.idle_since or 0.0)
            if now - since < limit:
                return True
        self.waited = True
        heard = ", ".join(str(n) for n in waiting if n in self.nodes)
        unheard = ", ".join(str(n) for n in waiting if n not in self.nodes)
        said = [f"node(s) {heard} had not reported the end of their part {limit:g}s after "
                "their ranks were done"] if heard else []
        said += [f"node(s) {unheard} never reached node 0's collector"] if unheard else []
        said_all = "; ".join(said) + "; their own run dirs have the rest"
        self.journal.emit(Notice(EventKind.NODES_UNFINISHED, said_all))
        return False

    def tell_nodes(self) -> StopCommand | None:
        """Collectives of the other nodes may wait for this node's ranks for many minutes: end
        them, when the stop was asked for or the run failed (the stop the collector sends every
        node, once; None when there is none to send). A stray process left after a clean finish
        is no reason to fail the other nodes."""
        stop = self.stopping.current
        if self.told or stop is None:
            return None
        if stop.reason is not StopReason.REQUESTED and self.cause.failure is None:
            return None
        self.told = True
        failure = self.cause.failure
        # A copy: _failure may complete ours once it is on its way.
        return StopCommand(stop.reason is StopReason.REQUESTED,
                           None if failure is None else replace(failure))

    def settle(self, status: RunStatus) -> None:
        """At the end: the running ranks of a lost node failed with it; those of a node whose
        ranks went quiet without their supervisor ended with the run (its own run dir has how)."""
        ended = rank_outcome(
            0 if status is RunStatus.SUCCEEDED else None, stopped=status is RunStatus.STOPPED
        )
        for node in self.nodes.values():
            if node.lost or node.quiet:
                state = (rank_outcome(None, stopped=False) if node.lost else ended).value
                node.ranks = [r if r.state in DONE_STATES else replace(r, state=state)
                              for r in node.ranks]
