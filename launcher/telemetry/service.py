"""The supervisor's side of telemetry, behind one small façade.

    t = Telemetry(run_dir, token=token, emit_event=fn)
    env = t.start()           # {"XL_COLLECTOR": "127.0.0.1:<port>", "XL_TOKEN": token}
    t.set_ranks(ranks)        # [RankInfo, ...] (roster.py)
    t.feed_log_line(rank, line)
    t.stop()

It owns the collector thread (rank frames -> metrics.jsonl), a 1 Hz thread that samples every
rank's GPU and process and runs the diagnoses, the log parser, and the spool (``spool``): records
a rank
wrote to ``<run_dir>/spool/`` while no collector was reachable are stored once that rank is
gone (a live rank replays its own spool when it reconnects).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xl import envnames, settings, wire
from xl.address import format_address
from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.events import Dropped, Emit, Event, MetricsLost, append_event
from xl.launcher.rundir.metrics import MetricsWriter
from xl.launcher.stacks.hang import HangCapture
from xl.launcher.telemetry import CollectorStatus, previous_port, write_collector_json
from xl.launcher.telemetry.collector import Collector
from xl.launcher.telemetry.diagnose import Diagnoser
from xl.launcher.telemetry.logfeed import HOLD_S, LogFeed, OutputSteps, Record
from xl.launcher.telemetry.logparse import Found
from xl.launcher.telemetry.roster import RankInfo, Roster
from xl.launcher.telemetry.sampler import Sampler
from xl.launcher.telemetry.spool import ingest_spool
from xl.launcher.telemetry.thread_errors import ThreadErrors

if TYPE_CHECKING:
    from xl.launcher.multinode.protocol import NodeMessage
    from xl.launcher.multinode.summary import Summary


class Drops:
    """Records that ranks dropped (their xl.log queue was full, or the collector refused them),
    counted from any thread and said as ``dropped`` events: one per rank and reason at most every
    5 s, so a flood of drops is one line."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._dropped_lock = threading.Lock()
        self._dropped_pending: dict[tuple[int, str], int] = {}
        self._dropped_last_emit = 0.0

    def add(self, rank: int, count: int, reason: str = "queue_full") -> None:
        with self._dropped_lock:
            key = (rank, reason)
            self._dropped_pending[key] = self._dropped_pending.get(key, 0) + count

    def flush(self, force: bool = False) -> None:
        now = time.time()
        with self._dropped_lock:
            if not self._dropped_pending or (not force and now - self._dropped_last_emit < 5):
                return
            pending, self._dropped_pending = self._dropped_pending, {}
            self._dropped_last_emit = now
        for (rank, reason), count in sorted(pending.items()):
            why = (
                "its xl.log queue was full"
                if reason == "queue_full"
                else f"the collector rejected them: {reason}"
            )
            message = f"rank {rank} dropped {count} records ({why})"
            self._emit(Dropped(now, rank, message, count, reason))


def _run_cgroup(run_dir: Path) -> str | None:
    """The run's cgroup on this node, as run.json names it (launcher/runcgroup.py)."""
    rec = record.load(run_dir)
    return rec.cgroup if rec is not None else None


class Telemetry:
    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        token: str,
        emit_event: Emit | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        advertise: str | None = None,
        sample_interval: float = 1.0,
        inventory: Callable[[], Any] | bool | None = True,
        on_node: Callable[[int, str, list[NodeMessage]], None] | None = None,
        on_node_closed: Callable[[int], None] | None = None,
        forward: Callable[[list[dict[str, Any]]], None] | None = None,
        instrumented: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.token = token
        self._emit_external = emit_event
        self._events_lock = threading.Lock()
        self.host = host
        self._port = port
        # What ranks dial. Loopback by default; a multi-node run binds a routable or wildcard
        # address and advertises this node's name (ranks elsewhere cannot dial 0.0.0.0).
        self._advertise = advertise
        self._interval = sample_interval
        self._inventory = inventory
        # Multi-node: node 0 takes the other nodes' links (on_node*); another node hands what it
        # samples, and a summary of what its ranks send each second, to ``forward`` (its link to
        # node 0), which diagnoses them: this node does not.
        self._on_node = on_node
        self._on_node_closed = on_node_closed
        self._forward = forward
        self.summary: Summary | None = None
        if forward is not None:
            from xl.launcher.multinode.summary import Summary  # noqa: PLC0415 - several nodes only: not on a one-node run's imports

            self.summary = Summary()
        self.roster = Roster()
        # What ranks print is a step only where they do not report their own (OutputSteps).
        hold = settings.number(envnames.PRINTED_HOLD_S, HOLD_S, floor=0.0)
        self.output_steps = OutputSteps(instrumented=instrumented, hold_s=hold)
        self.drops = Drops(self._emit)
        self.writer: MetricsWriter | None = None
        self.collector: Collector | None = None
        # A stall starts one capture of every rank's stacks, which names the culprit (hang.py).
        self.hang = HangCapture(self.run_dir, self._emit, self._hang_ranks)
        self.diagnoser = Diagnoser(self.hang.gate(self._emit), on_stall=self.hang.on_stall)
        self.sampler: Sampler | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.spooled_records = 0
        self._errors = ThreadErrors()
        # Rank output is parsed on a thread of its own: the supervisor's loop only queues lines.
        self.log_feed = LogFeed(self._log_found)

    # -- events ---------------------------------------------------------------------------

    def _emit(self, event: Event) -> None:
        if self._emit_external is not None:
            self._emit_external(event)
            return
        # Standalone use (tests, tools): append to events.jsonl ourselves.
        with self._events_lock:
            append_event(self.run_dir, event)

    # -- lifecycle ------------------------------------------------------------------------

    def _collector(self, port: int) -> Collector:
        assert self.writer is not None
        return Collector(
            self.writer,
            self.token,
            host=self.host,
            port=port,
            on_records=self._on_records,
            on_dropped=self.drops.add,
            on_node=self._on_node,
            on_node_closed=self._on_node_closed,
            on_event=self._emit,
        )

    def start(self) -> dict[str, str]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.writer = MetricsWriter(self.run_dir)
        port = self._port if self._port is not None else previous_port(self.run_dir)
        try:
            collector = self._collector(port)
        except OSError:
            if not port or self._port is not None:
                raise  # a port others must dial (multi-node) is not swapped for another
            # The old port is taken by someone else: ranks started from now on get the new one.
            collector = self._collector(0)
        self.collector = collector
        collector.start()
        self.sampler = Sampler(self._inventory, cgroup=_run_cgroup(self.run_dir))
        self._write_status()
        # A restarted supervisor stores what dead ranks left in the spool.
        self.ingest_spool()
        self._thread = threading.Thread(target=self._loop, name="xl-sampler", daemon=True)
        self._thread.start()
        self.log_feed.start()
        host = self._advertise
        if host is None:
            host = socket.getfqdn() if collector.host in ("0.0.0.0", "::", "") else collector.host
        return {
            envnames.COLLECTOR: format_address(host, collector.port),
            envnames.TOKEN: self.token,
        }

    def set_ranks(self, ranks: Sequence[RankInfo]) -> None:
        self.roster.set(ranks)
        for info in ranks:
            self.diagnoser.set_alive(info.rank, not info.ended)

    def feed_log_line(self, rank: int, line: str) -> None:
        """One line of rank output, parsed on the log feed's thread (any thread; never waits)."""
        if self.writer is not None:
            self.log_feed.put(rank, line)

    def wants_lines(self, text: str) -> bool:
        """Whether a line of ``text`` may be worth ``feed_log_line`` (any thread; linear)."""
        return self.writer is not None and self.log_feed.wants(text)

    def _log_found(self, rank: int, found: Found) -> None:
        if self.writer is None:
            return
        if self.collector is not None and rank in self.collector.train_ranks:
            self.output_steps.announced(rank)
            return
        self._write_printed(self.output_steps.found(rank, found, time.time()))

    def _write_printed(self, records: list[Record]) -> None:
        """Train records from what ranks printed (OutputSteps let them through), stored and
        diagnosed."""
        if records and self.writer is not None:
            self.writer.write_lines([wire.dumps_record(rec) for rec in records])
            for rec in records:
                rank = rec["rank"]
                assert isinstance(rank, int)  # OutputSteps makes each record with its rank
                if self.summary is not None:
                    self.summary.add(rank, [rec])  # node 0 diagnoses them
                else:
                    self.diagnoser.ingest(rank, [rec])

    def stop_nodes(self, stop: Mapping[str, object]) -> None:
        """Node 0: tell every other node to end its part of the run (``stop``: the reply frame's
        ``stop``, sent as it is)."""
        if self.collector is not None:
            self.collector.stop_nodes(stop)

    def stop(self) -> None:
        self._stop.set()
        self.log_feed.stop()  # every line queued is parsed first
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.hang.join(timeout=10)  # its events go out before the supervisor closes the run
        if self.collector is not None:
            self.collector.stop()
        self.ingest_spool()
        if self.summary is not None and self._forward is not None:
            rows = self.summary.take()  # the ranks' last steps
            if rows:
                self._forward(rows)
        self.drops.flush(force=True)
        with contextlib.suppress(OSError):  # a full disk: the metrics below still close and count
            self._write_status()
        if self.writer is not None:
            self.writer.close()
            self._say_metrics_lost(self.writer)

    def _say_metrics_lost(self, writer: MetricsWriter) -> None:
        """Metrics lines the disk refused for so long that they were cut from memory: one event as
        telemetry stops (docs/contracts.md, "events.jsonl"), so a gap in metrics.jsonl is
        explained."""
        if not writer.bytes_lost:
            return
        why = f" ({writer.error.strerror or writer.error})" if writer.error is not None else ""
        self._emit(
            MetricsLost(
                writer.bytes_lost,
                f"{writer.bytes_lost} bytes of metrics lines were lost while the disk refused "
                f"them{why}",
            )
        )

    # -- internals ------------------------------------------------------------------------

    def _on_records(self, rank: int, records: list[dict[str, Any]]) -> None:
        if self.collector is not None and rank in self.collector.train_ranks:
            self.output_steps.announced(rank)  # what it printed and is held is not its steps
        if self.summary is not None:
            self.summary.add(rank, records)  # node 0 diagnoses them
            return
        self.diagnoser.ingest(rank, records)

    def _rank_list(self) -> list[RankInfo]:
        return self.roster.local(self.collector, multinode=self._on_node is not None)

    def _hang_ranks(self) -> list[dict[str, Any]]:
        """This node's live ranks, and other nodes' (listed in the capture as asked there), as
        the stacks capture takes them: run.json's keys."""
        return [info.row() for info in self._rank_list() + self.roster.remote()]

    def _loop(self) -> None:
        next_status = time.monotonic() + 5
        while not self._stop.wait(self._interval):
            try:
                self._sample_once()
            except Exception as exc:  # a failed sample must never take the supervisor down
                self._errors.say(
                    "telemetry's sample failed (stall detection waits for the next one)", exc
                )
            if time.monotonic() >= next_status:
                next_status = time.monotonic() + 5
                with contextlib.suppress(Exception):
                    self._write_status()

    def _sample_once(self) -> None:
        assert self.sampler is not None and self.writer is not None
        cuda = {}
        if self.collector is not None:
            cuda = {r: p.cuda for r, p in list(self.collector.peers.items()) if p.cuda}
        records, dead = self.sampler.sample(self._rank_list(), cuda)
        if records:
            self.writer.write_lines([wire.dumps_record(r) for r in records])
            for rec in records:
                self.diagnoser.ingest(rec["rank"], [rec])
        if self._forward is not None:
            rows = self.summary.take() if self.summary is not None else []
            if records or rows:
                self._forward(records + rows)
        for rank in dead:
            self.diagnoser.set_alive(rank, False)
        self._write_printed(self.output_steps.due(time.time()))
        self.diagnoser.tick()
        if not self.diagnoser.any_stalled():
            self.hang.over()
        self.hang.quiet(*self.diagnoser.quiet_spell())  # a mismatch is named before any stall
        self.drops.flush()
        self.writer.maybe_flush()

    def _write_status(self) -> None:
        if self.collector is None:
            return
        collector = self.collector
        status = CollectorStatus(
            host=collector.host,
            port=collector.port,
            supervisor_pid=os.getpid(),
            updated=time.time(),
            address=collector.address,
            frames=collector.frames,
            records=collector.records,
            node_frames=collector.node_frames,
            rank_peers=len(collector.peers),
            duplicate_frames=collector.duplicates,
            rejects=dict(collector.rejects),
            spooled_records=self.spooled_records,
            unparsed_lines=self.log_feed.skipped,
            printed_before_training=self.output_steps.dropped,
            metrics_bytes_lost=self.writer.bytes_lost if self.writer is not None else 0,
        )
        write_collector_json(self.run_dir, status)

    def ingest_spool(self) -> int:
        """Store the spool files of rank processes that are gone; returns records stored."""
        if self.writer is None:
            return 0
        ingest = self.diagnoser.ingest if self.summary is None else self.summary.add
        stored = ingest_spool(self.run_dir, self.writer, ingest)
        self.spooled_records += stored
        return stored
