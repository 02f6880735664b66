"""The collector: one thread in the supervisor that receives every rank's ``xl.log`` frames.

Its sockets are ``xl.launcher.telemetry.server``'s; this module decides what a frame means.
Every connection first proves the run's token (``xl.handshake``, in the server), then every frame
is validated (header types, every record); a bad frame or record is dropped and counted under its
reason. After a frame's good records are appended, the collector acks the frame's sequence number
so the client can forget it; unacked frames are resent after a reconnect (same sequence numbers)
or spooled by the client, and a frame whose sequence number this rank process already had stored
is acked without being stored again (nothing lost, nothing twice).

On node 0 of a multi-node run it also takes node frames from the other nodes' supervisors
(xl.launcher.multinode.nodelink): their sampled records and their ranks' summary rows
(``train``) are stored here like a rank's records, the rest goes to ``on_node`` for the
supervisor, and ``stop_nodes`` tells every node to end its part of the run.
A node link whose handshake proves a wrong token (a node started with a mistyped XL_TOKEN) is
answered REFUSED, so that node can say why and stop; ``on_node`` gets ``[RefusedMessage]``
for it, with the node number it claimed and the address the kernel gave, never text of
its own. A node's ``host`` (from a peer that proved the token) is recorded with its control
characters drawn (xl.textsafe).

``ask_nodes`` asks every connected node for its ranks' stacks, ``ask_logs`` one node for a piece
of a rank's output (``NodeAsks``); node 0's ``xl stacks``, ``xl logs`` and hang
capture reach them through the socket of xl.launcher.stacks.nodes, opened here.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xl import handshake, wire
from xl.launcher.multinode.protocol import (
    LogsMessage,
    NodeMessage,
    RecMessage,
    RefusedMessage,
    StacksMessage,
    TrainMessage,
    parse_message,
    reply,
)
from xl.launcher.rundir.events import Emit, EventKind, Notice
from xl.launcher.rundir.metrics import MetricKind, MetricsWriter
from xl.launcher.stacks.nodes import NodesStacksServer
from xl.launcher.telemetry.server import ACK, IDLE_S, Conn, FrameServer
from xl.textsafe import visible

__all__ = ["ACK", "IDLE_S", "Collector", "PeerInfo"]

# Rank processes whose last stored sequence number is kept (for resent frames); the oldest go.
MAX_SEQ_KEYS = 1 << 16
# A frame's records are the wire's (xl.wire), not rows read back: their kind is matched as the
# line spells it, MetricKind's value.
_TRAIN = MetricKind.TRAIN.value


# edge: another node's rows as its link sent them, each made a metrics.jsonl line
def checked_rows(
    rows: Sequence[Mapping[str, object]], rejects: Counter[str]
) -> list[tuple[int, bytes, dict[str, Any]]]:
    """Another node's summary rows (a ``train`` message): each one a metrics.jsonl train line,
    checked as a rank's line is; a bad row is counted in ``rejects`` and the others kept."""
    out = []
    for row in rows:
        try:
            rank = row.get("rank")
            if type(rank) is not int:
                raise wire.FrameError("bad_rank")
            line = json.dumps(row, separators=(",", ":"), allow_nan=False).encode()
            out.append((rank, line, wire.parse_record(line, rank)))
        except wire.FrameError as exc:
            rejects[exc.reason] += 1
        except (ValueError, TypeError):
            rejects["bad_value"] += 1
    return out


# The node gets a little less time than its requester, for the answer to travel.
_TRAVEL_S = 0.7


@dataclass
class _Ask:
    """One request to the other nodes: who was asked, what came back."""

    what: str  # "stacks" or "logs"
    ask: dict[str, Any]
    node: int | None = None  # None: every node
    asked: set[int] | None = None  # set by the collector's thread once it is sent
    answers: dict[int, StacksMessage | LogsMessage] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)


class NodeAsks(FrameServer):
    """Node 0 asking the other nodes over their links: their ranks' stacks, a piece of a rank's
    output. A request goes out as a reply frame on the nodes' links, the nodes
    answer with ``stacks`` / ``logs`` messages (xl.launcher.multinode.protocol), which
    ``_node_frame`` hands to ``_answered``; the asking thread waits until every node asked has
    answered or its deadline passed."""

    def _asks_init(self) -> None:
        self._asks_lock = threading.Lock()
        self._asks: dict[str, _Ask] = {}

    def _ask(
        self, what: str, body: dict[str, Any], node: int | None, timeout: float
    ) -> tuple[dict[int, StacksMessage | LogsMessage], list[int]]:
        # a request's name, no secret: secrets' imports cost the supervisor's start ~5 ms
        ident = os.urandom(8).hex()
        deadline = time.monotonic() + timeout
        ask = _Ask(what, {"id": ident, **body}, node)
        with self._asks_lock:
            self._asks[ident] = ask
        self._wake(b"s")
        try:
            ask.done.wait(max(0.0, deadline - time.monotonic()))
        finally:
            with self._asks_lock:
                self._asks.pop(ident, None)
                answers, asked = dict(ask.answers), sorted(ask.asked or ())
        return answers, asked

    # edge: the stacks entries as the nodes' links answered, handed to the stacks document
    def ask_nodes(self, rank: int | None, timeout: float) -> tuple[list[dict[str, Any]], list[int]]:
        """Every connected node's answer to a stacks request within ``timeout`` (any thread): the
        entries, and the nodes asked."""
        body = {"rank": rank, "timeout": round(max(0.2, timeout - _TRAVEL_S), 2)}
        answers, asked = self._ask("stacks", body, None, timeout)
        entries = [
            {**e, "node_rank": node}
            for node in sorted(answers)
            if isinstance(answer := answers[node], StacksMessage)
            for e in answer.ranks
        ]
        return entries, asked

    # edge: the logs message as the node's link answered, handed to `xl logs`
    def ask_logs(self, rank: int, node: int, offset: int, timeout: float) -> dict[str, Any] | None:
        """A piece of ``rank``'s output from ``node`` (its ``logs`` message: ``data`` from
        ``offset``, ``size``), or None when that node is not connected or did not answer in
        time (any thread)."""
        answers, _ = self._ask("logs", {"rank": rank, "offset": offset}, node, timeout)
        answer = answers.get(node)
        return answer.to_json() if isinstance(answer, LogsMessage) else None

    def _deliver_asks(self) -> None:
        if not self._asks:
            return
        with self._asks_lock:
            fresh = [a for a in self._asks.values() if a.asked is None]
        for a in fresh:
            nodes: set[int] = set()
            for conn in self._conns():
                if conn.node is not None and a.node in (None, conn.node):
                    nodes.add(conn.node)
                    conn.out += reply({a.what: a.ask})
                    self._flush_out(conn)
            with self._asks_lock:
                a.asked = nodes  # answers are read on this thread too: none came in meanwhile
            if not nodes:
                a.done.set()  # no node to ask

    def _answered(self, node: int, msg: StacksMessage | LogsMessage) -> None:
        with self._asks_lock:
            ask = self._asks.get(msg.id)
            if ask is None or ask.asked is None or node not in ask.asked:
                return  # too late, or not asked
            what = "logs" if isinstance(msg, LogsMessage) else "stacks"
            if what != ask.what or (isinstance(msg, LogsMessage) and msg.rank != ask.ask["rank"]):
                return
            ask.answers[node] = msg
            if set(ask.answers) >= ask.asked:
                ask.done.set()


@dataclass
class PeerInfo:
    rank: int
    pid: int
    last_seen: float
    dropped: int = 0
    cuda: dict[str, float] | None = None


class Collector(NodeAsks):
    """Receive frames on ``host:port`` and append good records through ``writer``.

    ``on_records(rank, records)`` gets the parsed records of each frame (for diagnoses);
    ``on_dropped(rank, count, reason)`` is called when a client reports records it had to drop
    (reason ``queue_full``) and when an authenticated rank sends records that fail validation
    (reason: the reject counter), so a rank's lost records always reach the run's events.
    """

    def __init__(
        self,
        writer: MetricsWriter,
        token: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        on_records: Callable[[int, list[dict[str, Any]]], None] | None = None,
        on_dropped: Callable[[int, int, str], None] | None = None,
        on_node: Callable[[int, str, list[NodeMessage]], None] | None = None,
        on_node_closed: Callable[[int], None] | None = None,
        on_event: Emit | None = None,
        idle_s: float = IDLE_S,
    ) -> None:
        super().__init__(writer, host, port, idle_s, token.encode())
        self._on_event = on_event
        self._rank_seq: dict[tuple[int, int], int] = {}  # (rank, pid) -> the last seq stored
        self.duplicates = 0
        self._on_records = on_records
        self._on_dropped = on_dropped
        self._on_node = on_node
        self._on_node_closed = on_node_closed
        self.frames = 0
        self.node_frames = 0
        self._node_seq: dict[tuple[int, int], int] = {}
        self._node_stop: Mapping[str, object] | None = None
        self.records = 0
        self.peers: dict[int, PeerInfo] = {}
        self.train_ranks: set[int] = set()
        self._asks_init()
        self._stacks_server: NodesStacksServer | None = None

    def start(self) -> None:
        super().start()
        if self._on_node is not None:  # node 0 of several: its other nodes' stacks
            server = NodesStacksServer(self.writer.path.parent, self.ask_nodes, self.ask_logs)
            try:
                server.open()
            except OSError:
                self.rejects["stacks_door"] += 1  # xl stacks then names those ranks as not asked
            else:
                self._stacks_server = server

    def stop(self) -> None:
        if self._stacks_server is not None:
            self._stacks_server.close()
        super().stop()

    def _hello(self, conn: Conn, hello: handshake.Hello) -> None:
        conn.role, conn.who = hello.role, hello.who
        if not hello.ok and hello.role == handshake.ROLE_NODE and self._on_node is not None:
            # A node with another token: say so (once per connection; its number and address only).
            refused = RefusedMessage("bad_token", conn.peer)
            try:
                self._on_node(hello.who, "", [refused])
            except Exception:
                self.rejects["internal_error"] += 1

    def _listener_event(self, kind: EventKind, message: str) -> None:
        if self._on_event is not None:
            with contextlib.suppress(Exception):
                self._on_event(Notice(kind, message, time.time()))

    # -- rank frames ------------------------------------------------------------------------

    def _frame(
        self, payload: bytes, lines: list[bytes], conn: Conn | None = None
    ) -> tuple[int, bool] | None:
        """Validate one frame; append its good record lines to ``lines``.

        Returns (seq, ack at once) for a rank's frame to ack, None for a rejected one or a node
        frame (answered here)."""
        head, body = wire.split_payload(payload)
        try:
            header = wire.parse_header(head)
        except wire.FrameError as exc:
            self.rejects[exc.reason] += 1
            return None
        if conn is not None and (conn.role == handshake.ROLE_NODE) != isinstance(
            header, wire.NodeHeader
        ):
            # A rank's connection sending node frames, or the reverse.
            self.rejects["wrong_role"] += 1
            return None
        if isinstance(header, wire.NodeHeader):
            if conn is not None and header.node != conn.who:
                self.rejects["wrong_node"] += 1
            elif conn is not None and self._on_node is not None:
                self._node_frame(conn, header, body, lines)
            else:
                self.rejects["unexpected_node"] += 1
            return None
        if conn is not None and header.rank != conn.who:
            self.rejects["wrong_rank"] += 1  # a rank proved the token as another rank
            return None
        if self._stored_before(header):
            return header.seq, header.ack_now  # resent after a lost ack: acked, not stored twice
        self.frames += 1
        good: list[dict[str, Any]] = []
        for line in body:
            try:
                rec = wire.parse_record(line, header.rank)
            except wire.FrameError as exc:
                self.rejects[exc.reason] += 1
                if self._on_dropped is not None:
                    with contextlib.suppress(Exception):
                        self._on_dropped(header.rank, 1, exc.reason)
                continue
            lines.append(line)
            good.append(rec)
        self.records += len(good)
        self._note_peer(header, good)
        return header.seq, header.ack_now

    def _stored_before(self, header: wire.Header) -> bool:
        key = (header.rank, header.pid)
        last = self._rank_seq.pop(key, 0)  # popped and put back: the dict stays oldest-first
        self._rank_seq[key] = max(last, header.seq)
        if len(self._rank_seq) > MAX_SEQ_KEYS:
            del self._rank_seq[next(iter(self._rank_seq))]
        if header.seq <= last:
            self.duplicates += 1
            return True
        return False

    def _note_peer(self, header: wire.Header, good: list[dict[str, Any]]) -> None:
        peer = self.peers.get(header.rank)
        if peer is None or peer.pid != header.pid:
            peer = PeerInfo(header.rank, header.pid, time.time())
            self.peers[header.rank] = peer
        peer.last_seen = time.time()
        if header.rank not in self.train_ranks and (
            header.train or any(rec.get("kind") == _TRAIN for rec in good)
        ):
            # The rank reports its own train records (its client's OwnTrain, on the wire as the
            # header's "train"): decided here only; what it prints is then not its steps.
            self.train_ranks.add(header.rank)
        if header.cuda is not None:
            peer.cuda = header.cuda
        if header.dropped > peer.dropped:
            delta = header.dropped - peer.dropped
            peer.dropped = header.dropped
            if self._on_dropped is not None:
                with contextlib.suppress(Exception):
                    self._on_dropped(header.rank, delta, "queue_full")
        if good and self._on_records is not None:
            try:
                self._on_records(header.rank, good)
            except Exception:  # a diagnosis bug must not cost the peer its connection
                self.rejects["internal_error"] += 1

    # -- node links (multi-node, node 0) ----------------------------------------------------

    def _node_frame(
        self, conn: Conn, header: wire.NodeHeader, body: list[bytes], lines: list[bytes]
    ) -> None:
        conn.node = header.node
        host = visible(header.host)
        key = (header.node, header.pid)
        # A frame resent after a reconnect that was stored already is only acked again.
        if header.seq > self._node_seq.get(key, 0):
            self._node_seq[key] = header.seq
            self.node_frames += 1
            msgs: list[NodeMessage] = []
            for raw in body:
                try:
                    msg = parse_message(json.loads(raw), header.node)
                    if isinstance(msg, (StacksMessage, LogsMessage)):
                        self._answered(header.node, msg)
                        continue
                    if isinstance(msg, RecMessage):
                        line = msg.line.encode()
                        rank = msg.rank
                        self._node_records([(rank, line, wire.parse_record(line, rank))], lines)
                        continue
                    if isinstance(msg, TrainMessage):
                        self._node_records(checked_rows(msg.rows, self.rejects), lines)
                        continue
                except wire.FrameError as exc:
                    self.rejects[exc.reason] += 1
                    continue
                except (ValueError, UnicodeError):
                    self.rejects["bad_json"] += 1
                    continue
                msgs.append(msg)
            assert self._on_node is not None
            try:
                self._on_node(header.node, host, msgs)
            except Exception:
                self.rejects["internal_error"] += 1
        conn.out += reply({"ack": header.seq})
        if self._node_stop is not None and not conn.stop_sent:
            conn.stop_sent = True
            conn.out += reply({"stop": self._node_stop})
        self._flush_out(conn)

    def _node_records(
        self, checked: list[tuple[int, bytes, dict[str, Any]]], lines: list[bytes]
    ) -> None:
        """Metrics lines another node sent, checked as a rank's: stored and diagnosed here."""
        for rank, line, rec in checked:
            lines.append(line)
            self.records += 1
            if self._on_records is not None:
                self._on_records(rank, [rec])

    def stop_nodes(self, stop: Mapping[str, object]) -> None:
        """Tell every node (connected now or later) to end its part of the run; any thread."""
        if self._node_stop is not None:
            return
        self._node_stop = stop
        self._wake(b"n")

    def _tick_done(self) -> None:
        if self._node_stop is not None:
            self._deliver_stop()
        self._deliver_asks()

    def _deliver_stop(self) -> None:
        for conn in self._conns():
            if conn.node is not None and not conn.stop_sent:
                conn.stop_sent = True
                conn.out += reply({"stop": self._node_stop})
                self._flush_out(conn)

    def _closed(self, conn: Conn) -> None:
        if conn.node is not None and self._on_node_closed is not None:
            node, conn.node = conn.node, None
            with contextlib.suppress(Exception):
                self._on_node_closed(node)
