"""A stall said later than it was seen (held for the hang's verdict) is dated when said; a held
stall whose rank progresses again is never said, nor its recovery."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xl.launcher.stacks.hang import HangCapture, said_at


def _stall(t: float, rank: int, idle: float) -> dict[str, Any]:
    return {
        "t": t,
        "kind": "stalled",
        "rank": rank,
        "idle_s": idle,
        "message": f"rank {rank} made no progress for {idle:.0f} s after step 14",
    }


def test_a_stall_said_later_is_dated_then_with_its_idle_time_grown() -> None:
    said = said_at(_stall(100.0, 1, 6.0), 104.5)
    assert said["t"] == 104.5 and said["idle_s"] == 10.5
    assert said["message"] == "rank 1 made no progress for 10 s after step 14"
    victim = {
        **_stall(100.0, 0, 6.0),
        "message": "rank 0 waits in all_reduce #16 for rank 1 (no progress for 6 s)",
    }
    assert said_at(victim, 103.0)["message"].endswith("(no progress for 9 s)")


def test_a_stall_said_at_once_is_left_as_it_was_seen() -> None:
    event = _stall(100.0, 1, 6.0)
    assert said_at(event, 100.0) is event and said_at(event, 99.0) is event


def test_a_held_stall_whose_rank_recovers_is_dropped_with_its_recovery(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []
    hang = HangCapture(tmp_path, sent.append, lambda: [], timeout=0.1, hold_s=0.0)
    gated = hang.gate(sent.append)
    with hang._lock:  # as on_stall leaves them while the capture is under way
        hang._held = [_stall(100.0, 0, 6.0), _stall(100.0, 1, 6.0)]
    gated({"t": 101.0, "kind": "recovered", "rank": 0, "of": "stalled"})
    assert sent == [] and [e["rank"] for e in hang._held] == [1]
    # A recovery from a stall already said goes out, as does every other event.
    gated({"t": 102.0, "kind": "recovered", "rank": 3, "of": "stalled"})
    gated({"t": 102.0, "kind": "straggler", "rank": 1})
    assert [e["kind"] for e in sent] == ["recovered", "straggler"]
