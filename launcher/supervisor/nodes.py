"""This node's place among the run's nodes: alone, node 0 of several (``Hub``: its view of the
others) or another node (``Follower``: what node 0 says, over its link). The loop asks the same
of it on every node; alone, it has nothing to do.

Only several nodes import more (xl.launcher.multinode, the hub, the follower): none of it is on
a one-node run's path to torchrun.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from xl import envnames
from xl.launcher.multinode.protocol import EndMessage, FailureMessage
from xl.launcher.rundir.rows import RankRow
from xl.launcher.rundir.runrecord import RunRecord, RunStatus
from xl.launcher.supervisor.failure import RootCause
from xl.launcher.supervisor.journal import Journal, say
from xl.launcher.supervisor.logsink import LogSink
from xl.launcher.supervisor.safe_telemetry import NodeHooks, SafeTelemetry, forward_records
from xl.launcher.supervisor.stopping import Stopping, StopReason
from xl.launcher.supervisor.torchrun import Torchrun

if TYPE_CHECKING:  # several nodes only
    from xl.launcher.multinode.envcheck import Judge
    from xl.launcher.multinode.nodelink import NodeLink
    from xl.launcher.supervisor.follower import Follower
    from xl.launcher.supervisor.hub import Hub

_LINK_CLOSE_S = 3.0
_ENV_POLL_S = 0.1
# Node 0, its launch stopped by the nodes' environments: how long it waits for the other nodes to
# end their part (they were told) before its collector closes.
_ENV_TOLD_S = 10.0


def resolve(
    record: RunRecord, token: str, host: str
) -> tuple[tuple[str, int] | None, str, NodeLink | None]:
    """Node 0's collector address (None: one node, or no view of the others), the run's token,
    and a node > 0's link to node 0 (made, not started)."""
    if record.nnodes < 2:
        return None, token, None
    from xl.launcher.supervisor.hub import resolve_hub  # noqa: PLC0415 - several nodes only: not on a one-node run's path to torchrun

    address, token = resolve_hub(record, token)
    if address is None or record.node_rank == 0:
        return address, token, None
    from xl.launcher.multinode.nodelink import NodeLink  # noqa: PLC0415 - several nodes only: not on a one-node run's path to torchrun

    return address, token, NodeLink(*address, token, record.node_rank, host)


class Nodes:
    """The other nodes as the loop sees them: ``hub`` on node 0 of several, ``follower`` on
    another node, neither when the run has one node (or no view of the others)."""

    def __init__(self, hub: Hub | None = None, follower: Follower | None = None) -> None:
        self.hub, self.follower = hub, follower
        self.env: Judge | None = None  # node 0 of several: its verdicts on the nodes' fingerprints

    @classmethod
    def of(
        cls,
        address: tuple[str, int] | None,
        record: RunRecord,
        journal: Journal,
        cause: RootCause,
        stopping: Stopping,
        sink: LogSink,
        torchrun: Torchrun,
    ) -> Nodes:
        if address is None:
            return cls()
        if journal.link is not None:
            from xl.launcher.supervisor.follower import Follower  # noqa: PLC0415 - several nodes only: not on a one-node run's path to torchrun

            return cls(follower=Follower(address, journal.link, journal, cause, stopping, torchrun))
        from xl.launcher.supervisor.hub import Hub  # noqa: PLC0415 - node 0 of several only: not on a one-node run's path to torchrun

        return cls(hub=Hub(address, record.nnodes, journal, cause, stopping, sink))

    @property
    def alone(self) -> bool:
        return self.hub is None and self.follower is None

    # ---------------------------------------------------------------- before torchrun starts
    def link(self) -> None:
        """Node > 0: its link to node 0 starts, its fingerprint the first message (node 0
        compares every node's before any rank starts: ``check_env``)."""
        if self.follower is None:
            return
        from xl.launcher.multinode import envcheck  # noqa: PLC0415 - several nodes only

        try:
            fingerprint = envcheck.gather_here(self.follower.journal.record)
        except Exception as exc:  # a probe that breaks: node 0 compares the others without it
            say(f"this node's fingerprint could not be taken: {exc!r}")
        else:
            self.follower.link.send(envcheck.message(fingerprint))
        self.follower.link.start()

    def telemetry_hooks(self, journal: Journal) -> NodeHooks:
        """Where this node's collector listens and what it does with what nodes send."""
        if self.hub is not None:
            return self.hub.collector_hooks()
        if self.follower is not None:
            return NodeHooks(forward=forward_records(journal))
        return NodeHooks()

    def telemetry_failed(self, telemetry: SafeTelemetry) -> None:
        """Node 0's collector is a must: every node sends to it."""
        if telemetry.service is None and self.hub is not None:
            raise RuntimeError(self.hub.collector_failed(telemetry.error))

    def ranks_env(
        self, rdzv: str, stop_came: Callable[[float], bool], telemetry: SafeTelemetry
    ) -> dict[str, str]:
        """Node > 0: its ranks send their xl.log frames to this node's own collector (loopback),
        whose summary goes to node 0 over the link, and know node 0's collector for when this
        supervisor is gone or frozen (``XL_COLLECTOR_NODE_0``); without a collector here, to
        node 0's straight. And it waits for node 0's rendezvous
        (``Follower.wait_for_node_0``). Node 0 compares the nodes' environments first
        (``check_env``)."""
        if self.hub is not None:
            self.check_env(stop_came, telemetry)
        if self.follower is None:
            return {}
        from xl.launcher.multinode.join import format_address  # noqa: PLC0415 - several nodes only

        node_0 = format_address(*self.follower.hub)
        env = (
            {envnames.COLLECTOR_NODE_0: node_0}
            if telemetry.running
            else {envnames.COLLECTOR: node_0}
        )
        self.follower.wait_for_node_0(rdzv, stop_came)
        return env

    def check_env(self, stop_came: Callable[[float], bool], telemetry: SafeTelemetry) -> None:
        """Node 0, before torchrun starts (no rank anywhere starts before it does: it serves the
        rendezvous): wait for every other node to join, up to XL_NODE_TIMEOUT (a node that cannot
        reach this collector trains on all the same; one that joins later is judged as it comes,
        ``poll``), and compare their fingerprints with this node's. A difference that breaks the
        run ends it here (unless --allow-env-diff), and the other nodes are told first."""
        from xl.launcher.multinode import envcheck  # noqa: PLC0415 - node 0 of several only
        from xl.launcher.supervisor.hub import ended, joined, never_joined  # noqa: PLC0415 - node 0 of several only

        hub = self.hub
        assert hub is not None
        try:
            self.env = envcheck.Judge(envcheck.gather_here(hub.journal.record))
        except Exception as exc:  # a probe that breaks: no comparison, the run goes as before
            say(f"this node's fingerprint could not be taken, the nodes are not compared: {exc!r}")
            return
        deadline = time.monotonic() + hub.timeout
        while len(joined(hub.nodes)) < hub.nnodes - 1 and time.monotonic() < deadline:
            if stop_came(_ENV_POLL_S):  # the loop ends the run as stopped
                never = [n for n in range(1, hub.nnodes) if n not in joined(hub.nodes)]
                if not hub.never_said:  # said once, here or as the loop ends
                    hub.never_said = True
                    hub.journal.emit(never_joined(never))
                return
            hub.poll()
        if not self._judge_env(telemetry):
            return
        came, deadline = joined(hub.nodes), time.monotonic() + _ENV_TOLD_S
        while not ended(hub.nodes, came) and time.monotonic() < deadline:  # they hear it first
            stop_came(_ENV_POLL_S)
            hub.poll()

    def _judge_env(self, telemetry: SafeTelemetry) -> bool:
        """Node 0's verdict on the fingerprints so far: the differences not said before become
        events, run.json's and the run dir's records are brought up to date, and a new one that
        breaks the run ends it (True)."""
        from xl.launcher.multinode import envcheck  # noqa: PLC0415 - node 0 of several only
        from xl.launcher.supervisor.hub import fingerprints  # noqa: PLC0415 - node 0 of several only

        hub, judge = self.hub, self.env
        assert hub is not None and judge is not None
        verdict, prints, new = judge.run(fingerprints(hub.nodes), hub.nnodes)
        for event in new:
            hub.journal.emit(event)
        hub.journal.record.update(**{envcheck.RECORD_KEY: verdict.to_json()})
        hub.journal.changed()
        try:
            envcheck.write(hub.journal.run_dir, prints)
        except OSError as exc:
            say(f"the nodes' fingerprints could not be written: {exc}")
        stops = any(e.severity == "stop" for e in new)
        allowed = hub.journal.record.spec.get("allow_env_diff")
        if not stops or allowed or hub.stopping.current is not None:
            return False
        failure = hub.cause.local(None, None, None, None, verdict.failure_message())
        hub.cause.set(failure, time.time())
        hub.stopping.begin(StopReason.FAILURE)
        self.tell(telemetry)
        return True

    # ---------------------------------------------------------------- each turn
    def poll(self, telemetry: SafeTelemetry) -> bool:
        """What the other nodes (or node 0) said since the last turn; True when another node's
        ranks changed."""
        if self.follower is not None:
            self.follower.poll()
            return False
        if self.hub is None:
            return False
        changed = self.hub.poll()
        from xl.launcher.supervisor.hub import fingerprints  # noqa: PLC0415 - node 0 of several only

        if self.env is not None and self.env.waiting(fingerprints(self.hub.nodes)):
            self._judge_env(telemetry)  # a node that joined late
        self.hub.check_nodes(telemetry.rank_frames)
        return changed

    def tell(self, telemetry: SafeTelemetry) -> None:
        """Node 0 of several: once the run stops or fails, the other nodes are told (once)."""
        stop = self.hub.tell_nodes() if self.hub is not None else None
        if stop is not None:
            telemetry.stop_nodes(stop)

    def busy(self) -> bool:
        """Another node is heard from and still has ranks running."""
        return self.hub is not None and self.hub.busy()

    def pending(self) -> bool:
        """Node 0, its own ranks done: it still waits for another node's end."""
        return self.hub is not None and self.hub.pending()

    def remote_ranks(self) -> list[RankRow]:
        """The other nodes' rows of run.json, as their links sent them."""
        return self.hub.remote_ranks() if self.hub is not None else []

    # ---------------------------------------------------------------- the end
    def settle(self, status: RunStatus) -> None:
        if self.hub is not None:
            self.hub.settle(status)

    def end(self, status: RunStatus, cause: RootCause) -> None:
        """Node > 0: node 0 hears this node's end (with its own failure, after the last lines of
        its ranks' output), and takes its last records within _LINK_CLOSE_S."""
        if self.follower is None:
            return
        link = self.follower.link
        self.follower.send_tails()
        at = cause.at or time.time()
        failure = cause.failure if not cause.remote else None
        link.send(EndMessage(status, None if failure is None else FailureMessage(failure, at), at))
        if not link.close(_LINK_CLOSE_S):
            say("node 0 did not take this node's last records; they are here")
