"""The collector under stress: restarted mid-run, and fed garbage while a real rank logs."""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from xltele import assert_gone, rank_env

from xl import handshake, wire
from xl.launcher.multinode import nodelink
from xl.launcher.telemetry import collector
from xl.launcher.telemetry.service import Telemetry

# A real rank: logs N records, one every few ms, then exits (flushing at exit).
RANK_CODE = (
    "import sys, time, xl\n"
    "n, pause = int(sys.argv[1]), float(sys.argv[2])\n"
    "for i in range(1, n + 1):\n"
    "    xl.log(step=i, loss=1.0 / i, samples=4)\n"
    "    time.sleep(pause)\n"
)


def _start_rank(env: dict[str, str], n: int, pause: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", RANK_CODE, str(n), str(pause)],
        env=rank_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _train_steps(run_dir: Path, rank: int) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines if line.strip()]
    return [r["step"] for r in recs if r["kind"] == "train" and r["rank"] == rank]


def _wait_for_steps(run_dir: Path, rank: int, at_least: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = run_dir / "metrics.jsonl"
        if path.exists() and len(_train_steps(run_dir, rank)) >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} never reached {at_least} stored records")


@pytest.mark.e2e
def test_collector_stopped_and_restarted_mid_run_loses_nothing(tmp_path: Path) -> None:
    tel = Telemetry(tmp_path, token="tok", inventory=False)
    env = {**tel.start(), "XL_RUN_DIR": str(tmp_path), "RANK": "0"}
    proc = _start_rank(env, 600, 0.005)
    try:
        _wait_for_steps(tmp_path, 0, 50)
        tel.stop()  # the rank keeps logging into the void: it must spool, not lose
        stopped_at = len(_train_steps(tmp_path, 0))
        time.sleep(1.0)
        tel = Telemetry(tmp_path, token="tok", inventory=False)
        restarted = tel.start()
        assert restarted["XL_COLLECTOR"] == env["XL_COLLECTOR"], "the port ranks know is rebound"
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        tel.stop()
    steps = _train_steps(tmp_path, 0)
    assert stopped_at < 600
    assert sorted(steps) == list(range(1, 601)), "every record logged is stored exactly once"
    # The live rank replayed its own spool on reconnect (the supervisor had nothing left over).
    assert json.loads((tmp_path / "collector.json").read_text())["spooled_records"] == 0
    assert not list((tmp_path / "spool").glob("*"))
    assert_gone({proc.pid})


def _frame(header: dict, lines: list[bytes]) -> bytes:
    return wire.encode_batch(header, lines)


def _peer(host: str, port: int, token: str, rank: int) -> tuple[socket.socket, str]:
    """A connection that went through the handshake as ``rank``, and its verdict."""
    sock = socket.create_connection((host, port), timeout=10)
    return sock, handshake.client_handshake(sock, token.encode(), handshake.ROLE_RANK, rank)


def _garbage(rng: random.Random, pid: int, seq: int) -> bytes:
    """One malformed or hostile frame from a peer that proved the token as rank 7 (always with a
    sane length prefix; a ``seq`` higher than the last of ``pid``, or the collector takes it for
    a frame resent)."""
    good_header = {"v": 1, "rank": 7, "pid": pid, "seq": seq, "dropped": 0}
    good_rec = {"t": time.time(), "rank": 7, "kind": "train", "step": 1}
    choice = rng.randrange(12)
    if choice == 0:
        return wire.encode_frame(rng.randbytes(rng.randrange(1, 2000)))
    if choice == 1:  # another rank than the one it proved the token as
        return _frame({**good_header, "rank": 8}, [wire.dumps_record({**good_rec, "rank": 8})])
    if choice == 2:
        return _frame({**good_header, "v": 99}, [])
    if choice == 3:
        return _frame({**good_header, "rank": "seven"}, [])
    if choice == 4:  # record claims another rank than its header
        return _frame(good_header, [wire.dumps_record({**good_rec, "rank": 8})])
    if choice == 5:
        return _frame(good_header, [b'{"t": 1, "rank": 7, "kind": "train", "loss": NaN}'])
    if choice == 6:
        return _frame(good_header, [json.dumps({**good_rec, "loss": [1, 2]}).encode()])
    if choice == 7:
        return _frame(good_header, [json.dumps({**good_rec, "kind": "evil"}).encode()])
    if choice == 8:
        return _frame(good_header, [b"x" * (wire.MAX_RECORD + 10)])
    if choice == 9:
        return _frame(good_header, [b"[1, 2, 3]", b"{", b"\xff\xfe"])
    if choice == 10:
        return wire.encode_frame(b'{"v": 1}\n' + rng.randbytes(50))
    keys = {f"k{i}": i for i in range(wire.MAX_KEYS + 5)}
    return _frame(good_header, [json.dumps({**good_rec, **keys}).encode()])


@pytest.mark.e2e
def test_fuzzed_collector_keeps_every_real_record_and_counts_rejects(tmp_path: Path) -> None:
    tel = Telemetry(tmp_path, token="tok", inventory=False)
    env = {**tel.start(), "XL_RUN_DIR": str(tmp_path), "RANK": "0"}
    host, port = env["XL_COLLECTOR"].rsplit(":", 1)
    rng = random.Random(1234)
    proc = _start_rank(env, 800, 0.003)
    sent = 0
    oversized = refused = 0
    try:
        socks = []
        for _ in range(4):
            sock, verdict = _peer(host, int(port), "tok", 7)
            assert verdict == handshake.OK
            socks.append(sock)
        while sent < 12_000:
            sock = socks[sent % len(socks)]
            sock.sendall(_garbage(rng, sent % len(socks), sent + 1))
            sent += 1
            if sent % 1500 == 0:
                # A length prefix over the cap: that connection is cut, a new one is fine.
                bad, verdict = _peer(host, int(port), "tok", 7)
                assert verdict == handshake.OK
                bad.sendall(struct.pack(">I", wire.MAX_FRAME + 1) + b"x" * 100)
                oversized += 1
                assert bad.recv(10) == b""  # closed by the collector
                bad.close()
            if sent % 200 == 0:
                # A peer with another token is refused in the handshake, and hears nothing else.
                bad, verdict = _peer(host, int(port), "wrong", 7)
                assert verdict == handshake.REFUSED_TOKEN
                refused += 1
                assert bad.recv(10) == b""
                bad.close()
        for sock in socks:
            sock.close()
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        # Still alive and serving after all that: one more good frame is stored.
        sock, verdict = _peer(host, int(port), "tok", 5)
        with sock:
            assert verdict == handshake.OK
            rec = {"t": time.time(), "rank": 5, "kind": "train", "step": 99}
            header = {"v": 1, "rank": 5, "pid": os.getpid(), "seq": 1, "dropped": 0}
            sock.sendall(_frame(header, [wire.dumps_record(rec)]))
            assert len(sock.recv(8)) == 8  # acked
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        tel.stop()
    assert sorted(_train_steps(tmp_path, 0)) == list(range(1, 801))
    assert _train_steps(tmp_path, 5) == [99]
    assert _train_steps(tmp_path, 7) == [], "no fuzz record may be stored"
    status = json.loads((tmp_path / "collector.json").read_text())
    rejects = status["rejects"]
    assert rejects["oversized"] == oversized
    assert rejects["bad_token"] == refused == 60
    assert (
        rejects["rank_mismatch"] > 500 and rejects["bad_json"] > 500 and rejects["wrong_rank"] > 500
    )
    assert sum(rejects.values()) >= sent
    assert "internal_error" not in rejects
    # Bad records under a valid token are a client bug, not noise: they reach the events.
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    dropped = [e for e in events if e["kind"] == "dropped"]
    assert {e["rank"] for e in dropped} == {7}
    assert {"rank_mismatch", "bad_json", "bad_kind"} <= {e["reason"] for e in dropped}
    assert_gone({proc.pid})


# A peer that connects and then says nothing valid: it prints what it got once the collector
# hangs up (or "open" when it is still connected after the wait it is given).
SILENT_PEER = (
    "import socket, struct, sys\n"
    "host, port, mode, wait = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])\n"
    "sock = socket.create_connection((host, port), timeout=wait)\n"
    "challenge = b''\n"
    "while len(challenge) < 20:\n"
    "    challenge += sock.recv(20 - len(challenge))\n"
    "if mode == 'partial':\n"
    "    sock.sendall(struct.pack('>I', 1000) + b'{\"v\": 1')  # a frame that never completes\n"
    "elif mode == 'bad_token':\n"
    "    sock.sendall(b'r' + bytes(4) + bytes(16) + bytes(32))  # a HELLO with a wrong proof\n"
    "print('connected', flush=True)\n"
    "got = b''\n"
    "try:\n"
    "    while data := sock.recv(100):\n"
    "        got += data\n"
    "    print('closed', got.rstrip(b'\\0').decode() or '-', flush=True)\n"
    "except TimeoutError:\n"
    "    print('open', flush=True)\n"
)


@pytest.mark.e2e
def test_connections_that_send_nothing_valid_are_closed_after_the_idle_timeout(
    tmp_path: Path,
) -> None:
    """A peer that connects and says nothing, trickles a frame that never completes, or sends only
    a HELLO with a wrong token is refused at once; the others are cut after the collector's idle
    timeout (IDLE_S, 30 s; shortened here) and counted as ``idle``. A real rank that logs rarely
    and a real node link (heartbeat every HEARTBEAT_S, well within IDLE_S) are never cut."""
    assert nodelink.HEARTBEAT_S * 10 <= collector.IDLE_S  # a link's first frame comes long before
    closed: list[int] = []
    tel = Telemetry(
        tmp_path,
        token="tok-0123456789abcdef",
        inventory=False,
        on_node=lambda *_: None,
        on_node_closed=closed.append,
    )
    env = {**tel.start(), "XL_RUN_DIR": str(tmp_path), "RANK": "0"}
    assert tel.collector is not None and tel.collector.idle_s == collector.IDLE_S == 30.0
    # a link's first heartbeat is due HEARTBEAT_S after it connects
    idle = nodelink.HEARTBEAT_S + 1.5
    tel.collector.idle_s = idle
    host, port = env["XL_COLLECTOR"].rsplit(":", 1)
    peers = {
        mode: subprocess.Popen(
            [sys.executable, "-c", SILENT_PEER, host, port, mode, str(idle + 10)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode in ("silent", "partial", "bad_token")
    }
    rank = _start_rank(env, 6, 1.0)  # one record a second: quiet, but valid from the first frame
    link = nodelink.NodeLink(host, int(port), "tok-0123456789abcdef", 1, "node-b")
    link.start()
    try:
        start = time.monotonic()
        for mode, proc in peers.items():
            out, err = proc.communicate(timeout=idle + 20)
            # refused at once, the others cut idle
            said = "XL-REFUSED-BAD-TOKEN" if mode == "bad_token" else "-"
            assert out.split() == ["connected", "closed", said], (mode, out, err)
        # Never cut before the idle timeout; one the collector never cut says "open" (its own
        # wait ran out), however late a busy machine let the collector get to it.
        took = time.monotonic() - start
        assert took >= idle - 0.5, took
        _out, err = rank.communicate(timeout=60)
        assert rank.returncode == 0, err
        assert not closed  # the link stayed connected throughout
        assert link.close(5.0)
    finally:
        for proc in [*peers.values(), rank]:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        link.close(0.1)
        tel.stop()
    rejects = json.loads((tmp_path / "collector.json").read_text())["rejects"]
    assert rejects == {"idle": 2, "bad_token": 1}, rejects
    assert sorted(_train_steps(tmp_path, 0)) == [1, 2, 3, 4, 5, 6]
    assert_gone({p.pid for p in [*peers.values(), rank]})
