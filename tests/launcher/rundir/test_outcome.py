"""The one rank-outcome rule and the one Failure (xl.launcher.rundir.outcome).

Every part of xl that decides how a rank came out (the supervisor, settling a run nobody
supervises, the reader) applies ``rank_outcome``; these pin its four steps, first match wins.
"""

from __future__ import annotations

import pytest

from xl.launcher.rundir.outcome import DONE_STATES, LIVE_STATES, Failure, RankPhase, rank_outcome


@pytest.mark.parametrize("recorded", [None, "running", "failed", "stopped"])
def test_exit_code_0_is_exited_whatever_was_said_of_it(recorded: str | None) -> None:
    assert rank_outcome(0, stopped=True, recorded=recorded, blamed=False) is RankPhase.EXITED


@pytest.mark.parametrize("recorded", ["exited", "failed", "stopped"])
def test_an_outcome_already_recorded_stands(recorded: str) -> None:
    assert rank_outcome(1, stopped=recorded != "failed", recorded=recorded).value == recorded
    assert rank_outcome(None, stopped=False, recorded=recorded, blamed=False).value == recorded


@pytest.mark.parametrize("recorded", [None, "starting", "running", 3, "garbage"])
def test_a_stop_or_another_rank_s_failure_means_stopped(recorded: object) -> None:
    assert rank_outcome(-15, stopped=True, recorded=recorded) is RankPhase.STOPPED
    assert rank_outcome(1, stopped=False, recorded=recorded, blamed=False) is RankPhase.STOPPED
    assert rank_outcome(None, stopped=True, recorded=recorded) is RankPhase.STOPPED


def test_otherwise_failed() -> None:
    assert rank_outcome(1, stopped=False) is RankPhase.FAILED
    assert rank_outcome(None, stopped=False) is RankPhase.FAILED  # vanished, or never started
    assert rank_outcome(-9, stopped=False, recorded="running") is RankPhase.FAILED


def test_states_are_run_json_s() -> None:
    assert {"exited", "failed", "stopped"} == DONE_STATES and {"starting", "running"} == LIVE_STATES
    assert all(RankPhase(s).done for s in DONE_STATES) and not any(
        RankPhase(s).done for s in LIVE_STATES
    )


def test_failure_round_trips_run_json_s_keys_host_under_node() -> None:
    cause = {
        "kind": "exception",
        "summary": "ValueError: x",
        "fix": None,
        "evidence": ["ValueError: x"],
    }
    data = {
        "rank": 1,
        "exit_code": 1,
        "traceback": "tb",
        "error": "ValueError: x",
        "message": "m",
        "node": "vm",
        "node_rank": 0,
        "cause": cause,
    }
    failure = Failure.from_json(data)
    assert failure.host == "vm" and failure.node_rank == 0
    assert failure.cause is not None and failure.cause.kind.value == "exception"
    assert failure.to_json() == data and list(failure.to_json()) == list(data)
    # A run recorded before causes existed has none; an unknown kind (a newer xl's) reads as
    # the script's own exception, never an error.
    old = {k: v for k, v in data.items() if k != "cause"}
    assert (
        Failure.from_json(old).cause is None and Failure.from_json(old).to_json()["cause"] is None
    )
    newer = Failure.from_json({**data, "cause": {**cause, "kind": "quantum_flux", "fix": 3}}).cause
    assert newer is not None and newer.kind.value == "exception" and newer.fix is None
