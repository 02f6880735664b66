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

from xl.launcher import wire
from xl.launcher.telemetry import Telemetry

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


def _garbage(rng: random.Random, token: str) -> bytes:
    """One malformed, unauthorised or hostile frame (always with a sane length prefix)."""
    good_header = {"v": 1, "token": token, "rank": 7, "pid": 1, "seq": 1, "dropped": 0}
    good_rec = {"t": time.time(), "rank": 7, "kind": "train", "step": 1}
    choice = rng.randrange(12)
    if choice == 0:
        return wire.encode_frame(rng.randbytes(rng.randrange(1, 2000)))
    if choice == 1:
        return _frame({**good_header, "token": "wrong"}, [wire.dumps_record(good_rec)])
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
    oversized = 0
    try:
        socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(4)]
        while sent < 12_000:
            sock = socks[sent % len(socks)]
            sock.sendall(_garbage(rng, "tok"))
            sent += 1
            if sent % 1500 == 0:
                # A length prefix over the cap: that connection is cut, a new one is fine.
                bad = socket.create_connection((host, int(port)), timeout=10)
                bad.sendall(struct.pack(">I", wire.MAX_FRAME + 1) + b"x" * 100)
                oversized += 1
                assert bad.recv(10) == b""  # closed by the collector
                bad.close()
        for sock in socks:
            sock.close()
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        # Still alive and serving after all that: one more good frame is stored.
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            rec = {"t": time.time(), "rank": 5, "kind": "train", "step": 99}
            header = {"v": 1, "token": "tok", "rank": 5, "pid": os.getpid(), "seq": 1, "dropped": 0}
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
    assert rejects["bad_token"] > 500
    assert rejects["rank_mismatch"] > 500 and rejects["bad_json"] > 500
    assert sum(rejects.values()) >= sent
    assert "internal_error" not in rejects
    # Bad records under a valid token are a client bug, not noise: they reach the events.
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    dropped = [e for e in events if e["kind"] == "dropped"]
    assert {e["rank"] for e in dropped} == {7}
    assert {"rank_mismatch", "bad_json", "bad_kind"} <= {e["reason"] for e in dropped}
    assert_gone({proc.pid})
