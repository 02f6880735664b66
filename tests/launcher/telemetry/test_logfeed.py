"""Rank output parsed off the supervisor's loop (xl.launcher.telemetry.logfeed): what a line holds
reaches the handler in order, a full queue skips and counts, a parser bug never ends the thread."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from xl.launcher.telemetry import logfeed
from xl.launcher.telemetry.logfeed import LogFeed


def test_lines_are_parsed_in_order_on_the_feed_s_thread() -> None:
    got: list[tuple[int, dict[str, Any], str]] = []
    feed = LogFeed(lambda rank, found: got.append((rank, found, threading.current_thread().name)))
    feed.start()
    feed.put(0, "{'loss': 0.5, 'learning_rate': 0.001, 'epoch': 1.0}")
    feed.put(1, "plain output, nothing to parse")
    feed.put(1, "{'loss': 0.25, 'epoch': 2.0}")
    feed.stop()
    assert [(rank, found["loss"]) for rank, found, _ in got] == [(0, 0.5), (1, 0.25)]
    assert {name for _, _, name in got} == {"xl-logparse"} and feed.skipped == 0


def test_nothing_is_queued_before_start_or_after_stop() -> None:
    got: list[int] = []
    feed = LogFeed(lambda rank, _found: got.append(rank))
    feed.put(0, "{'loss': 1.0}")
    feed.start()
    feed.stop()
    feed.put(0, "{'loss': 1.0}")
    assert got == []


def test_a_full_queue_skips_and_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logfeed, "QUEUE_LINES", 2)
    release = threading.Event()
    feed = LogFeed(lambda _rank, _found: release.wait(5))
    feed.start()
    for _ in range(6):
        feed.put(0, "{'loss': 1.0}")
    release.set()
    feed.stop()
    assert feed.skipped >= 3  # one line in the handler, two in the queue, the rest skipped


def test_a_parser_bug_is_counted_and_parsing_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    def parse(line: str) -> dict[str, Any] | None:
        if "boom" in line:
            raise RuntimeError("parser bug")
        return {"loss": 1.0}

    monkeypatch.setattr(logfeed, "parse_line", parse)
    got: list[int] = []
    feed = LogFeed(lambda rank, _found: got.append(rank))
    feed.start()
    feed.put(0, "{'boom': 1}")
    feed.put(1, "{'loss': 1.0}")
    feed.stop()
    assert got == [1] and feed.skipped == 1
