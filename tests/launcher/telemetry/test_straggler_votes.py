"""The straggler votes decide from each tick's Evidence alone: no diagnoser behind them."""

from __future__ import annotations

from xl.launcher.telemetry.diagnose import Thresholds
from xl.launcher.telemetry.diagnosis import Evidence, Recovered, Straggler, WaitBlame
from xl.launcher.telemetry.straggler_votes import Stragglers

TH = Thresholds(straggler_sustain=3, straggler_window_s=10.0)
# xl.watch's waits at the all-reduce: rank 2 waits 5 ms, the others 80 ms (for it).
SLOW_2 = Evidence({}, {0: 0.08, 1: 0.08, 2: 0.005}, {}, {})
EVEN = Evidence({}, {0: 0.04, 1: 0.04, 2: 0.04}, {}, {})


def test_a_rank_the_waits_blame_is_named_after_sustained_votes_then_cleared() -> None:
    votes = Stragglers(TH)
    said = [d for t in range(5) for d in votes.check(1000.0 + t, SLOW_2)]
    assert len(said) == 1 and isinstance(said[0], Straggler)
    named = said[0]
    assert named.rank == 2 and isinstance(named.blame, WaitBlame)
    assert named.blame.victims == (0, 1) and votes.named() == {2}
    line = named.event().to_json()
    assert (line["kind"], line["method"], line["phase"], line["lasting"]) == (
        "straggler",
        "collective_wait",
        None,
        "transient",
    )
    assert line["message"].startswith("rank 2 is the straggler: it waits 5 ms per step")
    cleared = [d for t in range(5, 8) for d in votes.check(1000.0 + t, EVEN)]
    assert cleared == [Recovered(2, "rank 2 is no longer a straggler", cleared[0].of)]
    assert cleared[0].event().to_json()["of"] == "straggler" and votes.named() == set()


def test_ranks_that_wait_alike_name_nobody() -> None:
    votes = Stragglers(TH)
    assert [d for t in range(10) for d in votes.check(1000.0 + t, EVEN)] == []
    assert votes.named() == set()


def test_a_spell_that_lasts_is_said_again_as_chronic() -> None:
    votes = Stragglers(TH)
    said = [d for t in range(0, 70) for d in votes.check(1000.0 + t, SLOW_2)]
    assert [d.event().to_json()["lasting"] for d in said] == ["transient", "chronic"]
    assert said[1].event().to_json()["message"].endswith("(chronic: for 60 s)")
