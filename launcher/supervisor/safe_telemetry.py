"""The supervisor's calls into telemetry (collector, sampler, log parsing, diagnoses), each made
safely: ``SafeTelemetry``.

Telemetry must never take the run down with it: each of its calls goes through
``SafeTelemetry``, which says what failed in supervisor.log and carries on. Without telemetry (it
did not start) the run goes on with its logs and lifecycle only.

Telemetry is imported as it starts: on one node that is after torchrun started, so its imports
(the collector, the diagnoses, the sampler: ~30 ms of CPU, 50-90 ms on a busy machine) overlap
torchrun's own start (~2 s) instead of delaying it (bench/README.md, "Launch"). The ranks must
still find the collector in their environment: ``reserve`` binds its loopback port first and
holds it (bound, not listening) until the collector listens there; a rank that dialled before
that would spool and send later, as it does whenever the collector cannot be reached.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from xl import envnames, wire
from xl.address import LOOPBACK, format_address
from xl.launcher.multinode.protocol import RecMessage, TrainMessage
from xl.launcher.rundir.events import Emit
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.runrecord import read_object
from xl.launcher.supervisor.journal import Journal, say

if TYPE_CHECKING:
    from xl.launcher.multinode.nodelink import StopCommand
    from xl.launcher.multinode.protocol import NodeMessage
    from xl.launcher.telemetry.roster import RankInfo
    from xl.launcher.telemetry.service import Telemetry

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class NodeHooks:
    """Where this node's collector listens and what it does with what the other nodes send
    (``Hub.collector_hooks`` on node 0 of several, ``forward_records`` on another node); on one
    node, none: loopback, on the port ``reserve`` holds."""

    host: str = LOOPBACK
    port: int | None = None
    advertise: str | None = None
    on_node: Callable[[int, str, list[NodeMessage]], None] | None = None
    on_node_closed: Callable[[int], None] | None = None
    forward: Callable[[Sequence[Mapping[str, object]]], None] | None = None


class SafeTelemetry:
    """Telemetry as the loop calls it: started after torchrun on one node, every call safe."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.service: Telemetry | None = None
        self.stopped = False
        self.error = ""  # why it did not start
        self._held: socket.socket | None = None  # the port reserved for the collector

    @property
    def running(self) -> bool:
        return self.service is not None and not self.stopped

    def reserve(self, run_dir: Path) -> dict[str, str]:
        """One node: hold the collector's loopback port and return the ranks' XL_COLLECTOR and
        XL_TOKEN, before telemetry is imported. The port of an earlier supervisor of this run
        (collector.json) first, as its ranks know it; else one the system picks."""
        # collector.json as xl.launcher.telemetry.previous_port reads it, read here by hand: that
        # package is not on a one-node run's path to torchrun (tests/test_import_budgets.py).
        status = read_object(RunLayout(run_dir).collector) or {}
        previous = status.get("port")
        ports = [previous, 0] if isinstance(previous, int) and 0 < previous < 65536 else [0]
        for port in ports:
            sock = socket.socket(socket.AF_INET)
            # SO_REUSEADDR on both sides: the collector's listener may bind the port this socket
            # holds; a program without it may not. Until the collector listens, nobody can.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                sock.close()
                continue
            self._held = sock
            return {
                envnames.COLLECTOR: format_address(LOOPBACK, sock.getsockname()[1]),
                envnames.TOKEN: self.token,
            }
        return {envnames.TOKEN: self.token}

    def start(
        self,
        run_dir: Path,
        emit: Emit,
        hooks: NodeHooks = NodeHooks(),
        *,
        instrumented: bool = False,
    ) -> dict[str, str]:
        """Start it (on the port ``reserve`` holds, if it holds one); returns what the ranks'
        environment needs (XL_COLLECTOR, XL_TOKEN). Its events (diagnoses, hangs, drops) reach
        ``emit`` as the values it made."""
        port = hooks.port
        if port is None and self._held is not None:
            port = self._held.getsockname()[1]
        try:
            from xl.launcher.telemetry.service import Telemetry  # noqa: PLC0415 - ~30 ms of imports that overlap torchrun's start (module docstring)

            self.service = Telemetry(
                run_dir,
                token=self.token,
                emit_event=emit,
                host=hooks.host,
                port=port,
                advertise=hooks.advertise,
                on_node=hooks.on_node,
                on_node_closed=hooks.on_node_closed,
                forward=hooks.forward,
                instrumented=instrumented,
            )
            env = dict(self.service.start())
        except Exception as exc:
            say(f"telemetry did not start: {exc!r}")
            self.error = (
                (exc.strerror if isinstance(exc, OSError) else None)
                or str(exc)
                or type(exc).__name__
            )
            self.service = None
            return {envnames.TOKEN: self.token}
        finally:
            self._release()
        env.setdefault(envnames.TOKEN, self.token)
        return env

    def _release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.close()

    def _safely(self, what: str, call: Callable[..., T], *args: Any) -> T | None:
        try:
            return call(*args)
        except Exception as exc:  # telemetry must never take the run down with it
            say(f"telemetry.{what} failed: {exc!r}")
            return None

    def set_ranks(self, ranks: list[RankInfo]) -> None:
        """Every rank it samples and diagnoses (other nodes' flagged ``remote``)."""
        if self.service is not None:
            self._safely("set_ranks", self.service.set_ranks, ranks)

    def feed_log_line(self, rank: int, line: str) -> None:
        """A line of rank output to parse (nothing while telemetry is not running)."""
        if self.service is not None:
            self._safely("feed_log_line", self.service.feed_log_line, rank, line)

    def wants_lines(self, text: str) -> bool:
        """Whether a line of ``text`` (a chunk of rank output) may be worth feeding: never while
        telemetry is not running."""
        service = self.service
        return service is not None and bool(self._safely("wants_lines", service.wants_lines, text))

    def stop_nodes(self, stop: StopCommand) -> None:
        """Node 0 of several: every other node is told to end its part of the run (the reply
        frame ``{"stop": {"reason", "failure"}}``, made here, in the loop's thread)."""
        failure = stop.failure.to_json() if stop.failure is not None else None
        frame = {"reason": "requested" if stop.requested else "failure", "failure": failure}
        if self.service is not None:
            self._safely("stop_nodes", self.service.stop_nodes, frame)

    def rank_frames(self) -> dict[int, float]:
        """When each rank's last xl.log frame reached this node's collector (unix time)."""
        collector = self.service.collector if self.service is not None else None
        if collector is None:
            return {}
        return {rank: peer.last_seen for rank, peer in list(collector.peers.items())}

    def metrics_bytes_lost(self) -> int:
        """Bytes of metrics lines a full disk made the collector cut (its ``metrics_lost``
        event)."""
        writer = self.service.writer if self.service is not None else None
        return writer.bytes_lost if writer is not None else 0

    def stop(self) -> None:
        """Flush and stop it, once."""
        self._release()
        if not self.stopped:
            self.stopped = True
            if self.service is not None:
                self._safely("stop", self.service.stop)


def forward_records(journal: Journal) -> Callable[[Sequence[Mapping[str, object]]], None]:
    """Node > 0: what its telemetry samples goes to node 0 over the link as metrics lines, and
    its ranks' summary rows (xl.launcher.multinode.summary) as ``train`` messages."""
    from xl.launcher.multinode.summary import ROWS_PER_MESSAGE  # noqa: PLC0415 - several nodes only: not on a one-node run's path to torchrun
    from xl.launcher.rundir.metrics import MetricKind  # noqa: PLC0415 - as above

    train = MetricKind.TRAIN.value  # the wire's records: their kind as the line spells it

    def forward(records: Sequence[Mapping[str, object]]) -> None:
        rows = [rec for rec in records if rec.get("kind") == train]
        for rec in records:
            rank = rec.get("rank")
            if rec.get("kind") != train and isinstance(rank, int):
                journal.send(RecMessage(rank, wire.dumps_record(rec).decode()))
        for i in range(0, len(rows), ROWS_PER_MESSAGE):
            journal.send(TrainMessage(rows[i : i + ROWS_PER_MESSAGE]))

    return forward
