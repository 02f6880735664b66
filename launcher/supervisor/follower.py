"""A node > 0 of a multi-node run: what node 0 tells it over the link.

Node 0 stops the others when the run is stopped or fails anywhere (its failure comes along and
becomes this node's too), refuses a node whose XL_TOKEN is not the run's, and asks for this
node's ranks' stacks (``xl stacks`` or a hang on node 0): a thread of its own asks them, as
``xl stacks`` would here, and sends the entries back as one ``stacks`` message. Its ranks' output
stays here: node 0 asks for a piece of it when ``xl logs`` there wants it (a ``logs`` message
answers), and takes the last lines of each as it exits (``send_tails``).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from xl import envnames, settings
from xl.errors import UsageError
from xl.launcher.multinode import nodelink
from xl.launcher.multinode.clip import clip_stacks
from xl.launcher.multinode.join import TOKEN_VAR, format_address
from xl.launcher.multinode.protocol import (
    MAX_LOGS_DATA,
    LogsMessage,
    StacksMessage,
)
from xl.launcher.plan import parse_rdzv
from xl.launcher.rundir.events import EventKind, NodeNotice, Notice
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.outcome import Failure
from xl.launcher.stacks import gather as capture
from xl.launcher.supervisor.failure import RootCause
from xl.launcher.supervisor.journal import Journal
from xl.launcher.supervisor.nodewatch import node_timeout
from xl.launcher.supervisor.stopping import Stopping, StopReason
from xl.launcher.supervisor.torchrun import Torchrun

_MAX_ASKING = 4  # stacks requests answered at once; more are answered "busy"
# What node 0 keeps of a rank's output at this node's end (every line stays here).
TAIL_BYTES = 64 << 10


def read_piece(path: Path, offset: int, limit: int = MAX_LOGS_DATA) -> tuple[str | None, int]:
    """Up to ``limit`` bytes of ``path`` from ``offset`` as text (bytes that are not UTF-8
    escaped: they come out unchanged), and its size; (None, 0) when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(min(offset, size))
            data = fh.read(limit)
    except OSError:
        return None, 0
    return data.decode("utf-8", "surrogateescape"), size
# torchrun's c10d client gives up on node 0's store after its read_timeout (60 s), while its
# rendezvous waits this long for every node (join_timeout): a node > 0 waits as long for node 0.
RDZV_JOIN_S = 600.0
_SAY_WAITING_S = 2.0
# A node > 0 ends its ranks once node 0 has been silent this long (XL_NODE_0_LOST_S) and its
# rendezvous cannot be reached; "keep" waits on. Past torch's own store timeouts (60 s) a node cut
# off can no longer rejoin anyway; its ranks would wait in collectives for 30 min (gloo's default).
NODE_0_LOST_S = 120.0
_PROBE_S = 4.0  # node 0's rendezvous is tried at most this often, each try at most half of it


def node_0_lost_s(timeout: float) -> float | None:
    """XL_NODE_0_LOST_S: seconds (at least the node timeout), or None for "keep"."""
    if os.environ.get(envnames.NODE_0_LOST_S, "").strip().lower() == "keep":
        return None
    return max(timeout, settings.number(envnames.NODE_0_LOST_S, NODE_0_LOST_S, positive=True))


class Follower:
    def __init__(
        self,
        hub: tuple[str, int],
        link: nodelink.NodeLink,
        journal: Journal,
        cause: RootCause,
        stopping: Stopping,
        torchrun: Torchrun,
    ) -> None:
        self.hub, self.link = hub, link
        self.journal, self.cause, self.stopping, self.torchrun = journal, cause, stopping, torchrun
        self._asking = threading.BoundedSemaphore(_MAX_ASKING)
        self.timeout = node_timeout()
        self.give_up_s = node_0_lost_s(self.timeout)
        self.node_0_silent = False  # said that node 0 stopped answering
        self.probe_at = 0.0  # monotonic: when node 0's rendezvous is next tried
        self.tailed: dict[int, int] = {}  # rank -> how far node 0 has its output (send_tails)

    def poll(self) -> None:
        """Node 0's commands since the last turn; and whether node 0 still answers; the last
        lines of a rank that exited."""
        self._check_node_0()
        self.send_tails(exited_only=True)
        for cmd in self.link.commands():
            if isinstance(cmd, nodelink.Refused):
                self._token_refused()
            elif isinstance(cmd, nodelink.StacksAsk):
                self._stacks(cmd)
            elif isinstance(cmd, nodelink.LogsAsk):
                self._logs(cmd)
            elif self.stopping.current is None:
                self._stop(cmd)

    def _stop(self, stop: nodelink.StopCommand) -> None:
        """Node 0 ends the run: asked for, or it failed (its failure is this node's too)."""
        if stop.requested:
            self.journal.emit(Notice(EventKind.STOP_REQUESTED, "node 0 stopped the run"))
            self.journal.record.update(stop_requested_at=time.time())
            self.stopping.begin(StopReason.REQUESTED)
            return
        if self.cause.failure is None:
            failure = stop.failure or Failure.from_json({})
            where = failure.node_rank if failure.node_rank is not None else "?"
            message = f"the run failed on node {where}: {failure.message or 'see node 0'}"
            self.cause.remote = True
            self.cause.set(replace(failure, message=message), time.time())
        self.stopping.begin(StopReason.FAILURE)

    def wait_for_node_0(self, rdzv: str, stop_came: Callable[[float], bool]) -> None:
        """Before torchrun starts: wait until node 0's rendezvous (its torchrun's c10d store)
        listens, up to RDZV_JOIN_S, so that a node 0 started a minute late is still joined;
        ``stop_came(wait)`` waits and says whether the run was stopped meanwhile, here or by
        node 0."""
        try:
            host, port = parse_rdzv(rdzv)
        except UsageError:
            return
        start, said = time.monotonic(), False
        while True:
            try:
                socket.create_connection((host, port), timeout=1.0).close()
                return
            except OSError:
                pass
            waited = time.monotonic() - start
            if waited >= RDZV_JOIN_S:
                return  # torchrun tries once more, and says why it cannot
            if not said and waited >= _SAY_WAITING_S:
                said = True
                self.journal.emit(
                    Notice(
                        EventKind.WAITING_FOR_NODE_0,
                        f"waiting for node 0's rendezvous at {format_address(host, port)} "
                        f"(up to {RDZV_JOIN_S:g}s, as torchrun's own): start node 0 there",
                    )
                )
            if stop_came(0.5):
                return
            self.poll()  # node 0 may end the run first (the nodes' environments differ)
            if self.stopping.current is not None:
                return

    def _check_node_0(self) -> None:
        """Node 0 answered this link once and then nothing for XL_NODE_TIMEOUT seconds: its
        machine, the network between, or its supervisor is gone. Say so (node 0 says the same
        of this node); this node's ranks go on while they can: torch's own timeouts end them if
        their peers are gone, and `xl stop` ends them at once."""
        heard = self.link.heard_at
        if heard is None or self.link.refused is not None:
            return  # never connected (training goes on, its records stay here), or refused
        quiet = time.monotonic() - heard
        silent = quiet > self.timeout
        if silent and not self.node_0_silent:
            self.node_0_silent = True
            then = (
                f"this node ends its ranks once node 0 has been silent {self.give_up_s:g}s and its "
                f"rendezvous cannot be reached ({envnames.NODE_0_LOST_S}=keep keeps them waiting)"
                if self.give_up_s is not None
                else "this node's ranks go on until torch's own timeout ends them "
                f"({envnames.NODE_0_LOST_S}=keep)"
            )
            self.journal.emit(NodeNotice(
                EventKind.NODE_LOST,
                0,
                f"node 0 ({format_address(*self.hub)}) has not answered for {self.timeout:g}s "
                "(its machine or the network between went down, or its supervisor is gone); "
                f"{then}; 'xl stop {self.journal.record.run_id}' ends them now",
            ))
        if (
            silent
            and self.give_up_s is not None
            and quiet > self.give_up_s
            and self.stopping.current is None
        ):
            self._give_up(quiet)
        elif not silent and self.node_0_silent:
            self.node_0_silent = False
            self.journal.emit(
                NodeNotice(
                    EventKind.NODE_BACK, 0, f"node 0 ({format_address(*self.hub)}) answers again"
                )
            )

    def _give_up(self, quiet: float) -> None:
        """Node 0 silent past XL_NODE_0_LOST_S: unless its rendezvous (node 0's torchrun's store)
        still takes a connection (then node 0's supervisor alone is gone and training goes on),
        its machine or the network to it is: the ranks here would wait in their collectives for
        torch's own timeout (30 min on gloo). End them, saying why."""
        now = time.monotonic()
        if now < self.probe_at:
            return
        self.probe_at = now + _PROBE_S
        try:
            host, port = parse_rdzv(str(self.journal.record.spec.get("rdzv") or ""))
            socket.create_connection((host, port), timeout=_PROBE_S / 2).close()
            return  # node 0's torchrun answers: its ranks (and so these) may well train on
        except (UsageError, OSError):
            pass
        message = (
            f"node 0 ({format_address(*self.hub)}) has not answered for {quiet:.0f}s and its "
            "rendezvous cannot be reached: this node's ranks were ended "
            f"({envnames.NODE_0_LOST_S}=keep keeps them waiting)"
        )
        if self.cause.failure is None:
            self.cause.remote = True  # nothing reaches node 0
            self.cause.set(self.cause.local(None, None, None, None, message), time.time())
        self.stopping.begin(StopReason.FAILURE)

    def _stacks(self, ask: nodelink.StacksAsk) -> None:
        """Node 0 wants this node's ranks' stacks: ask them off the loop's thread (it takes up to
        the deadline node 0 gave) and answer with one ``stacks`` message."""
        ident, rank, timeout = ask.id, ask.rank, ask.timeout
        limit = min(timeout, capture.TIMEOUT_S) if timeout is not None else capture.TIMEOUT_S
        ranks = [
            r
            for r in capture.live_ranks(self.journal.record)
            if rank is None or r.rank == rank
        ]
        if not self._asking.acquire(blocking=False):
            why = "this node is busy with other stacks requests"
            busy = [r.failed(why).to_json() for r in ranks]
            self.journal.send(StacksMessage(ident, busy))
            return

        def answer() -> None:
            try:
                entries = capture.local_entries(self.journal.run_dir, ranks, max(0.2, limit))
                said = clip_stacks([e.to_json() for e in entries])
                self.journal.send(StacksMessage(ident, said))
            finally:
                self._asking.release()

        threading.Thread(target=answer, name="xl-node-stacks", daemon=True).start()

    def _mine(self, rank: int) -> bool:
        return any(r.rank == rank for r in self.journal.record.ranks)

    def _logs(self, ask: nodelink.LogsAsk) -> None:
        """Node 0 wants a piece of one of this node's ranks' output (``xl logs`` there): up to
        MAX_LOGS_DATA bytes of its file from ``offset``, and the file's size."""
        ident, rank, start = ask.id, ask.rank, ask.offset
        if not self._mine(rank):
            return
        data, size = read_piece(RunLayout(self.journal.run_dir).rank_log(rank), start)
        self.journal.send(LogsMessage(ident, rank, start, data, size))

    def send_tails(self, *, exited_only: bool = False) -> None:
        """The last lines of each of this node's ranks' output go to node 0, which keeps them
        (its ``xl logs`` after the run; while it runs, node 0 asks, ``_logs``): as each rank
        exits (``exited_only``, every turn), then at this node's end what came after, so node 0
        has them even when it stopped waiting for this node's end. At most TAIL_BYTES a time."""
        layout = RunLayout(self.journal.run_dir)
        for info in self.journal.record.ranks:
            rank = info.rank
            if rank is None or (exited_only and (info.exit_code is None or rank in self.tailed)):
                continue
            path = layout.rank_log(rank)
            try:
                size = path.stat().st_size
            except OSError:
                continue
            sent = self.tailed.get(rank, 0)
            start = max(sent, size - TAIL_BYTES)
            text, _ = read_piece(path, start, TAIL_BYTES)
            self.tailed[rank] = start + len((text or "").encode("utf-8", "surrogateescape"))
            if text and start > sent:
                text = text.partition("\n")[2]  # whole lines only
            if text:
                self.journal.send_log(rank, text.encode("utf-8", "surrogateescape"))

    def _token_refused(self) -> None:
        """Node 0 refused this node's XL_TOKEN: this node can never join the run (its torchrun
        even waits in a rendezvous of its own: the id comes from the token). End its part at once
        with one line that says what is wrong and how to fix it. No failure event: the view
        prints the run's failure as its last line, and once is enough."""
        message = (
            f"node 0 ({format_address(*self.hub)}) refused this node's {TOKEN_VAR}: it is not "
            "the run's token; on this node, run the exact command node 0's 'xl launch' printed "
            f"(with its {TOKEN_VAR}=...)"
        )
        if self.cause.failure is None:
            self.cause.remote = True  # nothing goes to node 0 any more
            self.cause.set(self.cause.local(None, None, None, None, message), time.time())
        # Its rendezvous would wait for nodes that never come: end it now, not after the grace.
        self.torchrun.signal(signal.SIGTERM)
        self.stopping.begin(StopReason.FAILURE)
