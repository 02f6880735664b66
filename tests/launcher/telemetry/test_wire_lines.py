"""The collector's reading of a record line and the client's writing of one, byte for byte.

xl.wire reads a line with the JSON scanner alone when the line is one JSON value from its first
character to its last, and writes with encoders made once; what it accepts, rejects (and why) and
writes is json's own: these cases hold it to ``json.loads`` and ``json.dumps``.
"""

from __future__ import annotations

import json
import math

import pytest

from xl import wire

GOOD = '{"t":1.5,"rank":3,"kind":"train","step":7,"loss":0.25,"ok":true,"tag":null,"n":"x"}'


@pytest.mark.parametrize(
    "line",
    [
        GOOD,
        " " + GOOD,  # whitespace around a value: json accepts it
        GOOD + " ",
        "\t" + GOOD + "\r",
        '{"t":1.5,"rank":3,"kind":"sys","nonfinite":{"loss":"nan"},"loss":null}',
        '{"t":1e3,"rank":3,"kind":"train","step":-0.0}',
        '{"t":1.5,"rank":3,"kind":"train","\\u00e9t\\u00e9":"caf\\u00e9"}',
        '{"t":1.5,"rank":3,"kind":"train","k":"\u00e9"}',
    ],
)
def test_a_line_json_reads_is_read_as_json_reads_it(line: str) -> None:
    assert wire.parse_record(line.encode(), 3) == json.loads(line)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (GOOD + GOOD, "bad_json"),  # extra data after the value
        (GOOD + " x", "bad_json"),
        (GOOD[:-1], "bad_json"),  # cut short
        ("", "bad_json"),
        ("   ", "bad_json"),
        ("x" + GOOD, "bad_json"),
        ('{"t":1.5,"rank":3,"kind":"train","v":[1,}', "bad_json"),
        ("[1, 2]", "bad_record"),
        ("7", "bad_record"),
        (' "text" ', "bad_record"),
        ('{"t":1.5,"rank":4,"kind":"train"}', "rank_mismatch"),
        ('{"t":1.5,"rank":3,"kind":"eval"}', "bad_kind"),
        ('{"t":NaN,"rank":3,"kind":"train"}', "bad_time"),
        ('{"t":1.5,"rank":3,"kind":"train","loss":NaN}', "bad_value"),
        ('{"t":1.5,"rank":3,"kind":"train","loss":Infinity}', "bad_value"),
        ('{"t":1.5,"rank":3,"kind":"train","loss":-Infinity}', "bad_value"),
        ('{"t":1.5,"rank":3,"kind":"train","loss":1e999}', "bad_value"),  # json's float is inf
        ('{"t":1.5,"rank":3,"kind":"train","v":[1]}', "bad_value"),
        ('{"t":1.5,"rank":3,"kind":"train","' + "k" * 65 + '":1}', "bad_key"),
    ],
)
def test_a_line_that_is_no_record_is_rejected_for_its_reason(line: str, reason: str) -> None:
    with pytest.raises(wire.FrameError) as err:
        wire.parse_record(line.encode(), 3)
    assert err.value.reason == reason


def test_bytes_that_are_no_utf8_are_bad_json() -> None:
    with pytest.raises(wire.FrameError) as err:
        wire.parse_record(b'{"t":1.5,"rank":3,"kind":"train","k":"\xff"}', 3)
    assert err.value.reason == "bad_json"


@pytest.mark.parametrize(
    "record",
    [
        {"t": 1764300000.123456, "rank": 3017, "kind": "train", "step": 1234, "loss": 2.345678},
        {"t": 1.0, "rank": 0, "kind": "sys", "cpu_pct": 99.5, "tag": "caf\u00e9 \u2603", "x": None},
        {"t": 1.0, "rank": 0, "kind": "train", "ok": True, "nonfinite": {"loss": "nan"}},
        {},
    ],
)
def test_a_record_is_written_as_json_dumps_writes_it(record: dict[str, object]) -> None:
    assert (
        wire.dumps_record(record)
        == json.dumps(record, separators=(",", ":"), allow_nan=False).encode()
    )
    header = {"v": 1, "rank": 3, "pid": 9, "seq": 1, "dropped": 0, "cuda": {"x": math.pi}}
    line = wire.dumps_record(record)
    assert wire.encode_batch(header, [line, line]) == wire.encode_frame(
        b"\n".join([json.dumps(header, separators=(",", ":")).encode(), line, line])
    )


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_record_with_a_non_finite_number_is_refused_as_json_refuses_it(value: float) -> None:
    with pytest.raises(ValueError):
        wire.dumps_record({"t": 1.0, "rank": 0, "kind": "train", "loss": value})
    with pytest.raises(TypeError):
        wire.dumps_record({"t": 1.0, "rank": 0, "kind": "train", "loss": object()})
