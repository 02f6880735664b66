"""Contract: the bytes ``xl.log`` puts on the wire to a run's collector.

The frame format's own docstring (xl/wire.py) and the handshake's (xl/handshake.py): a
connection opens with the collector's challenge (b"XLH1" + a 16-byte nonce Ns); the rank answers
role b"r" + its rank (4 bytes big-endian) + its nonce Nc + HMAC-SHA256(XL_TOKEN, b"xl peer" +
role + rank + Ns + Nc); the collector proves itself with HMAC-SHA256(XL_TOKEN, b"xl collector" +
the same), and only then does the rank send frames. The token itself is never on the wire
(a squatter on the port once read it from the first frame's header: docs/security.md).

A frame is a 4-byte big-endian payload length, then the payload, UTF-8 text whose line 1 is a
JSON header and every further line one JSON record (the exact line the collector appends to
metrics.jsonl). The header is ``{"v": 1, "rank", "pid", "seq", "dropped"}`` plus optional
``"train"``, ``"ack"`` and ``"cuda"``. The collector answers with the highest sequence number it
has stored, as 8 bytes big-endian, and ``xl.flush()`` returns True once everything logged is
acknowledged. A listener that cannot prove the token gets no frame at all.

Here a plain TCP server in the test plays the collector, and a subprocess plays a rank: it gets
the variables the supervisor gives a rank (XL_COLLECTOR, XL_TOKEN, XL_RUN_ID, XL_RUN_DIR, RANK,
LOCAL_RANK) and calls only the public ``xl.log`` / ``xl.flush``. Nothing of xl is imported here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

RANK_CODE = """
import os, sys, xl
xl.log(step=1, loss=0.5)
ok = xl.flush(10.0)
print(os.getpid(), ok)
"""

HEADER_REQUIRED = {"v", "rank", "pid", "seq", "dropped"}
HEADER_OPTIONAL = {"train", "ack", "cuda"}


def _rank_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("XL_") and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    }
    env.update(extra)
    return env


def _mac(token: str, label: bytes, who: bytes, ns: bytes, nc: bytes) -> bytes:
    return hmac.new(token.encode(), label + who + ns + nc, hashlib.sha256).digest()


class Collector:
    """Accepts one connection, runs the handshake (``token``; None: a squatter that does not know
    it), splits frames by their length prefix, acks each frame's seq."""

    def __init__(self, *, ack: bool = True, token: str | None = None) -> None:
        self.token = token
        self.hello = b""
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.05)
        self.stop = threading.Event()
        self.port = self.server.getsockname()[1]
        self.ack = ack
        self.raw = b""
        self.frames: list[bytes] = []
        self.connections = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
                break
            except TimeoutError:
                if self.stop.is_set():
                    return  # no connection (the no-op case)
            except OSError:
                return
        self.connections += 1
        buf = b""
        with conn:
            conn.settimeout(20)
            ns = os.urandom(16)
            conn.sendall(b"XLH1" + ns)
            hello = b""
            while len(hello) < 53:
                data = conn.recv(53 - len(hello))
                if not data:
                    return
                hello += data
            self.hello = hello
            self.raw += hello
            who, nc = hello[:5], hello[5:21]
            if self.token is not None:
                assert hmac.compare_digest(hello[21:], _mac(self.token, b"xl peer", who, ns, nc))
                conn.sendall(_mac(self.token, b"xl collector", who, ns, nc))
            else:
                conn.sendall(os.urandom(32))  # a squatter cannot prove anything
            while True:
                try:
                    data = conn.recv(65536)
                except OSError as exc:
                    self.error = exc
                    return
                if not data:
                    return
                self.raw += data
                buf += data
                while len(buf) >= 4:
                    (size,) = struct.unpack(">I", buf[:4])
                    if len(buf) < 4 + size:
                        break
                    payload, buf = buf[4 : 4 + size], buf[4 + size :]
                    self.frames.append(payload)
                    if self.ack:
                        seq = json.loads(payload.split(b"\n", 1)[0])["seq"]
                        conn.sendall(seq.to_bytes(8, "big"))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=20)
        self.server.close()
        assert not self.thread.is_alive()


def _run_rank(env: dict[str, str]) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-c", RANK_CODE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    pid, ok = proc.stdout.split()
    return int(pid), ok


def test_xl_log_frames_on_the_wire(tmp_path: Path) -> None:
    token = "contract-token-0123456789abcdef"
    collector = Collector(token=token)
    env = _rank_env(
        tmp_path,
        XL_COLLECTOR=f"127.0.0.1:{collector.port}",
        XL_TOKEN=token,
        XL_RUN_ID="contract-run",
        XL_RUN_DIR=str(tmp_path / "run"),
        RANK="3",
        LOCAL_RANK="1",
        WORLD_SIZE="4",
    )
    try:
        pid, flushed = _run_rank(env)
    finally:
        collector.close()
    assert collector.error is None
    assert flushed == "True"  # acknowledged with 8-byte big-endian sequence numbers
    assert collector.connections == 1
    frames = collector.frames
    assert frames, "xl.log sent nothing"
    # The stream is the HELLO (as rank 3), then exactly the frames, each 4-byte big-endian
    # length + payload; the token is nowhere in it.
    assert collector.hello[:5] == b"r" + struct.pack(">I", 3)
    assert collector.raw == collector.hello + b"".join(
        struct.pack(">I", len(f)) + f for f in frames
    )
    assert token.encode() not in collector.raw
    records: list[bytes] = []
    seqs: list[int] = []
    for payload in frames:
        payload.decode("utf-8")  # UTF-8 text
        head, *lines = payload.split(b"\n")
        header: dict[str, Any] = json.loads(head)
        assert HEADER_REQUIRED <= set(header) <= HEADER_REQUIRED | HEADER_OPTIONAL, header
        assert header["v"] == 1
        assert header["rank"] == 3 and header["pid"] == pid and header["dropped"] == 0
        assert header.get("train", True) is True and header.get("ack", True) is True
        assert "cuda" not in header  # torch was never imported by this "rank"
        # Compact JSON, as the client writes it (the collector stores record bytes as sent).
        assert head == json.dumps(header, separators=(",", ":")).encode()
        seqs.append(header["seq"])
        records += lines
    assert seqs == list(range(1, len(seqs) + 1))
    # The one record, byte for byte: compact, key order t, rank, kind, then the scalars.
    assert len(records) == 1, records
    assert re.fullmatch(
        rb'\{"t":\d+\.\d+,"rank":3,"kind":"train","step":1,"loss":0\.5\}', records[0]
    ), records[0]
    # A rank that logs says so in its headers, so the supervisor won't parse its printed dicts.
    assert any(json.loads(f.split(b"\n", 1)[0]).get("train") for f in frames)
    # Nothing was spooled: every frame was acknowledged.
    assert not (tmp_path / "run" / "spool").exists() or not any(
        (tmp_path / "run" / "spool").iterdir()
    )


def test_without_a_collector_xl_log_is_a_no_op(tmp_path: Path) -> None:
    collector = Collector()
    env = _rank_env(tmp_path, RANK="0")  # no XL_COLLECTOR / XL_TOKEN: not an xl run
    try:
        _pid, flushed = _run_rank(env)
    finally:
        collector.close()
    assert flushed == "True" and collector.connections == 0


@pytest.mark.parametrize("missing", ["XL_TOKEN", "XL_COLLECTOR"])
def test_both_variables_make_an_xl_run(tmp_path: Path, missing: str) -> None:
    collector = Collector()
    env = _rank_env(
        tmp_path, XL_COLLECTOR=f"127.0.0.1:{collector.port}", XL_TOKEN="t" * 32, RANK="0"
    )
    del env[missing]
    try:
        _pid, flushed = _run_rank(env)
    finally:
        collector.close()
    assert flushed == "True" and collector.connections == 0 and collector.frames == []


def test_a_listener_that_cannot_prove_the_token_gets_no_frame(tmp_path: Path) -> None:
    """Another program on the collector's port: it reads a HELLO (a MAC it cannot turn back into
    the token) and nothing else; what the rank logged waits in its spool."""
    token = "contract-token-0123456789abcdef"
    squatter = Collector(token=None)
    env = _rank_env(
        tmp_path,
        XL_COLLECTOR=f"127.0.0.1:{squatter.port}",
        XL_TOKEN=token,
        XL_RUN_ID="contract-run",
        XL_RUN_DIR=str(tmp_path / "run"),
        RANK="0",
        LOCAL_RANK="0",
    )
    try:
        _pid, flushed = _run_rank(env)
    finally:
        squatter.close()
    assert flushed == "False"  # nothing acknowledged
    assert squatter.frames == [] and len(squatter.raw) == 53
    assert token.encode() not in squatter.raw
    spooled = b"".join(p.read_bytes() for p in (tmp_path / "run" / "spool").iterdir())
    assert b'"step":1' in spooled and token.encode() not in spooled
