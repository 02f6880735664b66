"""The collector under load: many ranks at 20 Hz, then a flood to find its ceiling.

    .venv/bin/python bench/bench_collector.py [--ranks 256] [--hz 20] [--seconds 30]

Ranks are simulated by worker processes, each holding many connections and sending what the
real client sends (a frame every 0.1 s carrying the records logged since the last one, with
after the handshake that proves the run token, reading acks). The collector is the real one
(Telemetry) in this process; its thread's CPU time comes from /proc via psutil. Phase 2
("flood") sends pre-encoded 100-record frames as fast as the workers can to measure records stored
per collector CPU-second.
Goals: 0 drops at 256 x 20 Hz; >= 100k records/s on one core.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from xl import handshake, wire
from xl.launcher.rundir.metrics import MetricsWriter
from xl.launcher.telemetry.collector import Collector
from xl.launcher.telemetry.diagnose import Diagnoser
from xl.launcher.telemetry.server import ACK
from xl.launcher.telemetry.service import Telemetry

TOKEN = "bench-token"


def worker(addr: str, first_rank: int, nranks: int, hz: float, seconds: float, flood: bool) -> None:
    host, port = addr.rsplit(":", 1)
    socks = [socket.create_connection((host, int(port))) for _ in range(nranks)]
    for i, s in enumerate(socks):  # each proves the token as its rank, as the real client does
        assert (
            handshake.client_handshake(s, TOKEN.encode(), handshake.ROLE_RANK, first_rank + i)
            == handshake.OK
        )
    sent = 0
    seqs = [0] * nranks
    steps = [0] * nranks

    def frame(i: int, n: int) -> bytes:
        rank = first_rank + i
        now = time.time()
        lines = []
        for _ in range(n):
            steps[i] += 1
            rec = {
                "t": now,
                "rank": rank,
                "kind": "train",
                "step": steps[i],
                "loss": 0.5,
                "lr": 1e-4,
                "samples": 32,
                "samples_per_s": 640.0,
            }
            lines.append(wire.dumps_record(rec))
        seqs[i] += 1
        header = {
            "v": 1,
            "rank": rank,
            "pid": os.getpid(),
            "seq": seqs[i],
            "dropped": 0,
        }
        return wire.encode_batch(header, lines)

    def drain_acks() -> None:
        for s in socks:
            try:
                while s.recv(65536, socket.MSG_DONTWAIT):
                    pass
            except (BlockingIOError, InterruptedError):
                pass

    end = time.monotonic() + seconds
    if flood:
        while time.monotonic() < end:
            for i, s in enumerate(socks):
                s.sendall(frame(i, 100))
                sent += 100
            drain_acks()
    else:
        per_tick = hz / 10.0  # records each rank logs per 0.1 s tick
        carry = [0.0] * nranks
        tick = time.monotonic()
        while tick < end:
            for i, s in enumerate(socks):
                carry[i] += per_tick
                n = int(carry[i])
                if n:
                    carry[i] -= n
                    s.sendall(frame(i, n))
                    sent += n
            drain_acks()
            tick += 0.1
            time.sleep(max(0.0, tick - time.monotonic()))
    # Close like the real client: half-close, read the remaining acks until the collector
    # closes. Closing with unread acks would reset the connection, and a reset discards what
    # the collector has not read yet.
    for s in socks:
        s.shutdown(socket.SHUT_WR)
    for s in socks:
        s.settimeout(30)
        with contextlib.suppress(OSError):
            while s.recv(65536):
                pass
        s.close()
    print(json.dumps({"sent": sent}), flush=True)


def phase(addr: str, ranks: int, hz: float, seconds: float, flood: bool, workers: int) -> int:
    per = -(-ranks // workers)
    procs = []
    for w in range(workers):
        first = w * per
        n = min(per, ranks - first)
        if n <= 0:
            break
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    addr,
                    str(first),
                    str(n),
                    str(hz),
                    str(seconds),
                    "1" if flood else "0",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    sent = 0
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 120)
        sent += json.loads(out.strip().splitlines()[-1])["sent"]
    return sent


class AsyncioCollector:
    """The alternative design, for comparison only: an asyncio Protocol server in a thread
    doing the same work per frame (handshake, framing, header, records, append, cumulative ack)."""

    def __init__(self, run_dir: Path) -> None:
        import asyncio  # noqa: PLC0415 - only --compare-asyncio uses it

        self.writer = MetricsWriter(run_dir)
        self.records = 0
        # The same per-frame work as the real collector (validation, diagnoses, peers): only
        # the I/O layer differs. This Collector is never started; only its _frame is used.
        diag = Diagnoser(lambda e: None)
        self.col = Collector(self.writer, TOKEN, on_records=diag.ingest)
        frame = self.col._frame
        self.loop = asyncio.new_event_loop()
        outer = self

        class Proto(asyncio.Protocol):
            def connection_made(self, transport):  # type: ignore[no-untyped-def]
                self.t = transport
                self.buf = bytearray()
                self.nonce, first = handshake.challenge()
                self.proved = False
                transport.write(first)

            def data_received(self, data: bytes) -> None:
                buf = self.buf
                buf += data
                if not self.proved:
                    if len(buf) < handshake.HELLO_SIZE:
                        return
                    hello = handshake.check_hello(
                        TOKEN.encode(), self.nonce, bytes(buf[: handshake.HELLO_SIZE])
                    )
                    del buf[: handshake.HELLO_SIZE]
                    self.t.write(hello.answer)
                    self.proved = hello.ok
                    if not hello.ok:
                        self.t.close()
                        return
                pos, lines, last = 0, [], None
                while len(buf) - pos >= 4:
                    (n,) = wire.HEADER.unpack_from(buf, pos)
                    if len(buf) - pos - 4 < n:
                        break
                    payload = bytes(buf[pos + 4 : pos + 4 + n])
                    pos += 4 + n
                    before = len(lines)
                    seq = frame(payload, lines)
                    outer.records += len(lines) - before
                    if seq is not None:
                        last = seq[0]
                del buf[:pos]
                if lines:
                    outer.writer.write_lines(lines)
                if last is not None:
                    self.t.write(ACK.pack(last))

        async def serve() -> None:
            self.server = await self.loop.create_server(Proto, "127.0.0.1", 0)

        self.loop.run_until_complete(serve())
        self.port = self.server.sockets[0].getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.writer.close()


def thread_cpu(native_id: int) -> float:
    for th in psutil.Process().threads():
        if th.id == native_id:
            return th.user_time + th.system_time
    return 0.0


def count_train(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for line in fh if b'"kind":"train"' in line)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        a = sys.argv[2:]
        worker(a[0], int(a[1]), int(a[2]), float(a[3]), float(a[4]), a[5] == "1")
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--hz", type=float, default=20)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--flood-seconds", type=float, default=10)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument(
        "--compare-asyncio",
        action="store_true",
        help="also flood an asyncio Protocol server doing the same work",
    )
    args = ap.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="xl-bench-collector-"))
    tel = Telemetry(run_dir, token=TOKEN, inventory=False)
    addr = tel.start()["XL_COLLECTOR"]
    assert tel.collector is not None and tel.collector._thread is not None
    tid = tel.collector._thread.native_id or threading.get_native_id()

    results = {}
    for name, flood, seconds in (
        ("steady", False, args.seconds),
        ("flood", True, args.flood_seconds),
    ):
        before_rec = tel.collector.records
        cpu0, wall0 = thread_cpu(tid), time.monotonic()
        sent = phase(addr, args.ranks, args.hz, seconds, flood, args.workers)
        # let the collector finish what is in flight
        deadline = time.monotonic() + 30
        while tel.collector.records - before_rec < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu, wall = thread_cpu(tid) - cpu0, time.monotonic() - wall0
        stored = tel.collector.records - before_rec
        results[name] = (sent, stored, cpu, wall)
    tel.stop()
    on_disk = count_train(run_dir / "metrics.jsonl")
    rejects = json.loads((run_dir / "collector.json").read_text())["rejects"]

    sent, stored, cpu, wall = results["steady"]
    print(f"steady: {args.ranks} ranks x {args.hz:g} Hz for {args.seconds:g} s")
    print(f"  records sent {sent}, stored {stored} ({stored / wall:,.0f}/s), drops {sent - stored}")
    print(
        f"  collector thread CPU {cpu:.2f} s over {wall:.1f} s = {100 * cpu / wall:.1f}% of one "
        "core"
    )
    sent_f, stored_f, cpu_f, wall_f = results["flood"]
    capacity = stored_f / cpu_f if cpu_f else float("inf")
    print(f"flood: {args.ranks} connections sending 100-record frames for {args.flood_seconds:g} s")
    print(
        f"  records sent {sent_f}, stored {stored_f} ({stored_f / wall_f:,.0f}/s wall), drops "
        f"{sent_f - stored_f}"
    )
    print(f"  collector CPU {cpu_f:.2f} s -> {capacity:,.0f} records per CPU-second (one core)")
    print(f"on disk: {on_disk} train lines (expected {sent + sent_f}); rejects: {rejects or 0}")
    print(f"goal 0 drops at {args.ranks} x {args.hz:g} Hz: {'met' if sent == stored else 'MISSED'}")
    print(
        f"goal >= 100k records/s on one core: {'met' if capacity >= 100_000 else 'MISSED'} "
        f"({capacity:,.0f})"
    )
    if args.compare_asyncio:
        ac = AsyncioCollector(Path(tempfile.mkdtemp(prefix="xl-bench-asyncio-")))
        atid = ac.thread.native_id or 0
        cpu0 = thread_cpu(atid)
        sent_a = phase(
            f"127.0.0.1:{ac.port}", args.ranks, args.hz, args.flood_seconds, True, args.workers
        )
        deadline = time.monotonic() + 30
        while ac.records < sent_a and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu_a = thread_cpu(atid) - cpu0
        ac.stop()
        cap_a = ac.records / cpu_a if cpu_a else float("inf")
        print(
            f"asyncio Protocol server, same flood: stored {ac.records} of {sent_a}, "
            f"{cap_a:,.0f} records per CPU-second; selectors collector / asyncio = "
            f"{capacity / cap_a:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
