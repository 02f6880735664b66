"""The typed events (xl.launcher.rundir.events): each kind's line holds exactly the keys and values
docs/contracts.md's "events.jsonl" names, in the order it shows, and every kind is documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

from xl.launcher.rundir.events import (
    Diagnosis,
    Dropped,
    EventKind,
    FailureEvent,
    FromNode,
    Hang,
    MetricsLost,
    NodeNotice,
    NodeRefused,
    Notice,
    RankExited,
    RankStarted,
    Relayed,
    Restarted,
    RunEnded,
    WriteLost,
    event_line,
)
from xl.launcher.rundir.outcome import Cause, CauseKind, Failure

_CONTRACTS = Path(__file__).resolve().parents[3] / "docs" / "contracts.md"


def _line(event: object) -> list[tuple[str, object]]:
    """The line's keys and values in order, without its time."""
    obj = json.loads(event_line(event))  # type: ignore[arg-type]
    assert isinstance(obj.pop("t"), float)
    return list(obj.items())


def test_lifecycle_lines_are_as_the_contract_shows() -> None:
    assert _line(Notice(EventKind.RUN_STARTED, "starting 2 ranks on CPU")) == [
        ("kind", "run_started"), ("message", "starting 2 ranks on CPU"), ("rank", None)]
    assert _line(RankStarted(1, 4242, "rank 1 started (pid 4242)")) == [
        ("kind", "rank_started"),
        ("rank", 1),
        ("pid", 4242),
        ("message", "rank 1 started (pid 4242)"),
    ]
    assert _line(RankExited(1, -9, "rank 1 was killed by SIGKILL")) == [
        ("kind", "rank_exited"),
        ("rank", 1),
        ("exit_code", -9),
        ("message", "rank 1 was killed by SIGKILL"),
    ]
    assert _line(Restarted(1, "torchrun restarted the ranks (attempt 2 of 3)")) == [
        ("kind", "restarted"),
        ("attempt", 1),
        ("message", "torchrun restarted the ranks (attempt 2 of 3)"),
        ("rank", None),
    ]
    assert _line(RunEnded("failed", "run failed")) == [
        ("kind", "run_ended"), ("status", "failed"), ("message", "run failed"), ("rank", None)]
    assert _line(WriteLost({"metrics.jsonl": 10}, "lost")) == [
        ("kind", "write_lost"),
        ("rank", None),
        ("files", {"metrics.jsonl": 10}),
        ("message", "lost"),
    ]


def test_the_failure_line_is_run_json_s_failure() -> None:
    cause = Cause(CauseKind.EXCEPTION, "ValueError: bad batch", None, ["ValueError: bad batch"])
    failure = Failure(
        1, 1, "Traceback...", "ValueError: bad batch", "rank 1 failed first: ValueError: bad batch",
        "vm", 0, cause,
    )
    line = _line(FailureEvent(failure))
    assert line == [
        ("kind", "failure"),
        ("rank", 1),
        ("exit_code", 1),
        ("node", "vm"),
        ("node_rank", 0),
        ("message", "rank 1 failed first: ValueError: bad batch"),
        ("cause", cause.to_json()),
    ]
    assert dict(line)["cause"] == failure.to_json()["cause"]
    nobody = _line(FailureEvent(Failure(None, None, None, None, "torchrun ended", "vm", 0, None)))
    assert dict(nobody)["rank"] is None and dict(nobody)["cause"] is None


def test_node_lines_name_the_other_node_only_when_it_is_known() -> None:
    assert _line(NodeNotice(EventKind.NODE_LOST, 1, "node 1 (b) was lost", node="b")) == [
        ("kind", "node_lost"),
        ("node", "b"),
        ("node_rank", 1),
        ("message", "node 1 (b) was lost"),
        ("rank", None),
    ]
    # A node > 0 speaks of node 0, whose host it does not name; an empty host is still a host.
    assert _line(NodeNotice(EventKind.NODE_BACK, 0, "node 0 answers again")) == [
        ("kind", "node_back"),
        ("node_rank", 0),
        ("message", "node 0 answers again"),
        ("rank", None),
    ]
    assert dict(_line(NodeNotice(EventKind.NODE_QUIET, 2, "quiet", node="")))["node"] == ""
    assert _line(NodeRefused("c", 2, "10.0.0.9:5000", "refused")) == [
        ("kind", "node_refused"),
        ("node", "c"),
        ("node_rank", 2),
        ("peer", "10.0.0.9:5000"),
        ("message", "refused"),
        ("rank", None),
    ]


def test_another_node_s_events_are_its_part_s_on_node_0() -> None:
    sent = {"kind": "run_started", "message": "starting 1 rank on CPU", "t": 5.0, "rank": None}
    got = FromNode(sent, "b", 1)
    assert got.kind is EventKind.NODE_STARTED
    assert got.to_json() == {
        "kind": "node_started",
        "message": "node 1: starting 1 rank on CPU",
        "t": 5.0,
        "rank": None,
        "node": "b",
        "node_rank": 1,
    }
    assert sent["kind"] == "run_started"  # what the node sent is left as it was
    stop = FromNode({"kind": "stop_requested", "message": ""}, "b", 1)
    assert (
        stop.kind == EventKind.STOP_REQUESTED
        and stop.to_json()["message"] == "node 1: stop_requested"
    )
    assert (
        FromNode({"kind": "run_ended", "status": "failed"}, "b", 1).to_json()["kind"]
        == "node_ended"
    )


def test_telemetry_lines_keep_their_time_first() -> None:
    stalled = Diagnosis(
        EventKind.STALLED, 0, "rank 0 made no progress for 30 s", {"idle_s": 30.0, "step": 4}, t=7.0
    )
    assert list(stalled.to_json().items()) == [
        ("t", 7.0),
        ("kind", "stalled"),
        ("rank", 0),
        ("message", "rank 0 made no progress for 30 s"),
        ("idle_s", 30.0),
        ("step", 4),
    ]
    hang = Hang(8.0, 1, [1], "rank 1 is stuck", "stacks/8.json", [])
    assert list(hang.to_json()) == ["t", "kind", "rank", "ranks", "message", "stacks", "busy"]
    assert Dropped(9.0, 2, "rank 2 dropped 3 records", 3, "queue_full").to_json() == {
        "t": 9.0,
        "kind": "dropped",
        "rank": 2,
        "message": "rank 2 dropped 3 records",
        "count": 3,
        "reason": "queue_full",
    }
    assert MetricsLost(12, "12 bytes").to_json() == {
        "kind": "metrics_lost",
        "rank": None,
        "bytes": 12,
        "message": "12 bytes",
    }
    made = {"t": 1.0, "kind": "recovered", "rank": 0, "message": "m", "of": "stalled"}
    relayed = Relayed(made)
    assert (
        relayed.kind == "recovered" and relayed.to_json() == made and relayed.to_json() is not made
    )


def test_every_kind_is_documented_in_the_contract() -> None:
    text = _CONTRACTS.read_text(encoding="utf-8")
    section = text[text.index("### events.jsonl"):text.index("### The other files")]
    named = set(re.findall(r"`([a-z_0-9]+)`", section))
    assert {kind.value for kind in EventKind} <= named, sorted(
        {kind.value for kind in EventKind} - named
    )
