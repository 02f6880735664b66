"""The frame format between ``xl.log`` in a rank and the collector in the supervisor.

A frame is a 4-byte big-endian payload length followed by the payload. The payload is UTF-8
text: line 1 is a JSON header, every further line is one JSON record. Records are sent as the
exact line the collector appends to metrics.jsonl, so the collector validates a record with
one ``json.loads`` and then copies the client's bytes instead of re-encoding them (that copy is
what lets one core store >100k records/s).

Every connection starts with the handshake of ``xl.handshake``: both sides prove they hold the
run's token (XL_TOKEN) without sending it, and frames follow only once both proofs checked out.
No frame carries the token (a collector ignores a "token" key).

Header: ``{"v": 1, "rank": int, "pid": int, "seq": int, "dropped": int}``
plus optional ``"cuda": {...}`` (torch's CUDA memory counters of the rank) and ``"train": true``
(the rank reports its own train metrics) and ``"ack": true`` (ack this frame at once; acks are
otherwise batched). A frame may hold no records (a hello, or a flush's ping).

Multi-node runs also carry node frames: the supervisor of node N > 0 sends its ranks' log lines,
lifecycle, failures and sampled records to node 0's collector. Their header has ``"node": N``
(and ``"host"``) instead of ``"rank"``; see xl.launcher.multinode.nodelink for their body lines.

This module is imported by ``xl.client`` inside every rank, so it must stay tiny: stdlib only.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from typing import Any, TypeGuard

from xl.figures import KEYS as FIGURE_KEYS

VERSION = 1
HEADER = struct.Struct(">I")
# One frame holds at most one batch of records; a client splits larger batches. The cap bounds
# what a broken or hostile peer can make the collector buffer.
MAX_FRAME = 1 << 20
MAX_RECORD = 16 << 10
MAX_KEYS = 64  # of a record's keys that are not xl's figures (xl.figures)
MAX_KEY_LEN = 64
MAX_STR = 256
# Keys every metrics.jsonl line owns; a scalar with one of these names is renamed by the client.
RESERVED = frozenset({"t", "rank", "kind"})
KINDS = ("train", "sys")
# Lines a rank could not send wait in the run dir; a live rank replays its own file on
# reconnect, the supervisor stores the files of ranks that are gone.
SPOOL_DIR = "spool"


def spool_file(run_dir: str, rank: int, pid: int) -> str:
    """The spool file of rank process ``pid`` (named here, for the client and the supervisor)."""
    return os.path.join(run_dir, SPOOL_DIR, f"rank-{rank}-{pid}.jsonl")


# One decoder, called directly: json.loads re-detects the encoding of bytes on every call,
# which is a tenth of the collector's time per record.
_decoder = json.JSONDecoder()
_decode = _decoder.decode
# Its scanner alone reads a line that is one JSON value from its first character to its last
# (every line a client sends), without decode()'s two whitespace matches; any other line goes
# through decode(), which accepts or rejects it as before.
_scan = _decoder.scan_once  # type: ignore[attr-defined]  # made by JSONDecoder(), untyped
# One encoder of each kind, made once: json.dumps with options builds one per call.
_encode_record = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
_encode_header = json.JSONEncoder(separators=(",", ":")).encode


class FrameError(ValueError):
    """A frame or record that must be rejected; ``reason`` is the counter it goes to."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


class Header:
    # A plain class, not a dataclass: importing dataclasses would add milliseconds to
    # ``import xl.client`` in every rank.
    __slots__ = ("ack_now", "cuda", "dropped", "pid", "rank", "seq", "train")

    def __init__(
        self,
        rank: int,
        pid: int,
        seq: int,
        dropped: int,
        cuda: dict[str, float] | None,
        train: bool = False,
        ack_now: bool = False,
    ) -> None:
        self.rank, self.pid, self.seq = rank, pid, seq
        self.dropped, self.cuda = dropped, cuda
        # The rank reports its own train records (xl.log, a framework integration, or torch's
        # hooks from its first optimizer step: the client's metricline.OwnTrain): what it
        # prints is then not taken for its steps (the collector's train_ranks).
        self.train = train
        # The sender is flushing (xl.flush, exit) and waits for this ack: send it at once
        # instead of batching it with later ones.
        self.ack_now = ack_now


def encode_frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def encode_batch(header: Mapping[str, object], lines: list[bytes]) -> bytes:
    """One frame from a header dict and already-encoded record lines (no newlines inside)."""
    head = _encode_header(header).encode()
    return encode_frame(b"\n".join([head, *lines]))


def dumps_record(record: Mapping[str, object]) -> bytes:
    # allow_nan=False: metrics.jsonl stays strict JSON (jq, browsers); callers map non-finite
    # floats to null beforehand and say so in the record's "nonfinite" field.
    return _encode_record(record).encode()


def _is_int(value: Any) -> TypeGuard[int]:
    return type(value) is int


class NodeHeader:
    """The header of a node frame (node N > 0's supervisor -> node 0's collector)."""

    __slots__ = ("host", "node", "pid", "seq")

    def __init__(self, node: int, pid: int, seq: int, host: str) -> None:
        self.node, self.pid, self.seq, self.host = node, pid, seq, host


def parse_header(raw: bytes) -> Header | NodeHeader:
    try:
        obj = _decode(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise FrameError("bad_json", str(exc)) from None
    if type(obj) is not dict:
        raise FrameError("bad_header")
    if obj.get("v") != VERSION:
        raise FrameError("bad_version")
    if "node" in obj:
        return _node_header(obj)
    rank, pid, seq = obj.get("rank"), obj.get("pid"), obj.get("seq")
    dropped = obj.get("dropped", 0)
    if not (_is_int(rank) and _is_int(pid) and _is_int(seq)):
        raise FrameError("bad_header")
    if not _is_int(dropped) or rank < 0 or rank > 1 << 20 or dropped < 0:
        raise FrameError("bad_header")
    cuda = obj.get("cuda")
    valid_cuda = cuda is None or (
        type(cuda) is dict
        and len(cuda) <= MAX_KEYS
        and all(type(k) is str and type(v) in (int, float) for k, v in cuda.items())
    )
    if not valid_cuda:
        raise FrameError("bad_header")
    assert isinstance(rank, int) and isinstance(pid, int)
    assert isinstance(seq, int) and isinstance(dropped, int)
    return Header(rank, pid, seq, dropped, cuda, obj.get("train") is True, obj.get("ack") is True)


def _node_header(obj: dict[str, Any]) -> NodeHeader:
    node, pid, seq, host = obj.get("node"), obj.get("pid"), obj.get("seq"), obj.get("host", "")
    if not (_is_int(node) and _is_int(pid) and _is_int(seq) and type(host) is str):
        raise FrameError("bad_header")
    if not 0 < node <= 1 << 16 or len(host) > MAX_STR:
        raise FrameError("bad_header")
    return NodeHeader(node, pid, seq, host)


# edge: a record from the wire, checked here and read by the collector key by key
def parse_record(line: bytes, rank: int) -> dict[str, Any]:
    """Validate one record line for ``rank``; return the parsed dict or raise FrameError."""
    if len(line) > MAX_RECORD:
        raise FrameError("record_too_large")
    try:
        text = line.decode()
        try:
            rec, end = _scan(text, 0)
        except StopIteration:
            end = -1
        if end != len(text):
            rec = _decode(text)
    except (ValueError, UnicodeDecodeError):
        raise FrameError("bad_json") from None
    if type(rec) is not dict:
        raise FrameError("bad_record")
    if rec.get("rank") != rank or type(rec.get("rank")) is not int:
        raise FrameError("rank_mismatch")
    if rec.get("kind") not in KINDS:
        raise FrameError("bad_kind")
    t = rec.get("t")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
        raise FrameError("bad_time")
    if len(rec) > MAX_KEYS and len(rec.keys() - FIGURE_KEYS) > MAX_KEYS:
        # The script's own keys are capped; xl's figures (xl.figures) come on top of them, so
        # a script that logs 64 keys of its own keeps its step split.
        raise FrameError("too_many_keys")
    for key, value in rec.items():
        if len(key) > MAX_KEY_LEN:
            raise FrameError("bad_key")
        kind = type(value)
        if kind is float:
            # json.loads accepts NaN/Infinity; stored lines must stay strict JSON. (``v - v`` is
            # 0 for a finite float only, as xl.figures.finite: cheaper than a call per value.)
            if value - value != 0.0:
                raise FrameError("bad_value")
            continue
        if kind is int or value is None or kind is bool:
            continue
        if kind is str:
            if len(value) > MAX_STR:
                raise FrameError("bad_value")
            continue
        if (
            key == "nonfinite"
            and kind is dict
            and len(value) <= MAX_KEYS
            and all(type(v) is str and len(v) <= 8 for v in value.values())
        ):
            continue
        raise FrameError("bad_value")
    return rec


def split_payload(payload: bytes) -> tuple[bytes, list[bytes]]:
    head, _, rest = payload.partition(b"\n")
    return head, (rest.split(b"\n") if rest else [])
