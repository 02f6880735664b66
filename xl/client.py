"""The training-script side of telemetry: ``xl.log``, ``xl.watch``, ``xl.flush``.

``xl.log(**scalars)`` appends ``(time, scalars)`` to a bounded deque and returns: no I/O, no
locks, no conversion on the training thread. A daemon thread wakes ten times a second, turns
queued calls into records (reading 0-d tensors with ``.item()`` there, so the training thread
never waits for the device), computes samples/s and tokens/s, and sends them in batches over
one TCP connection to the run's collector (``XL_COLLECTOR``), each frame carrying ``XL_TOKEN``.

Nothing is lost: frames stay in memory until the collector acks them; when it can't be reached
they are appended to ``$XL_RUN_DIR/spool/rank-<rank>-<pid>.jsonl`` and replayed on reconnect
(or stored by the supervisor once this process is gone). If the queue ever fills because the
sender is starved, calls are dropped and counted, and the count reaches the run's events.

Outside an xl run (no ``XL_COLLECTOR``) every function is a no-op that costs a function call.
torch is never imported here: tensors are recognised by their ``item``/``ndim`` attributes.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import select
import socket
import sys
import threading
import time
from collections import deque
from typing import Any

from xl import wire

__all__ = ["active", "announce", "flush", "log", "watch"]

MAX_QUEUE = 100_000
INTERVAL_S = 0.1
SYS_INTERVAL_S = 1.0
EXIT_WAIT_S = 2.0
MAX_UNACKED = 64
# Frames are cut well under the collector's cap so one batch never trips it; with at most
# MAX_UNACKED frames in flight, unacked data stays under 16 MiB.
FRAME_BUDGET = wire.MAX_FRAME // 4
_ACK_SIZE = 8


def _env_active() -> bool:
    return bool(os.environ.get("XL_COLLECTOR")) and bool(os.environ.get("XL_TOKEN"))


class _Sender:
    """Everything the background thread owns. One instance per process (reset after fork)."""

    def __init__(self) -> None:
        env = os.environ
        host, _, port = env.get("XL_COLLECTOR", "").rpartition(":")
        self.address = (host.strip("[]") or "127.0.0.1", int(port) if port.isdigit() else 0)
        self.token = env.get("XL_TOKEN", "")
        try:
            self.rank = int(env.get("RANK", "0"))
        except ValueError:
            self.rank = 0
        try:
            self.local_rank = int(env.get("LOCAL_RANK", "0"))
        except ValueError:
            self.local_rank = 0
        run_dir = env.get("XL_RUN_DIR")
        self.pid = os.getpid()
        # Plain strings, not pathlib: keeps ``import xl.client`` light in every rank.
        self.spool = (
            os.path.join(run_dir, "spool", f"rank-{self.rank}-{self.pid}.jsonl")
            if run_dir
            else None
        )
        self.queue: deque[tuple[float, dict[str, Any]]] = deque()
        try:  # overridable so tests can make the queue overflow on purpose
            self.max_queue = max(1, int(env.get("XL_LOG_QUEUE", MAX_QUEUE)))
        except ValueError:
            self.max_queue = MAX_QUEUE
        self.waits: deque[tuple[float, float]] = deque(maxlen=100_000)
        # xl.watch state: buckets handed to the all-reduce and not done yet, and since when
        # (perf_counter) the oldest of them waits. A hung rank's peers show a growing wait.
        self.watching = False
        self.pending_lock = threading.Lock()
        self.pending_count = 0
        self.pending_since: float | None = None
        self.dropped = 0
        self.owns_train = False
        self.seq = 0
        self.sock: socket.socket | None = None
        self.next_connect = 0.0
        self.backoff = 0.2
        self.unacked: deque[tuple[int, list[bytes], bool]] = deque()
        self.ack_buf = b""
        self.replay: str | None = None
        self.replay_sent = 0
        self.last_rate_t: dict[str, float] = {}
        self.last_sys = 0.0
        self.io_lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = False
        self.flushing = False
        self.thread = threading.Thread(target=self._run, name="xl-log", daemon=True)

    def reset_after_fork(self) -> None:
        self.queue.clear()
        self.waits.clear()
        self.watching = False
        self.pending_count, self.pending_since = 0, None
        self.pid = os.getpid()
        if self.spool is not None:
            self.spool = os.path.join(
                os.path.dirname(self.spool), f"rank-{self.rank}-{self.pid}.jsonl"
            )
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()  # the parent's connection; the child must not write to it
        self.sock = None
        self.unacked.clear()
        self.replay, self.replay_sent = None, 0
        self.dropped = 0
        self.seq = 0
        self.owns_train = False
        self.last_rate_t = {}
        self.io_lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="xl-log", daemon=True)
        self.thread.start()

    # -- the background loop ----------------------------------------------------------------

    def _run(self) -> None:
        while not self.stopping:
            self.wake.wait(INTERVAL_S)
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
            sys_line = self._sys_line()
            if sys_line is not None:
                lines.append(sys_line)
        # Connect only with something to say: a forked worker that never logs opens nothing.
        wants = lines or self.unacked or self.owns_train or self.replay is not None
        if self.sock is None and wants and now >= self.next_connect:
            self._connect()
        if self.sock is not None:
            self._read_acks()
        if self.sock is not None and self.replay is not None and len(self.unacked) < MAX_UNACKED:
            self._send_replay()
        if lines:
            if self.sock is not None and len(self.unacked) < MAX_UNACKED:
                self._send(lines, from_replay=False)
            else:
                self._spool(lines)

    def _drain_queue(self) -> list[bytes]:
        out: list[bytes] = []
        queue = self.queue
        while queue:
            try:
                t, scalars = queue.popleft()
            except IndexError:
                break
            line = self._record(t, scalars)
            if line is not None:
                out.append(line)
        return out

    def _record(self, t: float, scalars: dict[str, Any]) -> bytes | None:
        rec: dict[str, Any] = {"t": round(t, 6), "rank": self.rank, "kind": "train"}
        self.owns_train = True
        nonfinite: dict[str, str] | None = None
        for key, raw in scalars.items():
            value = _scalar(raw)
            if value is _SKIP:
                continue
            if key in wire.RESERVED:
                key = f"user_{key}"
            if len(key) > wire.MAX_KEY_LEN:
                key = key[: wire.MAX_KEY_LEN]
            if type(value) is float and not math.isfinite(value):
                nonfinite = nonfinite or {}
                nonfinite[key] = "nan" if value != value else ("inf" if value > 0 else "-inf")
                value = None
            rec[key] = value
            if len(rec) >= wire.MAX_KEYS - 4:
                break
        for count_key, rate_key in (("samples", "samples_per_s"), ("tokens", "tokens_per_s")):
            count = rec.get(count_key)
            if isinstance(count, (int, float)) and not isinstance(count, bool):
                # samples= is what was processed since the previous call that gave samples=.
                prev = self.last_rate_t.get(count_key)
                self.last_rate_t[count_key] = t
                if prev is not None and t > prev:
                    rec[rate_key] = round(count / (t - prev), 3)
        if nonfinite:
            rec["nonfinite"] = nonfinite
        try:
            line = wire.dumps_record(rec)
        except (TypeError, ValueError):
            line = b""
        if not line or len(line) > wire.MAX_RECORD:
            self.dropped += 1  # counted, so the run's events say so
            return None
        return line

    def _sys_line(self) -> bytes | None:
        rec: dict[str, Any] = {"t": round(time.time(), 6), "rank": self.rank, "kind": "sys"}
        waits = self.waits
        if waits:
            steps = []
            while waits:
                try:
                    steps.append(waits.popleft()[1])
                except IndexError:
                    break
            rec["comm_wait_s"] = round(sum(steps) / len(steps), 6)
            rec["comm_wait_max_s"] = round(max(steps), 6)
            rec["comm_steps"] = len(steps)
        if self.watching:
            since = self.pending_since
            rec["comm_pending_s"] = round(time.perf_counter() - since, 3) if since else 0.0
        rec.update(_cuda_counters(self.local_rank))
        if len(rec) == 3:
            return None
        return wire.dumps_record(rec)

    # -- transport ----------------------------------------------------------------------------

    def _connect(self) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=1.0)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            self.next_connect = time.monotonic() + self.backoff
            self.backoff = min(self.backoff * 2, 2.0)
            return
        sock.settimeout(2.0)
        self.sock = sock
        self.backoff = 0.2
        self.ack_buf = b""
        if self.owns_train:
            self._send_frame([], False)  # hello: the collector learns this rank logs itself
        if self.replay is None and self.spool is not None and os.path.exists(self.spool):
            # Claim what was spooled while disconnected; the rename makes replay and the
            # supervisor's own spool ingestion mutually exclusive.
            replay = self.spool + ".replay"
            with contextlib.suppress(OSError):
                os.replace(self.spool, replay)
                self.replay, self.replay_sent = replay, 0

    def _send_replay(self) -> None:
        assert self.replay is not None
        try:
            with open(self.replay, "rb") as fh:
                lines = [ln for ln in fh.read().split(b"\n") if ln.strip()]
        except OSError:
            self.replay = None
            return
        pending = lines[self.replay_sent :]
        if not pending and not any(r for _, _, r in self.unacked):
            with contextlib.suppress(OSError):
                os.unlink(self.replay)
            self.replay, self.replay_sent = None, 0
            return
        if pending:
            self._send(pending, from_replay=True)
            if self.sock is not None:
                self.replay_sent = len(lines)

    def _send(self, lines: list[bytes], *, from_replay: bool) -> None:
        for chunk in _chunks(lines):
            if self.sock is None:
                if not from_replay:
                    self._spool(chunk)
                continue
            self._send_frame(chunk, from_replay)

    def _send_frame(self, chunk: list[bytes], from_replay: bool) -> None:
        assert self.sock is not None
        self.seq += 1
        header: dict[str, Any] = {
            "v": wire.VERSION,
            "token": self.token,
            "rank": self.rank,
            "pid": self.pid,
            "seq": self.seq,
            "dropped": self.dropped,
        }
        if self.owns_train:
            header["train"] = True
        if self.flushing:
            header["ack"] = True
        frame = wire.encode_batch(header, chunk)
        self.unacked.append((self.seq, chunk, from_replay))
        try:
            self.sock.sendall(frame)
        except OSError:
            self._disconnect()

    def _read_acks(self, *, wait: float = 0.0) -> None:
        sock = self.sock
        if sock is None:
            return
        while True:
            # select first: a socket with a timeout would otherwise wait in recv.
            try:
                ready, _, _ = select.select([sock], [], [], wait)
            except (OSError, ValueError):
                self._disconnect()
                return
            if not ready:
                return
            try:
                data = sock.recv(4096)
            except (BlockingIOError, InterruptedError, TimeoutError):
                return
            except OSError:
                self._disconnect()
                return
            if not data:
                self._disconnect()
                return
            buf = self.ack_buf + data
            usable = len(buf) - len(buf) % _ACK_SIZE
            if usable:
                acked = int.from_bytes(buf[usable - _ACK_SIZE : usable], "big")
                self._acked(acked)
            self.ack_buf = buf[usable:]
            if not self.unacked:
                return
            wait = 0.0

    def _acked(self, seq: int) -> None:
        while self.unacked and self.unacked[0][0] <= seq:
            self.unacked.popleft()
        if self.replay is not None and not any(r for _, _, r in self.unacked):
            with contextlib.suppress(OSError):
                os.unlink(self.replay)
            self.replay = None
            self.replay_sent = 0

    def _disconnect(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock = None
        self.next_connect = time.monotonic() + self.backoff
        # Unacked live frames go to the spool; unacked replay lines are still in the replay
        # file and are sent again from the last fully acked position.
        pending = list(self.unacked)
        self.unacked.clear()
        live = [line for _, chunk, from_replay in pending if not from_replay for line in chunk]
        if self.replay is not None:
            replayed_unacked = sum(len(chunk) for _, chunk, r in pending if r)
            self.replay_sent = max(0, self.replay_sent - replayed_unacked)
        if live:
            self._spool(live)

    def _spool(self, lines: list[bytes]) -> None:
        if self.spool is None:
            self.dropped += len(lines)
            return
        try:
            os.makedirs(os.path.dirname(self.spool), exist_ok=True)
            with open(self.spool, "ab") as fh:
                fh.write(b"\n".join(lines) + b"\n")
        except OSError:
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
            sent_before = self.seq
            self.pump()
            if self.sock is not None and self.unacked and self.seq == sent_before:
                self._send_frame([], False)  # a ping: acks everything before it
            while (self.unacked or self.replay is not None) and self.sock is not None:
                if time.monotonic() >= deadline:
                    break
                self._read_acks(wait=max(0.01, min(0.5, deadline - time.monotonic())))
                if self.replay is not None and self.sock is not None:
                    self._send_replay()
            done = not self.unacked and not self.queue
            return done
        finally:
            self.flushing = False
            self.io_lock.release()

    def shutdown(self, timeout: float) -> None:
        self.flush(timeout)
        with self.io_lock:
            self.stopping = True
            if self.sock is not None:
                # Still unacked at exit: the spool keeps it for the supervisor.
                self._disconnect()
            leftover = self._drain_queue()
            if leftover:
                self._spool(leftover)


class _Skip:
    pass


_SKIP: Any = _Skip()


def _scalar(value: Any) -> Any:
    kind = type(value)
    if kind is float or kind is int or kind is bool or value is None:
        return value
    if kind is str:
        return value[: wire.MAX_STR]
    if isinstance(value, (int, float)):  # numpy scalars, IntEnum, ...
        return float(value) if isinstance(value, float) else int(value)
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "ndim", 0) == 0:
        # A 0-d tensor / ndarray: read here, off the training thread.
        try:
            out = item()
        except Exception:
            return _SKIP
        if isinstance(out, bool):
            return out
        if isinstance(out, (int, float)):
            return out
    return _SKIP


def _cuda_counters(device: int) -> dict[str, float]:
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        cuda = torch.cuda
        if not cuda.is_initialized():
            return {}
        if device >= cuda.device_count():
            device = 0
        mib = 1024.0 * 1024.0
        return {
            "cuda_alloc_mib": round(cuda.memory_allocated(device) / mib, 1),
            "cuda_reserved_mib": round(cuda.memory_reserved(device) / mib, 1),
            "cuda_max_alloc_mib": round(cuda.max_memory_allocated(device) / mib, 1),
        }
    except Exception:
        return {}


def _chunks(lines: list[bytes]) -> list[list[bytes]]:
    # Records over the collector's per-record cap were already cut out by _record.
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


# -- the public functions -------------------------------------------------------------------

_sender: _Sender | None = None


def active() -> bool:
    """True inside an xl run (the supervisor gave this process a collector)."""
    return _sender is not None


def _noop_log(*args: Any, **scalars: Any) -> None:
    return None


def _positional(args: tuple[Any, ...], scalars: dict[str, Any]) -> dict[str, Any]:
    # xl.log({"loss": x}) (the wandb.log habit) works too: dicts are merged, keywords win.
    merged: dict[str, Any] = {}
    for arg in args:
        if isinstance(arg, dict):
            merged.update((k, v) for k, v in arg.items() if isinstance(k, str))
    merged.update(scalars)
    return merged


def _make_log(sender: _Sender) -> Any:
    queue = sender.queue
    append = queue.append
    now = time.time
    limit = sender.max_queue

    def log(*args: Any, **scalars: Any) -> None:
        """Record scalars for this rank (e.g. ``step``, ``loss``, ``samples``); returns at once."""
        if args:
            scalars = _positional(args, scalars)
        if len(queue) < limit:
            append((now(), scalars))
        else:
            sender.dropped += 1

    return log


def announce() -> None:
    """Say this rank reports its own train metrics (integrations call it before training), so
    the supervisor does not also parse the metrics the rank prints."""
    sender = _sender
    if sender is not None:
        sender.owns_train = True
        sender.wake.set()


def flush(timeout: float = 5.0) -> bool:
    """Block (at most ``timeout`` s) until everything logged so far is stored; True if so."""
    sender = _sender
    if sender is None:
        return True
    try:
        return sender.flush(timeout)
    except Exception:
        return False


def watch(model: Any, process_group: Any = None) -> Any:
    """Time this rank's wait at DDP's gradient all-reduce (to name stragglers); returns model.

    For each bucket: from the moment it is ready on this rank to the moment its all-reduce is
    done. A slow rank arrives last and waits least; the others wait for it. A no-op for models
    that are not DistributedDataParallel and outside an xl run.
    """
    sender = _sender
    if sender is None or not hasattr(model, "register_comm_hook"):
        return model
    try:
        import torch.distributed as dist
    except Exception:
        return model
    waits = sender.waits
    clock = time.perf_counter
    step_total = [0.0]
    lock = sender.pending_lock

    # What DDP's default hook does (average the bucket over the group), with one callback
    # instead of the default hook's two, since it runs once per bucket on every step.
    # No annotations: DDP inspects the hook's signature and rejects foreign ones.
    def timed_allreduce(state, bucket):  # type: ignore[no-untyped-def]
        ready = clock()
        last = bucket.is_last()
        with lock:
            if sender.pending_count == 0:
                sender.pending_since = ready
            sender.pending_count += 1
        group = state if state is not None else dist.group.WORLD
        tensor = bucket.buffer()
        tensor.div_(group.size())
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done(f):  # type: ignore[no-untyped-def]
            end = clock()
            with lock:
                sender.pending_count -= 1
                if sender.pending_count <= 0:
                    sender.pending_count, sender.pending_since = 0, None
            step_total[0] += end - ready
            if last:
                waits.append((time.time(), step_total[0]))
                step_total[0] = 0.0
            f.value()  # re-raises a failed all-reduce into DDP, as the default hook would
            return tensor

        return fut.then(done)

    try:
        model.register_comm_hook(process_group, timed_allreduce)
    except Exception:  # e.g. a hook is already registered: training goes on unwatched
        return model
    sender.watching = True
    return model


def _start() -> None:
    global _sender, log
    sender = _Sender()
    if sender.address[1] == 0:
        return
    _sender = sender
    log = _make_log(sender)
    sender.thread.start()


def _after_fork_in_child() -> None:
    # A forked child (e.g. a DataLoader worker) keeps the same queue object (``log`` closures
    # already handed out append to it) but gets its own thread, connection, spool and counters;
    # whatever the parent had queued belongs to the parent.
    sender = _sender
    if sender is None:
        return
    with contextlib.suppress(Exception):
        sender.reset_after_fork()


def _at_exit() -> None:
    sender = _sender
    if sender is not None:
        with contextlib.suppress(Exception):
            sender.shutdown(EXIT_WAIT_S)


log: Any = _noop_log
if _env_active():
    with contextlib.suppress(Exception):
        _start()
    if _sender is not None:
        atexit.register(_at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
