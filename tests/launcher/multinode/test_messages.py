"""What a node > 0 sends node 0, as typed values made one JSON line each at the link's write.

What a person notices: run.json on node 0 shows every node's ranks with the keys docs/contracts.md
names, in their order, a key another xl wrote kept as it came; node 0 reads back exactly what was
sent; a line node 0 must refuse is still refused.
"""

from __future__ import annotations

import json

import pytest

from xl import wire
from xl.launcher.multinode.protocol import (
    EndMessage,
    FailureMessage,
    LogsMessage,
    RanksMessage,
    StacksMessage,
    parse_message,
)
from xl.launcher.rundir.outcome import Cause, CauseKind, Failure, RankPhase
from xl.launcher.rundir.runrecord import RunStatus
from xl.launcher.supervisor.hub import RemoteNode
from xl.launcher.supervisor.loop import _with_figures
from xl.launcher.supervisor.ranks import RankRow

ROW_KEYS = ["rank", "local_rank", "node", "node_rank", "pid", "gpu", "gpu_uuid", "state",
            "exit_code", "started_at", "ended_at", "attempt"]


def _line(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _failed_rank() -> RankRow:
    st = RankRow(3, 1, "vm-b", 0, "GPU-3", node_rank=1, pid=4242, attempt=2)
    st.state, st.exit_code, st.started_at, st.ended_at = RankPhase.FAILED, 1, 100.5, 130.25
    return st


def test_a_rank_s_row_keeps_run_json_s_keys_and_order_and_gains_the_end_s_figures() -> None:
    fresh = RankRow(0, 0, "vm-a", None, None).row().to_json()
    assert list(fresh) == ROW_KEYS and fresh["state"] == "starting" and fresh["gpu"] is None
    ended = _failed_rank().row()
    assert ended.to_json() == dict(zip(ROW_KEYS, [3, 1, "vm-b", 1, 4242, 0, "GPU-3", "failed", 1,
                                                  100.5, 130.25, 2], strict=True))
    # The end's figures follow, in their order; a rank the end did not measure stays as it was.
    measured = _with_figures(ended, {"samples_per_s": 41.5, "waited_s": 1.25}).to_json()
    assert list(measured) == [*ROW_KEYS, "waited_s", "samples_per_s"]
    assert _with_figures(ended, None).to_json() == ended.to_json()


def test_node_0_keeps_a_node_s_rows_as_they_came_with_the_node_named() -> None:
    sent = _failed_rank().row().to_json()
    other = {"rank": 5, "local_rank": 0, "state": "running", "from_a_newer_xl": "kept"}
    line = _line(RanksMessage((_failed_rank().row(),)).to_json())
    assert line == _line({"type": "ranks", "ranks": [sent]})  # the wire's line, as before
    node = RemoteNode(1, host="vm-b")
    got = parse_message(json.loads(_line({"type": "ranks", "ranks": [sent, other]})), 1)
    assert isinstance(got, RanksMessage)
    node.take_ranks(got.ranks)
    first, second = (r.to_json() for r in node.ranks)
    assert _line(first) == _line(sent)  # named already: byte for byte
    assert second == {**other, "node": "vm-b", "node_rank": 1}  # unusual, kept, its node added
    assert node.rank_numbers() == [3, 5] and node.idle_since is None  # rank 5 still runs
    with pytest.raises(wire.FrameError):  # a row without a rank number is refused
        parse_message({"type": "ranks", "ranks": [{"rank": "three"}]}, 1)


def test_what_a_node_sends_reads_back_the_same_at_node_0() -> None:
    cause = Cause(CauseKind.PORT_IN_USE, "port 29500 taken", "set XL_COLLECTOR_PORT", ["in use"])
    failure = Failure(3, 1, "Traceback ...", "OSError", "rank 3 failed", "vm-b", 1, cause)
    for msg in (
        FailureMessage(failure, 130.25),
        EndMessage(RunStatus.FAILED, FailureMessage(failure, 131.0), 131.0),
        EndMessage(RunStatus.SUCCEEDED, None, 131.0),
        LogsMessage("ask-1", 3, 0, None, 0),
        StacksMessage("ask-2", [{"rank": 3, "pid": 4242, "threads": []}]),
    ):
        assert parse_message(json.loads(_line(msg.to_json())), 1) == msg
    end = EndMessage(RunStatus.FAILED, FailureMessage(failure, 131.0), 131.0).to_json()
    assert list(end) == ["type", "status", "failure", "at"] and end["failure"] == failure.to_json()
