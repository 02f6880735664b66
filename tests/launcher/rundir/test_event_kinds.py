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
    EventLine,
    FailureEvent,
    FromNode,
    Hang,
    MetricsLost,
    NodeNotice,
    NodeRefused,
    Notice,
    RankExited,
    RankStarted,
    Restarted,
    RunEnded,
    WriteLost,
    event_line,
    parse_event,
    parse_lines,
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
    notice = Notice(EventKind.COLLECTOR_REOPENED, "it listens again", 10.0)
    assert list(json.loads(event_line(notice)).items()) == [
        ("t", 10.0),
        ("kind", "collector_reopened"),
        ("message", "it listens again"),
        ("rank", None),
    ]
    # What the hang capture reads of a diagnosis, typed: its idle time, what a recovery ends.
    assert (stalled.idle_s, stalled.of) == (30.0, None)
    recovered = Diagnosis(EventKind.RECOVERED, 0, "m", {"of": "stalled"}, t=1.0)
    assert (recovered.of, recovered.idle_s) == (EventKind.STALLED, None)
    assert Diagnosis(EventKind.RECOVERED, 0, "m", {"of": "paused"}).of is None


def test_every_kind_is_documented_in_the_contract() -> None:
    text = _CONTRACTS.read_text(encoding="utf-8")
    section = text[text.index("### events.jsonl"):text.index("### The other files")]
    named = set(re.findall(r"`([a-z_0-9]+)`", section))
    assert {kind.value for kind in EventKind} <= named, sorted(
        {kind.value for kind in EventKind} - named
    )


def _read(line: str) -> EventLine:
    """A line as every reader gets it: decoded, then parsed once."""
    [read] = parse_lines([line.rstrip("\n").encode()])
    return read


def test_a_written_line_reads_back_as_its_kind_with_its_fields_typed() -> None:
    cause = Cause(CauseKind.CUDA_OOM, "CUDA out of memory", "lower the batch", ["OOM"])
    failure = Failure(1, 1, None, None, "rank 1 failed first", "vm", 0, cause)
    read = _read(event_line(FailureEvent(failure)))
    assert (read.kind, read.rank, read.exit_code, read.node, read.node_rank) == (
        EventKind.FAILURE, 1, 1, "vm", 0)
    assert read.cause == cause and read.message == "rank 1 failed first" and read.t is not None
    hang = _read(event_line(Hang(8.0, 1, [1, 3], "ranks 1,3 are stuck", "stacks/8.json", [3])))
    assert (hang.kind, hang.t, hang.ranks, hang.busy, hang.stacks) == (
        EventKind.HANG, 8.0, (1, 3), (3,), "stacks/8.json")
    recovered = _read(event_line(Diagnosis(EventKind.RECOVERED, 2, "ok", {"of": "stalled"})))
    assert recovered.of is EventKind.STALLED and recovered.rank == 2
    stalled = _read(event_line(Diagnosis(
        EventKind.STALLED, 0, "waits", {"idle_s": 31.5, "waiting_on": [1]})))
    assert (stalled.idle_s, stalled.waiting_on, stalled.phase) == (31.5, (1,), None)
    ended = _read(event_line(RunEnded("failed", "run failed")))
    assert (ended.kind, ended.status, ended.rank, ended.said) == (
        EventKind.RUN_ENDED, "failed", None, "run failed")
    assert {_read(event_line(Notice(k, "m"))).kind for k in EventKind} == set(EventKind)


def test_a_kind_xl_does_not_write_and_keys_it_does_not_know_are_kept() -> None:
    """Another tool's line, or a newer xl's: nothing of it is lost, and it is no kind of ours."""
    obj = {"t": 3.0, "kind": "checkpoint_saved", "rank": 0, "path": "/ckpt/7", "step": 7}
    read = _read(json.dumps(obj))
    assert (read.kind, read.name, read.rank, read.message, read.said) == (
        None, "checkpoint_saved", 0, "", "checkpoint_saved")
    assert read.data == obj and read.to_json() == obj
    # Extra keys on one of ours stay too, and a reworded event keeps them.
    ours = _read(json.dumps({"kind": "rank_exited", "rank": 1, "exit_code": 0, "host_note": "x"}))
    assert ours.kind is EventKind.RANK_EXITED and ours.data["host_note"] == "x"
    assert ours.reworded("rank 1 done").to_json() == {**ours.data, "message": "rank 1 done"}


def test_values_that_are_not_what_the_contract_says_read_as_missing() -> None:
    odd = _read(json.dumps({
        "t": "soon", "kind": "stalled", "rank": True, "message": None, "waiting_on": "rank 1",
        "idle_s": float("nan"), "exit_code": 1.5, "of": "nothing", "ranks": [1, "2", None],
    }))
    assert (odd.t, odd.rank, odd.message, odd.waiting_on, odd.idle_s) == (None, None, "", (), None)
    assert (odd.exit_code, odd.of, odd.ranks) == (None, None, (1,))
    assert parse_event([1, 2]) is None and parse_event("stalled") is None
    assert [e.name for e in parse_lines([b"{broken", b"[1]", b'{"kind": 5}', b"\xff"])] == [""]


def test_a_time_is_any_finite_json_number_and_nothing_else() -> None:
    """An int time reads as its float, a message that is not text as its text; a time no float
    holds (NaN, infinity, an int past a float's range, true) reads as no time, never an error."""
    times = [b"12", b"12.5", b"NaN", b"Infinity", b"1e999", b"1" + b"0" * 400, b"true", b'"12"']
    read = parse_lines(
        [b'{"kind": "stalled", "rank": 2, "message": 7, "t": %s}' % t for t in times]
    )
    assert [e.t for e in read] == [12.0, 12.5, None, None, None, None, None, None]
    assert {(e.kind, e.rank, e.message) for e in read} == {(EventKind.STALLED, 2, "7")}
