"""Decoding JSONL fast: metrics.jsonl and events.jsonl lines as json.loads reads them, for less.

The viewers' hot path: a 64-rank run appends ~700 lines a second, and decoding them is most of a
poll's cost (bench/bench_reader.py measures it).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

_DECODER = json.JSONDecoder()
# Fewer lines than this are decoded by the json module: importing orjson (datetime, uuid,
# platform) costs ~5 ms of CPU in a viewer, what it saves over ~2,000 metrics lines (2.7 vs 0.6
# us each), and a launch's plain view mostly reads a few events at a time. Once a poll is this
# big, orjson is imported and used for every big poll after it.
FAST_FROM = 256


def fast_loads(lines: int) -> Callable[[bytes], object] | None:
    """orjson's loads for a poll of ``lines`` lines when it pays (FAST_FROM), else None."""
    return _fast() if lines >= FAST_FROM else None


@functools.cache
def _fast() -> Callable[[bytes], Any] | None:
    """orjson's loads, imported on the first poll big enough for it to pay."""
    try:
        from orjson import loads  # noqa: PLC0415 - see FAST_FROM
    except ImportError:  # an install without it reads the same, only slower
        return None
    return loads


# edge: JSON values as the lines hold them, whatever they are; events.py and metrics.py type them
def decode_lines(lines: list[bytes]) -> list[Any]:
    """The value of each line that is JSON, as ``json.loads(line)`` gives it; other lines skipped.

    orjson, when installed (it is a dependency), parses a line ~4x faster than the json module (used
    from ``FAST_FROM`` lines on); a line it refuses (NaN, a BOM, a lone surrogate, an overflowing
    number, or not JSON at all) gets the json module's verdict. The one difference: an integer
    beyond 64 bits comes back from orjson as a float. """
    if not lines:
        return []
    fast = fast_loads(len(lines))
    if fast is None:
        return decode_lines_json(lines)
    values = []
    for line in lines:
        try:
            values.append(fast(line))
        except ValueError:
            try:
                values.append(json.loads(line))
            except ValueError:
                pass
    return values


# edge: as decode_lines
def decode_lines_json(lines: list[bytes]) -> list[Any]:
    """decode_lines with the json module alone.

    A poll's lines are decoded to text in one go and each parsed with ``raw_decode``: that skips
    json.loads' per-line work (encoding detection, a decode, two whitespace scans), ~40% of the
    cost of decoding a poll's metrics. A line that is not exactly one JSON document that way
    (surrounding whitespace, a BOM, a torn write, bytes that are not UTF-8) gets json.loads' own
    verdict, so the result is the same as calling json.loads on every line.
    """
    if not lines:
        return []
    try:
        texts = b"\n".join(lines).decode("utf-8", "surrogatepass").split("\n")
    except UnicodeDecodeError:
        texts = [""] * len(lines)  # "" never parses: every line goes to json.loads alone
    raw_decode = _DECODER.raw_decode
    values = []
    for text, line in zip(texts, lines, strict=True):
        try:
            value, end = raw_decode(text)
        except ValueError:
            pass
        else:
            if end == len(text):
                values.append(value)
                continue
        try:
            values.append(json.loads(line))
        except ValueError:
            pass
    return values
