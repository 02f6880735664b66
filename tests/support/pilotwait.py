"""Waiting in Pilot tests: let the app run until something a person would see holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


async def until(
    pilot: Any, predicate: Callable[[], Any], what: str, timeout: float = 15.0, step: float = 0.05
) -> None:
    """Let the app run (workers and timers need event-loop turns; real processes need seconds)
    until ``predicate()`` holds; fail the test with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await pilot.pause(step)
    raise AssertionError(f"never happened within {timeout}s: {what}")
