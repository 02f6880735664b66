"""The rule before a stacks verdict may name a culprit: the run is stalled, read from its run
dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from eventlines import Lines, stall
from procs import wait_for

from xl.launcher.stacks.model import RankStacks
from xl.launcher.stacks.verdict import where
from xl.launcher.telemetry.diagnose import Thresholds
from xl.launcher.telemetry.stall import judge, judged

NOW = 1_000_000.0
TH = Thresholds(stall_min_s=30.0, stall_factor=10.0)


def _write(
    run_dir: Path,
    metrics: list[dict[str, Any]] = (),  # type: ignore[assignment]
    events: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> Path:
    run_dir.mkdir(exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return run_dir


def _steps(rank: int, last_t: float, step_s: float, n: int = 20) -> list[dict[str, Any]]:
    return [
        {
            "t": last_t - (n - 1 - i) * step_s,
            "rank": rank,
            "kind": "train",
            "step": i + 1,
            "loss": 1.0,
        }
        for i in range(n)
    ]


def _read(entries: list[dict[str, Any]]) -> list[RankStacks]:
    """Entries as the stacks document holds them, read as the product reads them."""
    return [RankStacks.from_json(e) for e in entries]


def _one(entry: dict[str, Any]) -> RankStacks:
    return RankStacks.from_json(entry)


def _culprit_snapshot() -> list[dict[str, Any]]:
    """Rank 0 waits in all_reduce #12, rank 1 computes: what a one-look verdict blames rank 1
    for."""
    frames = [{"file": "/home/me/train.py", "line": 40, "function": "main"}]
    waiting = {
        "rank": 0,
        "threads": [
            {
                "name": "MainThread",
                "frames": [
                    *frames,
                    {
                        "file": "/v/site-packages/torch/distributed/distributed_c10d.py",
                        "line": 1,
                        "function": "all_reduce",
                    },
                ],
            }
        ],
        "collectives": [
            {"pg": "0", "seq": 11, "op": "all_reduce", "state": "completed"},
            {"pg": "0", "seq": 12, "op": "all_reduce", "state": "scheduled"},
        ],
    }
    computing = {
        "rank": 1,
        "threads": [
            {
                "name": "MainThread",
                "frames": [
                    *frames,
                    {"file": "/home/me/train.py", "line": 21, "function": "compute"},
                ],
            }
        ],
        "collectives": [{"pg": "0", "seq": 11, "op": "all_reduce", "state": "completed"}],
    }
    return [waiting, computing]


def test_progressing_ranks_get_no_culprit_whatever_the_snapshot_shows(tmp_path: Path) -> None:
    run = _write(tmp_path / "r", _steps(0, NOW - 0.2, 0.3) + _steps(1, NOW - 0.5, 0.3))
    progress = judge(run, [0, 1], _read(_culprit_snapshot()), now=NOW, thresholds=TH)
    assert progress.stalled is False
    assert judged(_read(_culprit_snapshot()), progress).to_json() == {
        "ranks": [],
        "message": "no hang: every rank progressed in the last 30 s",
    }


def test_no_progress_for_the_threshold_names_the_culprit(tmp_path: Path) -> None:
    run = _write(tmp_path / "r", _steps(0, NOW - 31, 0.3) + _steps(1, NOW - 32, 0.3))
    progress = judge(run, [0, 1], _read(_culprit_snapshot()), now=NOW, thresholds=TH)
    assert progress.stalled is True
    v = judged(_read(_culprit_snapshot()), progress).to_json()
    assert v["ranks"] == [1] and v["message"].startswith(
        "rank 1 never entered all_reduce #12: it is in compute at train.py:21"
    )


def test_a_slow_step_stretches_the_threshold_as_the_diagnoser_does(tmp_path: Path) -> None:
    # 5 s steps: 10 x 5 s = 50 s before a rank counts as stalled; 40 s without a step is no hang.
    run = _write(tmp_path / "r", _steps(0, NOW - 40, 5.0) + _steps(1, NOW - 40, 5.0))
    progress = judge(run, [0, 1], now=NOW, thresholds=TH)
    assert (
        progress.stalled is False
        and progress.message == "no hang: every rank progressed in the last 50 s"
    )
    assert judge(run, [0, 1], now=NOW + 11, thresholds=TH).stalled is True


def test_one_rank_behind_while_another_progresses_is_no_hang_and_says_which(tmp_path: Path) -> None:
    run = _write(tmp_path / "r", _steps(0, NOW - 1, 0.3) + _steps(1, NOW - 45, 0.3))
    progress = judge(run, [0, 1, 2], now=NOW, thresholds=TH)
    assert progress.stalled is False
    assert (
        progress.message
        == "no hang: rank 0 progressed in the last 30 s (rank 1: none for 45 s; rank 2 reports "
        "none)"
    )


def test_the_hang_diagnosis_stands_until_a_rank_recovers(tmp_path: Path) -> None:
    hang = {"t": NOW - 5, "kind": "hang", "ranks": [1], "message": "..."}
    run = _write(tmp_path / "r", _steps(0, NOW - 1, 0.3), [hang])
    assert judge(run, [0, 1], now=NOW, thresholds=TH).stalled is True
    recovered = {"t": NOW - 2, "kind": "recovered", "rank": 0, "of": "stalled", "message": "..."}
    run = _write(tmp_path / "r", _steps(0, NOW - 1, 0.3), [hang, recovered])
    assert judge(run, [0, 1], now=NOW, thresholds=TH).stalled is False


def test_ranks_that_log_nothing_are_judged_by_their_collectives(tmp_path: Path) -> None:
    run = _write(tmp_path / "r")
    snap = _culprit_snapshot()
    for e in snap:
        for c in e["collectives"]:
            c["t"] = NOW - 0.4
    assert judge(run, [0, 1], _read(snap), now=NOW, thresholds=TH).stalled is False
    assert judge(run, [0, 1], _read(snap), now=NOW + 60, thresholds=TH).stalled is True
    # Nothing at all to tell: no culprit, and the message says why.
    unknown = judge(run, [0, 1], _read(_culprit_snapshot()), now=NOW, thresholds=TH)
    assert unknown.stalled is None and judged(_read(_culprit_snapshot()), unknown).ranks == ()
    assert "a hang cannot be told from a slow step" in unknown.message


def test_where_names_the_persons_innermost_frame_and_what_it_calls() -> None:
    frames = [
        {"file": "/usr/lib/python3.11/runpy.py", "line": 198, "function": "_run_module_as_main"},
        {"file": "/home/me/train.py", "line": 50, "function": "main"},
        {"file": "/home/me/train.py", "line": 19, "function": "parse_record"},
        {"file": "/usr/lib/python3.11/re/__init__.py", "line": 166, "function": "match"},
    ]
    entry = {"rank": 1, "threads": [{"name": "MainThread", "frames": frames}]}
    assert where(RankStacks.from_json(entry)) == "parse_record at train.py:19 (calling re.match)"
    # A decorator's wrapper is skipped for the call the person wrote; the innermost user frame alone
    # has no call.
    torch_call = [
        *frames[:3],
        {
            "file": "/v/lib/python3.11/site-packages/torch/distributed/c10d_logger.py",
            "line": 81,
            "function": "wrapper",
        },
        {
            "file": "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
            "line": 2700,
            "function": "all_reduce",
        },
    ]
    assert (
        where(_one({"threads": [{"name": "MainThread", "frames": torch_call}]}))
        == "parse_record at train.py:19 (calling torch.distributed.distributed_c10d.all_reduce)"
    )
    assert (
        where(_one({"threads": [{"name": "MainThread", "frames": frames[:3]}]}))
        == "parse_record at train.py:19"
    )


def test_the_hang_capture_follows_the_same_rule_and_asks_again_while_the_stall_lasts(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import time  # noqa: PLC0415 - only this test needs the wall clock

    from xl.launcher.stacks import gather as capture  # noqa: PLC0415 - patched below
    from xl.launcher.stacks.hang import HangCapture  # noqa: PLC0415 - as above

    now = time.time()
    run = _write(tmp_path / "r", _steps(0, now - 1, 0.3) + _steps(1, now - 1, 0.3))
    snap = _read(_culprit_snapshot())
    monkeypatch.setattr(capture, "gather", lambda *a, **k: (time.time(), snap))
    monkeypatch.setenv("XL_STALL_MIN_S", "30")
    sent = Lines()
    hang = HangCapture(
        run,
        sent,
        lambda: [{"rank": 0, "pid": 1}, {"rank": 1, "pid": 2}],
        timeout=0.5,
        retry_s=0.1,
        retries=100,
    )
    stalled = stall(1, "rank 1 made no progress for 31 s")
    said = [("stalled", 1, stalled.message)]
    hang.on_stall([stalled])
    # Rank 0 still progresses: no hang event, no stacks file, the stall as the diagnoser said it.
    wait_for(lambda: _said(sent) == said, timeout=10, what="the stall, unchanged")
    time.sleep(0.3)
    assert _said(sent) == said and not (run / "stacks").exists()
    # Nothing moves any more: a retry names the hang with no new stall (the diagnoser says a
    # stall once; a loaded machine's first look can come while a rank has just begun its op).
    _write(run, _steps(0, now - 40, 0.3) + _steps(1, now - 40, 0.3))
    wait_for(lambda: len(sent) == 3, timeout=10, what="the hang, named on a retry")
    assert (
        sent[1]["kind"] == "hang"
        and sent[1]["ranks"] == [1]
        and (run / sent[1]["stacks"]).is_file()
    )
    # The stall said before the verdict is said again with it: the culprit, and where it is.
    assert (
        sent[2]["kind"] == "stalled"
        and sent[2]["rank"] == 1
        and sent[2]["message"].startswith(stalled.message + "; it is in ")
    )
    hang.on_stall([stall(0, stalled.message)])  # later stalls of the same hang take its verdict
    hang.join(5)
    assert [e["kind"] for e in sent] == ["stalled", "hang", "stalled", "stalled"]
    assert sent[3]["waiting_on"] == [1] and sent[3]["message"].startswith("rank 0 waits in ")


def test_a_stall_that_is_no_hang_is_asked_again_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import time  # noqa: PLC0415 - only this test needs the wall clock

    from xl.launcher.stacks import gather as capture  # noqa: PLC0415 - patched below
    from xl.launcher.stacks.hang import HangCapture  # noqa: PLC0415 - as above

    asked: list[float] = []

    def gather(*_a: Any, **_k: Any) -> tuple[float, list[dict[str, Any]]]:
        asked.append(time.time())
        # both ranks keep training
        _write(run, _steps(0, time.time(), 0.3) + _steps(1, time.time(), 0.3))
        return time.time(), _read(_culprit_snapshot())

    run = _write(tmp_path / "r")
    monkeypatch.setattr(capture, "gather", gather)
    monkeypatch.setenv("XL_STALL_MIN_S", "30")
    sent = Lines()
    ranks = lambda: [{"rank": 0, "pid": 1}, {"rank": 1, "pid": 2}]  # noqa: E731 - a one-line table
    stalled = stall(1, "rank 1 made no progress for 31 s")
    hang = HangCapture(run, sent, ranks, timeout=0.5, retry_s=0.02, retries=3)
    hang.on_stall([stalled])
    wait_for(lambda: len(asked) == 4, timeout=10, what="the first capture and its 3 retries")
    time.sleep(0.2)
    said = [("stalled", 1, stalled.message)]
    assert len(asked) == 4 and _said(sent) == said and not (run / "stacks").exists()
    # The run recovers (no rank stalled): the retries of a hang that is over end at once.
    hang = HangCapture(run, sent, ranks, timeout=0.5, retry_s=0.05, retries=1000)
    asked.clear()
    hang.on_stall([stalled])
    wait_for(lambda: len(asked) >= 2, timeout=10, what="a retry")
    hang.over()
    time.sleep(0.1)
    count = len(asked)
    time.sleep(0.3)
    assert len(asked) == count and [e["kind"] for e in sent] == ["stalled", "stalled"]
    hang.join(5)


def _said(sent: Lines) -> list[tuple[object, object, object]]:
    """What each line sent says: its kind, its rank and its message."""
    return [(e["kind"], e["rank"], e["message"]) for e in sent]


def _sys(rank: int, now: float, cpu: float, n: int = 12) -> list[dict[str, Any]]:
    """The sampler's 1 Hz records of a rank, the newest a second before ``now``."""
    return [
        {"t": now - n + i, "rank": rank, "kind": "sys", "pid": 100 + rank, "cpu_pct": cpu}
        for i in range(n)
    ]


def test_recent_cpu_is_the_mean_of_the_last_ten_seconds_and_needs_three_samples(
    tmp_path: Path,
) -> None:
    from xl.launcher.telemetry.stall import recent_cpu  # noqa: PLC0415 - only this test reads it alone

    # before the window: not counted
    old = [{**r, "t": r["t"] - 60, "cpu_pct": 0.0} for r in _sys(0, NOW, 0.0)]
    run = _write(
        tmp_path / "r", [*old, *_sys(0, NOW, 96.0), *_sys(1, NOW, 1.5), *_sys(2, NOW, 50.0, n=2)]
    )
    assert recent_cpu(run, NOW) == {0: 96.0, 1: 1.5}
    # Only since the rank's last progress: the steps before its stall are not what it does now.
    training = [{**r, "cpu_pct": 100.0} for r in _sys(0, NOW - 4, 0.0, n=6)]
    run = _write(tmp_path / "r", [*training, *_steps(0, NOW - 4.5, 0.3), *_sys(0, NOW, 2.0, n=4)])
    assert recent_cpu(run, NOW) == {0: 2.0}


def test_a_rank_asleep_right_after_its_last_step_is_not_working(tmp_path: Path) -> None:
    # The sampler's record just after the last step still holds that step's work (its figure is
    # the CPU since the record before): left out, the rank that went to sleep reads ~0, not the
    # ~30% a mean with it said (a sleeping rank called "working" at a 3 s stall threshold).
    from xl.launcher.telemetry.stall import recent_cpu  # noqa: PLC0415 - as above

    training = [{**r, "cpu_pct": 100.0} for r in _sys(1, NOW - 4, 0.0, n=6)]  # up to NOW-5
    straddling = _sys(1, NOW - 3, 90.0, n=1)  # NOW-4: its second held the last step at NOW-4.5
    asleep = _sys(1, NOW, 0.4, n=3)  # NOW-3 .. NOW-1
    run = _write(tmp_path / "r", [*training, *_steps(1, NOW - 4.5, 0.3), *straddling, *asleep])
    assert recent_cpu(run, NOW) == {1: 0.4}
    # Still working after its last step: every record since says so.
    working = _sys(1, NOW, 97.0, n=3)
    run = _write(tmp_path / "r", [*training, *_steps(1, NOW - 4.5, 0.3), *straddling, *working])
    assert recent_cpu(run, NOW) == {1: 97.0}
    # Two whole seconds since the last step are too few to say.
    run = _write(tmp_path / "r", [*training, *_steps(1, NOW - 4.5, 0.3), *straddling, *asleep[1:]])
    assert recent_cpu(run, NOW) == {}


@pytest.mark.parametrize(("cpu", "label"), [(97.0, "stalled"), (1.0, "hang")])
def test_a_culprit_working_on_the_cpu_is_shown_as_a_stall_and_one_blocked_as_a_hang(
    tmp_path: Path, monkeypatch: Any, cpu: float, label: str
) -> None:
    """Rank 1 has made no progress for 40 s while rank 0 waits for it: computing at 97% CPU (a long
    evaluation, or an endless loop) it is a stall that says so; at 1% (blocked) it is a hang."""
    import time  # noqa: PLC0415 - only these tests need the wall clock

    from xl.launcher.rundir.events import parse_event  # noqa: PLC0415 - the event as read back
    from xl.launcher.stacks import gather as capture  # noqa: PLC0415 - patched below
    from xl.launcher.stacks.hang import HangCapture  # noqa: PLC0415 - as above
    from xl.launcher.view.runview import HangRule, hang_label  # noqa: PLC0415 - the readers of the event

    now = time.time()
    run = _write(
        tmp_path / "r",
        _steps(0, now - 40, 0.3) + _steps(1, now - 40, 0.3) + _sys(0, now, 0.5) + _sys(1, now, cpu),
    )
    snap = _read(_culprit_snapshot())
    monkeypatch.setattr(capture, "gather", lambda *a, **k: (time.time(), snap))
    monkeypatch.setenv("XL_STALL_MIN_S", "30")
    sent = Lines()
    hang = HangCapture(
        run, sent, lambda: [{"rank": 0, "pid": 1}, {"rank": 1, "pid": 2}], timeout=0.5
    )
    hang.on_stall([stall(1, "rank 1 made no progress for 40 s")])
    wait_for(lambda: len(sent) == 2, timeout=10, what="the hang and the stall")
    hang.join(5)
    event, stalled = sent
    working = f"working at {cpu:.0f}% CPU (a long computation, or a loop that never ends)"
    assert event["kind"] == "hang" and event["ranks"] == [1]
    assert event["busy"] == ([1] if label == "stalled" else [])
    assert (working in event["message"]) == (label == "stalled") and (
        working in stalled["message"]
    ) == (label == "stalled")
    assert "it is in compute at train.py:21" in event["message"]
    saved = json.loads((run / event["stacks"]).read_text())
    assert {e["rank"]: e["cpu_pct"] for e in saved["ranks"]} == {0: 0.5, 1: cpu}
    # What the plain view, `xl attach` and the Monitor's banner call it.
    read = parse_event(json.loads(json.dumps(event)))
    assert read is not None and hang_label(read) == label
    rule = HangRule()
    rule.see(read)
    assert rule.hang is not None and rule.hang.label == label


def _mismatch_snapshot() -> list[dict[str, Any]]:
    """Rank 0 in all_reduce #12, rank 1 in broadcast #12: a certain deadlock from one look."""
    out = []
    for rank, op, line in ((0, "all_reduce", 41), (1, "broadcast", 44)):
        frames = [
            {"file": "/home/me/train.py", "line": line, "function": "main"},
            {
                "file": "/v/site-packages/torch/distributed/distributed_c10d.py",
                "line": 1,
                "function": op,
            },
        ]
        colls = [
            {"pg": "0", "seq": 11, "op": "all_reduce", "state": "completed"},
            {"pg": "0", "seq": 12, "op": op, "state": "scheduled"},
        ]
        out.append(
            {
                "rank": rank,
                "threads": [{"name": "MainThread", "frames": frames}],
                "collectives": colls,
            }
        )
    return out


def test_a_quiet_spell_is_looked_at_for_a_mismatch_which_is_named_before_any_stall(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import time  # noqa: PLC0415 - only this test needs the wall clock

    from xl.launcher.stacks import gather as capture  # noqa: PLC0415 - patched below
    from xl.launcher.stacks.hang import HangCapture  # noqa: PLC0415 - as above

    now = time.time()
    # both progressed 4 s ago
    run = _write(tmp_path / "r", _steps(0, now - 4, 0.3) + _steps(1, now - 4, 0.3))
    asked: list[float] = []
    snapshot = [_culprit_snapshot()]

    def gather(*_a: Any, **_k: Any) -> tuple[float, list[dict[str, Any]]]:
        asked.append(time.time())
        return time.time(), _read(snapshot[0])

    monkeypatch.setattr(capture, "gather", gather)
    sent = Lines()
    hang = HangCapture(
        run, sent, lambda: [{"rank": 0, "pid": 1}, {"rank": 1, "pid": 2}], timeout=0.5
    )

    def look(idle: float | None) -> None:
        hang.quiet(idle, 3.0)
        if hang._peeking is not None:
            hang._peeking.join(10)  # the look is done before the next tick

    # No mismatch (a rank merely behind): asked at 3 s, again only once the spell doubles, and
    # anew after progress; nothing is said, nothing saved.
    for idle in (None, 2.0, 3.5, 5.0, 6.9, 7.0, 1.0, 3.0):
        look(idle)
    assert len(asked) == 3 and sent == [] and not (run / "stacks").exists()
    # A mismatch: named at the next look, once, with its document.
    snapshot[0] = _mismatch_snapshot()
    look(6.0)
    look(30.0)
    assert len(asked) == 4 and [e["kind"] for e in sent] == ["hang"]
    assert sent[0]["ranks"] == [0, 1] and sent[0]["message"].startswith(
        "mismatch at #12 of process group 0 (different collectives"
    )
    assert json.loads((run / sent[0]["stacks"]).read_text())["verdict"]["mismatch"] is True
    # The stall that comes later takes its verdict: no second capture, no second hang event.
    hang.on_stall([stall(1, "rank 1 made no progress for 31 s")])
    hang.join(5)
    assert len(asked) == 4 and [e["kind"] for e in sent] == ["hang", "stalled"]
    assert sent[1]["message"].startswith(
        "rank 1 made no progress for 31 s; it is in main at train.py:44"
    )


def test_the_diagnoser_says_how_long_no_rank_progressed() -> None:
    from xl.launcher.telemetry.diagnose import Diagnoser, quiet_spell  # noqa: PLC0415 - only this test drives it

    d = Diagnoser(lambda _e: None, Thresholds(mismatch_after_s=3.0, mismatch_steps=3.0))
    assert quiet_spell(d, NOW) == (None, 3.0)  # nobody reported progress: nothing to look at
    d.ingest(0, _steps(0, NOW - 5, 0.5))
    d.ingest(1, _steps(1, NOW - 2, 2.0))
    # the newest progress (rank 1's), three of the slowest steps
    assert quiet_spell(d, NOW) == (2.0, 6.0)
    d.set_alive(1, False)
    assert quiet_spell(d, NOW) == (5.0, 3.0)
