"""Which printed bars and dicts are steps (launcher/telemetry/logfeed.py), and the Telemetry
that stores them: held before a rank's first step under instrumentation, dropped when it
announces, let through after the hold when it never does, never held without instrumentation."""

from __future__ import annotations

import json
import time
from pathlib import Path

from xl import wire
from xl.launcher.telemetry.logfeed import OutputSteps
from xl.launcher.telemetry.service import Telemetry


def _bar(rank: int, step: int, t: float) -> dict:
    return {"t": t, "rank": rank, "kind": "train", "step": step, "source": "log"}


def test_without_instrumentation_every_bar_is_a_step_at_once() -> None:
    p = OutputSteps(instrumented=False, hold_s=60)
    assert p.take(0, _bar(0, 320, 1.0), 1.0) == [_bar(0, 320, 1.0)]
    assert p.due(1000.0) == []


def test_bars_before_the_first_step_are_held_then_dropped_when_the_rank_announces() -> None:
    p = OutputSteps(instrumented=True, hold_s=60)
    assert p.take(0, _bar(0, 320, 1.0), 1.0) == []  # datasets' Map 320/320
    assert p.take(0, _bar(0, 41, 2.0), 2.0) == []  # Loading weights 41/41
    assert p.take(1, _bar(1, 320, 2.0), 2.0) == []
    p.announced(0)  # rank 0's first optimizer step
    assert p.dropped == 2
    assert p.take(0, _bar(0, 5, 3.0), 3.0) == []  # its training bar: its own steps say more
    assert p.due(100.0) == [_bar(1, 320, 2.0)], "rank 1 never announced: its hold ran out"
    assert p.take(1, _bar(1, 321, 101.0), 101.0) == [_bar(1, 321, 101.0)]


def test_a_rank_that_never_announces_gets_its_bars_after_the_hold_in_order() -> None:
    p = OutputSteps(instrumented=True, hold_s=10)
    for i in range(1, 10):
        assert p.take(0, _bar(0, i, float(i)), float(i)) == []
    released = p.take(0, _bar(0, 11, 11.0), 11.0)
    assert [r["step"] for r in released] == [*range(1, 10), 11]
    assert p.due(1000.0) == [] and p.dropped == 0


def _train(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return (
        [json.loads(x) for x in path.read_text().splitlines() if '"train"' in x]
        if path.exists()
        else []
    )


def test_telemetry_holds_bars_when_instrumented_and_stores_them_after_the_hold(
    tmp_path: Path, monkeypatch
) -> None:
    bar = "Map: 100%|##########| 320/320 [00:00<00:00, 5000.00 examples/s]"
    monkeypatch.setenv("XL_PRINTED_HOLD_S", "3600")
    held = Telemetry(
        tmp_path / "held", token="tok-0123456789abcdef", inventory=False, instrumented=True
    )
    held.start()
    held.feed_log_line(0, bar)
    held.stop()  # every line queued is parsed first
    assert _train(tmp_path / "held") == [] and held.output_steps.dropped == 0
    plain = Telemetry(
        tmp_path / "plain", token="tok-0123456789abcdef", inventory=False, instrumented=False
    )
    plain.start()
    plain.feed_log_line(0, bar)
    plain.stop()
    assert [(r["rank"], r["step"]) for r in _train(tmp_path / "plain")] == [(0, 320)]
    monkeypatch.setenv("XL_PRINTED_HOLD_S", "0.2")
    tel = Telemetry(
        tmp_path / "due", token="tok-0123456789abcdef", inventory=False, instrumented=True
    )
    tel.start()
    try:
        tel.feed_log_line(0, bar)
        deadline = time.monotonic() + 60
        while not _train(tmp_path / "due"):  # the 1 Hz loop lets it out once its hold ran out
            assert time.monotonic() < deadline, "the held bar never came out"
            time.sleep(0.1)
    finally:
        tel.stop()
    assert [(r["rank"], r["step"]) for r in _train(tmp_path / "due")] == [(0, 320)]


def test_a_rank_that_reports_its_own_steps_is_never_stepped_by_what_it_prints(
    tmp_path: Path,
) -> None:
    """Held bars are dropped when the rank's own train line comes, and later bars are not steps."""
    tel = Telemetry(tmp_path, token="tok-0123456789abcdef", inventory=False, instrumented=True)
    tel.start()
    try:
        tel.feed_log_line(0, "Loading weights: 100%|##########| 41/41 [00:00<00:00, 400.00it/s]")
        tel.log_feed.stop()  # parsed and held
        # The rank's first frame with its own train line, as the collector takes it.
        assert tel.collector is not None
        own = wire.Header(0, 1234, 1, 0, None, train=True)
        rec = {"t": time.time(), "rank": 0, "kind": "train", "step": 1, "loss": 2.0}
        tel.collector._note_peer(own, [rec])
        assert tel.output_steps.dropped == 1
        tel.output_steps.hold_s = 0.0  # were they taken for steps, nothing would hold them now
        tel.log_feed.start()
        tel.feed_log_line(0, " 50%|#####     | 5/10 [00:01<00:01,  4.00it/s]")
        tel.feed_log_line(0, "{'loss': 0.5, 'epoch': 1.0}")
    finally:
        tel.stop()
    assert _train(tmp_path) == []  # the rank's own line went through the collector, not here


def test_a_rank_that_sends_only_its_figures_keeps_its_printed_steps(tmp_path: Path) -> None:
    """A rank whose frames say it reports no train records of its own (no "train" in the
    header, only sys lines: a script run with --no-instrument that never calls xl.log) has its
    printed bars as its steps."""
    tel = Telemetry(tmp_path, token="tok-0123456789abcdef", inventory=False, instrumented=False)
    tel.start()
    try:
        assert tel.collector is not None
        figures = wire.Header(0, 1234, 1, 0, None, train=False)
        tel.collector._note_peer(figures, [{"t": time.time(), "rank": 0, "kind": "sys"}])
        tel.feed_log_line(0, " 50%|#####     | 5/10 [00:01<00:01,  4.00it/s]")
    finally:
        tel.stop()
    assert [rec["step"] for rec in _train(tmp_path)] == [5]
