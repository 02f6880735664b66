"""The sender: one daemon thread per rank process that turns queued ``xl.log`` calls into
frames and gets them to the run's collector.

It wakes ten times a second (four when torch's steps are all it sends), turns queued calls into
record lines (``xl.client.metricline``), adds a ``sys`` line once a second, and sends them in
batches over one TCP connection to ``XL_COLLECTOR`` (``xl.client.link``: the handshake, frames
and acks). A listener that cannot prove it holds the run's token gets nothing: the records wait
in the spool.

Nothing is lost and nothing is stored twice: frames stay in memory until the collector acks them
and are sent again first after a lost connection; when the collector stays out of reach for
RESEND_WAIT_S they go to the spool (``xl.client.spool``), as does everything logged meanwhile, and
are replayed on reconnect.

The thread shares the GIL with the training thread: a wake-up with nothing to say touches no
socket, and one with something sends it in one frame.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from typing import Any

from xl import envnames, settings, wire
from xl.address import split_address
from xl.client.link import Link
from xl.client.metricline import OwnTrain, StepSource, cuda_counters, drain, sys_line
from xl.client.spool import Spool
from xl.client.watch import CommWatch

MAX_QUEUE = 100_000
INTERVAL_S = 0.1
# A rank whose only lines are torch's steps (xl.integrations.torchsteps: one line per slot of a
# wall-clock grid) wakes once per slot instead, just after the slot's line is due: each wake-up
# takes the GIL and caches from the training thread on cores the ranks keep busy, and ranks that
# wake at the same grid points send their lines together. The first xl.log call brings back
# INTERVAL_S. This slot is the one a step source attached without a grid of its own gets.
STEPS_ONLY_INTERVAL_S = 0.25
# How long after a line is due the sender wakes for it (so the line is surely due by then).
WAKE_LATE_S = 0.01
SYS_INTERVAL_S = 1.0
MAX_UNACKED = 64
# Frames are cut well under the collector's cap so one batch never trips it; with at most
# MAX_UNACKED frames in flight, unacked data stays under 16 MiB.
FRAME_BUDGET = wire.MAX_FRAME // 4
# Unacked frames wait this long after a lost connection to be resent as they were (then the spool).
RESEND_WAIT_S = 5.0


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class Sender:
    """Everything the background thread owns. One instance per process (reset after fork)."""

    def __init__(self) -> None:
        self.address = split_address(os.environ.get(envnames.COLLECTOR, ""))
        node_0 = os.environ.get(envnames.COLLECTOR_NODE_0, "")
        fallback = split_address(node_0) if node_0 else None
        self.token = os.environ.get(envnames.TOKEN, "").encode()
        self.rank = _env_int("RANK", 0)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.pid = os.getpid()
        self.link = Link(self.address, self.token, self.rank, self._header, fallback)
        if fallback is not None:
            node_timeout = settings.number(envnames.NODE_TIMEOUT, 30.0, positive=True)
            self.link.ack_stale_s = min(self.link.ack_stale_s, max(1.0, node_timeout / 4))
        self.link.on_acked = self._replay_acked
        self.spool = Spool(os.environ.get(envnames.RUN_DIR), self.rank, self.pid)
        self.queue: deque[tuple[float, dict[str, object]]] = deque()
        # Overridable so tests can make the queue overflow on purpose.
        self.max_queue = max(1, _env_int(envnames.LOG_QUEUE, MAX_QUEUE))
        self.comm = CommWatch()
        self.dropped = 0
        self.own = OwnTrain()  # who sends the rank's train keys (metricline.OwnTrain)
        self.step_source: StepSource | None = None  # xl.client.attach_steps
        self.step_grid = (STEPS_ONLY_INTERVAL_S, 0.0)  # its lines' slot and hold (attach_steps)
        self.logged = False  # the last wake-up found xl.log calls queued
        self.spooled_live = False  # lines went to the spool since it was last claimed
        self.last_rate_t: dict[str, float] = {}
        self.last_sys = 0.0
        self.io_lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = False
        self.flushing = False
        self.thread = threading.Thread(target=self._run, name="xl-log", daemon=True)

    def reset_after_fork(self) -> None:
        """A forked child keeps the queue object (``log`` closures handed out append to it) but
        gets its own thread, connection, spool and counters; what the parent queued is the
        parent's."""
        self.queue.clear()
        self.comm.reset()
        self.pid = os.getpid()
        self.spool.reset_after_fork(self.pid)
        self.link.reset_after_fork()  # the parent's connection; the child must not write to it
        self.dropped = 0
        self.own, self.step_source = OwnTrain(), None  # the parent's steps are the parent's
        self.last_rate_t = {}
        self.io_lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="xl-log", daemon=True)
        self.thread.start()

    # What tests and failure messages read: the link's socket, its sequence and its unacked frames.
    @property
    def sock(self) -> socket.socket | None:
        return self.link.sock

    @property
    def unacked(self) -> deque[tuple[int, list[bytes], bool]]:
        return self.link.unacked

    @property
    def unverified(self) -> int:
        return self.link.unverified

    @property
    def seq(self) -> int:
        return self.link.seq

    # -- the background loop ----------------------------------------------------------------

    def interval(self) -> float:
        """How long the thread sleeps before its next wake-up (unless woken): INTERVAL_S while
        the script logs, else until just after the steps' next line is due (the end of the grid
        slot under way, plus the steps' hold)."""
        if self.step_source is None or self.logged:
            return INTERVAL_S
        every, hold = self.step_grid
        late = hold + WAKE_LATE_S
        now = time.time()
        return ((now - late) // every + 1) * every + late - now

    def _run(self) -> None:
        while not self.stopping:
            self.wake.wait(self.interval())
            self.wake.clear()
            try:
                with self.io_lock:
                    self.pump()
            except Exception:  # the sender must outlive any bug: training goes on
                time.sleep(INTERVAL_S)

    def pump(self) -> None:
        lines = self._drain_queue()
        now = time.monotonic()
        if now - self.last_sys >= SYS_INTERVAL_S:
            self.last_sys = now
            t = time.time()
            line = sys_line(t, self.rank, {**self.comm.summary(), **cuda_counters(self.local_rank)})
            if line is not None:
                lines.append(line)
        link = self.link
        # Connect only with something to say: a forked worker that never logs opens nothing.
        wants = lines or link.unacked or self.own.reports or self.spool.replay is not None
        if link.sock is None and wants and now >= link.next_connect:
            self._connect()
        if (
            link.sock is None
            and link.unacked
            and now - (link.disconnected_at or now) >= RESEND_WAIT_S
        ):
            self._spool_unacked()
        link.read_acks()
        link.check_stale(now)  # a frozen collector: the fallback on the next wake-up
        self._claim_live()
        if (
            link.sock is not None
            and self.spool.replay is not None
            and len(link.unacked) < MAX_UNACKED
        ):
            self._send_replay()
        if lines:
            if link.sock is not None and len(link.unacked) < MAX_UNACKED:
                self._send(lines, from_replay=False)
            else:
                self._spool(lines)

    def _drain_queue(self) -> list[bytes]:
        self.logged = bool(self.queue)
        final = self.flushing or self.stopping  # every step, even one that just ended
        out, dropped = drain(
            self.queue, self.rank, self.last_rate_t, self.own, self.step_source, final
        )
        self.dropped += dropped  # counted, so the run's events say so
        return out

    # -- transport (xl.client.link) ---------------------------------------------------------

    def _header(self, seq: int) -> dict[str, Any]:
        header: dict[str, Any] = {
            "v": wire.VERSION,
            "rank": self.rank,
            "pid": self.pid,
            "seq": seq,
            "dropped": self.dropped,
        }
        if self.own.reports:
            header["train"] = True
        if self.flushing:
            header["ack"] = True
        return header

    def _connect(self) -> None:
        if not self.link.connect():
            return
        if self.own.reports:
            self.link.send([], False)  # hello: the collector learns this rank logs itself
        self.spool.claim()

    def _claim_live(self) -> None:
        """Lines spooled since the last claim (while connected with MAX_UNACKED frames in
        flight, or while a replay was going on) are replayed once the replay before them is
        done, not at the next reconnect, which may never come."""
        if self.link.sock is not None and self.spooled_live and self.spool.replay is None:
            self.spooled_live = False
            self.spool.claim()

    def _send_replay(self) -> None:
        spool = self.spool
        lines = spool.replay_lines()
        if lines is None:
            return
        pending = lines[spool.replay_sent :]
        if not pending and not any(r for _, _, r in self.link.unacked):
            spool.finish_replay()
            return
        if pending:
            self._send(pending, from_replay=True)
            if self.link.sock is not None:
                spool.replay_sent = len(lines)

    def _send(self, lines: list[bytes], *, from_replay: bool) -> None:
        link = self.link
        for chunk in _chunks(lines):
            if link.sock is None:
                if not from_replay:
                    self._spool(chunk)
                continue
            link.send(chunk, from_replay)

    def _replay_acked(self) -> None:
        # Once all sent: a file claimed while frames waited (a frozen collector) is not done yet.
        spool = self.spool
        if (
            spool.replay is not None
            and spool.all_sent()
            and not any(r for _, _, r in self.link.unacked)
        ):
            spool.finish_replay()

    def _spool_unacked(self) -> None:
        # Unacked live frames go to the spool; unacked replay lines are still in the replay
        # file and are sent again from the last fully acked position.
        pending = self.link.take_unacked()
        live = [line for _, chunk, from_replay in pending if not from_replay for line in chunk]
        self.spool.rewind(sum(len(chunk) for _, chunk, r in pending if r))
        if live:
            self._spool(live)

    def _spool(self, lines: list[bytes]) -> None:
        self.spooled_live = True
        if not self.spool.append(lines):
            self.dropped += len(lines)

    # -- flushing ----------------------------------------------------------------------------

    def flush(self, timeout: float) -> bool:
        """Send everything queued and wait (bounded) for the collector's acks."""
        deadline = time.monotonic() + max(0.0, timeout)
        if not self.io_lock.acquire(timeout=max(0.0, timeout)):
            return False
        try:
            self.flushing = True  # frames sent now ask for their ack at once
            self.last_sys = 0.0  # include the last comm waits / CUDA counters
            link = self.link
            sent_before = link.seq
            self.pump()
            if link.sock is not None and link.unacked and link.seq == sent_before:
                link.send([], False)  # a ping: acks everything before it
            while (
                link.unacked or self.spool.replay is not None or self.spooled_live
            ) and link.sock is not None:
                if time.monotonic() >= deadline:
                    break
                link.read_acks(wait=max(0.01, min(0.5, deadline - time.monotonic())))
                self._claim_live()
                if self.spool.replay is not None and link.sock is not None:
                    self._send_replay()
            # Stored means acked: nothing unacked, queued or waiting in the spool, and nothing
            # ever dropped (a dropped record is one logged and never stored).
            return (
                not link.unacked
                and not self.queue
                and not self.spool.pending()
                and not self.dropped
            )
        finally:
            self.flushing = False
            self.io_lock.release()

    def shutdown(self, timeout: float) -> None:
        self.flush(timeout)
        with self.io_lock:
            self.stopping = True
            if self.link.sock is not None:
                self.link.disconnect()
            if self.link.unacked:
                # Still unacked at exit: the spool keeps it for the supervisor.
                self._spool_unacked()
            leftover = self._drain_queue()
            if leftover:
                self._spool(leftover)


def _chunks(lines: list[bytes]) -> list[list[bytes]]:
    # Records over the collector's per-record cap were already cut out by train_line.
    chunks: list[list[bytes]] = []
    current: list[bytes] = []
    size = 0
    for line in lines:
        if current and size + len(line) + 1 > FRAME_BUDGET:
            chunks.append(current)
            current, size = [], 0
        current.append(line)
        size += len(line) + 1
    if current:
        chunks.append(current)
    return chunks
