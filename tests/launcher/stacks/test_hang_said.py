"""A stall said later than it was seen (held for the hang's verdict) is dated when said; a held
stall whose rank progresses again is never said, nor its recovery."""

from __future__ import annotations

import json
from pathlib import Path

from eventlines import Lines, stall

from xl.launcher.rundir.events import Diagnosis, EventKind, event_line
from xl.launcher.stacks.hang import HangCapture, said_at


def _stall(t: float, rank: int, idle: float) -> Diagnosis:
    message = f"rank {rank} made no progress for {idle:.0f} s after step 14"
    return stall(rank, message, t, idle_s=idle)


def test_a_stall_said_later_is_dated_then_with_its_idle_time_grown() -> None:
    said = json.loads(event_line(said_at(_stall(100.0, 1, 6.0), 104.5)))
    assert said == {
        "t": 104.5,
        "kind": "stalled",
        "rank": 1,
        "message": "rank 1 made no progress for 10 s after step 14",
        "idle_s": 10.5,
    }
    assert list(said) == ["t", "kind", "rank", "message", "idle_s"]  # the line's order kept
    victim = Diagnosis(
        EventKind.STALLED,
        0,
        "rank 0 waits in all_reduce #16 for rank 1 (no progress for 6 s)",
        {"idle_s": 6.0, "step": 14, "waiting_on": [1]},
        t=100.0,
    )
    later = said_at(victim, 103.0)
    assert later.message.endswith("(no progress for 9 s)") and later.extra == {
        "idle_s": 9.0,
        "step": 14,
        "waiting_on": [1],
    }
    assert victim.idle_s == 6.0 and victim.t == 100.0  # the stall as seen is left as it was
    # A stall that holds no idle time is only dated anew.
    bare = said_at(stall(2, "rank 2 made no progress for 31 s", 100.0), 101.0)
    assert (bare.t, bare.message, bare.extra) == (101.0, "rank 2 made no progress for 31 s", {})


def test_a_stall_said_at_once_is_left_as_it_was_seen() -> None:
    event = _stall(100.0, 1, 6.0)
    assert said_at(event, 100.0) is event and said_at(event, 99.0) is event


def test_a_held_stall_whose_rank_recovers_is_dropped_with_its_recovery(tmp_path: Path) -> None:
    sent = Lines()
    hang = HangCapture(tmp_path, sent, lambda: [], timeout=0.1, hold_s=0.0)
    gated = hang.gate(sent)
    with hang._lock:  # as on_stall leaves them while the capture is under way
        hang._held = [_stall(100.0, 0, 6.0), _stall(100.0, 1, 6.0)]
    gated(Diagnosis(EventKind.RECOVERED, 0, "rank 0 progresses again", {"of": "stalled"}))
    assert sent == [] and [e.rank for e in hang._held] == [1]
    # A recovery from a stall already said goes out, as does every other event: a straggler's
    # recovery of a rank whose stall is held is no word on that stall.
    gated(Diagnosis(EventKind.RECOVERED, 3, "rank 3 progresses again", {"of": "stalled"}))
    gated(Diagnosis(EventKind.RECOVERED, 1, "rank 1 keeps up again", {"of": "straggler"}))
    gated(Diagnosis(EventKind.STRAGGLER, 1, "rank 1 is the straggler"))
    assert [(e["kind"], e["rank"]) for e in sent] == [
        ("recovered", 3),
        ("recovered", 1),
        ("straggler", 1),
    ]
    assert [e.rank for e in hang._held] == [1]
