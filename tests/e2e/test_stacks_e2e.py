"""`xl stacks` and the automatic hang capture on real gloo CPU runs started by the real `xl launch`.

Four runs start at once (one module fixture, to keep the suite short), each with rank 1 astray in
its own way at step 3: asleep outside any collective, in a regex that holds the GIL, in a busy
Python loop, in a broadcast where rank 0 waits in an all_reduce. A fifth run simply finishes. A
sixth is healthy but unusual: rank 1 computes longer every step, so a snapshot almost always finds
rank 0 waiting for it in the all-reduce; it must never be called a hang.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import (
    XL,
    describe_run,
    kill_run,
    run_json,
    wait_final,
    wait_for,
    wait_no_processes,
    wait_ranks_running,
    xl,
    xl_env,
)
from where import SUPPORT

pytestmark = pytest.mark.e2e

SCRIPT = SUPPORT / "hang_ddp.py"
MODES = ("sleep", "regex", "busy", "bcast")
LIVE = (*MODES, "slow")


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dict[str, str], dict[str, Path]]]:
    home = tmp_path_factory.mktemp("stacks-home")
    env = xl_env(home, XL_STALL_MIN_S="3")
    dirs: dict[str, Path] = {}
    try:
        for mode in (*LIVE, "none"):
            extra = ["--steps", "2"] if mode == "none" else []
            started = xl(
                [
                    "launch", "--detach", "--nproc", "2", "--name", mode, str(SCRIPT), "--mode",
                    mode, *extra,
                ],
                env,
                cwd=home,
            )
            assert started.returncode == 0, started.stderr
            dirs[mode] = home / "runs" / started.stdout.strip()
        for mode in LIVE:
            wait_ranks_running(dirs[mode], 2, timeout=90)
        yield env, dirs
    finally:
        for run_dir in dirs.values():
            xl(["stop", run_dir.name], env, timeout=60)
            kill_run(run_dir)
        for run_dir in dirs.values():
            wait_no_processes(run_dir, timeout=30)


def _stacks(env: dict[str, str], run_dir: Path, *args: str) -> tuple[int, Any, str]:
    done = xl(["stacks", run_dir.name, *args], env, timeout=30)
    out: Any = done.stdout
    if "--json" in args and done.returncode == 0:
        out = json.loads(done.stdout)
    return done.returncode, out, done.stderr


def _hung(env: dict[str, str], run_dir: Path) -> dict[str, Any]:
    """The stacks document once rank 1 went astray and rank 0 waits for it."""

    def ready() -> dict[str, Any] | None:
        code, doc, err = _stacks(env, run_dir, "--json")
        assert code == 0, err
        return doc if doc["verdict"]["ranks"] == [1] else None

    return wait_for(ready, timeout=60, what="a verdict naming rank 1", interval=0.5)


def _main_functions(doc: dict[str, Any], rank: int) -> list[str]:
    entry = next(e for e in doc["ranks"] if e["rank"] == rank)
    return [f["function"] for f in entry["threads"][0]["frames"]]


def test_a_rank_asleep_outside_the_collective_is_named_and_captured_once(
    runs: tuple[dict[str, str], dict[str, Path]],
) -> None:
    env, dirs = runs
    run_dir = dirs["sleep"]
    doc = _hung(env, run_dir)
    assert doc["run_id"] == run_dir.name and {e["rank"] for e in doc["ranks"]} == {0, 1}
    assert "rank 1 never entered all_reduce #" in doc["verdict"]["message"]
    assert "astray at hang_ddp.py:" in doc["verdict"]["message"]
    rank0 = next(e for e in doc["ranks"] if e["rank"] == 0)
    assert any(c["op"] == "all_reduce" and c["state"] != "completed" for c in rank0["collectives"])
    assert _main_functions(doc, 0)[-1] == "all_reduce" and _main_functions(doc, 0)[0] == "<module>"
    code, text, _ = _stacks(env, run_dir)
    assert code == 0
    assert "rank 0 waits in all_reduce #" in text and "rank 1 is in astray at hang_ddp.py:" in text
    assert "verdict: rank 1 never entered" in text
    # The supervisor's own capture: one hang event, one document, the victim waiting on the culprit.
    events = wait_for(
        lambda: (
            [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
            if "waiting_on" in (run_dir / "events.jsonl").read_text()
            else None
        ),
        timeout=60,
        what="the hang events",
        explain=lambda: describe_run(run_dir),
    )
    hangs = [e for e in events if e["kind"] == "hang"]
    assert (
        len(hangs) == 1
        and hangs[0]["ranks"] == [1]
        and "astray at hang_ddp.py:" in hangs[0]["message"]
    )
    # Asleep, it uses no CPU: a hang, not a rank working (test_stall_working.py has the other).
    assert hangs[0]["busy"] == [] and "working at" not in hangs[0]["message"]
    saved = json.loads((run_dir / hangs[0]["stacks"]).read_text())
    assert saved["verdict"] == {"ranks": [1], "message": hangs[0]["message"]}
    stalled = {e["rank"]: e for e in events if e["kind"] == "stalled"}
    assert "waiting_on" not in stalled[1] and "astray at hang_ddp.py" in stalled[1]["message"]
    assert stalled[0]["waiting_on"] == [1] and stalled[0]["message"].startswith(
        "rank 0 waits in all_reduce #"
    )
    # --rank filters what is shown, never the verdict: the whole run's, from either rank.
    code, shown, _ = _stacks(env, run_dir, "--rank", "1")
    groups, _, judged = shown.partition("verdict: ")
    assert code == 0 and "rank 1 is in astray" in groups and "rank 0" not in groups
    assert judged.startswith("rank 1 never entered all_reduce #")
    for rank in (0, 1):
        code, only, _ = _stacks(env, run_dir, "--rank", str(rank), "--json")
        assert code == 0 and [e["rank"] for e in only["ranks"]] == [rank]
        assert (
            only["verdict"]["ranks"] == [1]
            and "rank 1 never entered all_reduce #" in only["verdict"]["message"]
        )
    # `xl attach` (plain: not a terminal) prints the verdict and where the stacks are.
    attach = subprocess.Popen(
        [*XL, "attach", run_dir.name],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)
    finally:
        attach.terminate()
        out, _ = attach.communicate(timeout=10)
    assert f"xl: hang: {hangs[0]['message']} (every rank's stack: {hangs[0]['stacks']})" in out


def test_a_rank_in_c_code_holding_the_gil_still_tells_where_it_is(
    runs: tuple[dict[str, str], dict[str, Path]],
) -> None:
    env, dirs = runs
    doc = _hung(env, dirs["regex"])
    rank1 = next(e for e in doc["ranks"] if e["rank"] == 1)
    assert "GIL" in rank1["note"] and rank1["collectives"] == []
    assert _main_functions(doc, 1)[-3:] == ["astray", "parse_record", "match"]
    # The function and the line of one frame: the script's own innermost, and what it calls.
    line = next(
        i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if "return re.match(" in text
    )
    assert "rank 1 never entered all_reduce #" in doc["verdict"]["message"]
    assert (
        f": it is in parse_record at hang_ddp.py:{line} (calling re.match)"
        in doc["verdict"]["message"]
    )


def test_a_rank_in_a_busy_python_loop(runs: tuple[dict[str, str], dict[str, Path]]) -> None:
    env, dirs = runs
    doc = _hung(env, dirs["busy"])
    assert "note" not in next(e for e in doc["ranks"] if e["rank"] == 1)  # Python answered itself
    assert _main_functions(doc, 1)[-1] == "astray"
    # Named all the same, and said to be working: the CPU it uses is in the verdict.
    def working() -> dict[str, Any] | None:
        code, doc, _ = _stacks(env, dirs["busy"], "--json")
        return doc if code == 0 and "working at " in doc["verdict"]["message"] else None

    doc = wait_for(working, timeout=30, what="the verdict to say rank 1 works", interval=1)
    assert (
        doc["verdict"]["ranks"] == [1]
        and "rank 1 never entered all_reduce #" in doc["verdict"]["message"]
    )
    # Its CPU against the rank measured alongside (waiting in the collective), not a fixed share:
    # on a shared machine a spinning rank gets what the scheduler gives it.
    cpu = {e["rank"]: e["cpu_pct"] for e in doc["ranks"]}
    assert cpu[1] > cpu[0], cpu


def test_ranks_in_different_collectives(runs: tuple[dict[str, str], dict[str, Path]]) -> None:
    env, dirs = runs
    run_dir = dirs["bcast"]

    def disagree() -> dict[str, Any] | None:
        code, doc, _ = _stacks(env, run_dir, "--json")
        return doc if code == 0 and "broadcast" in doc["verdict"]["message"] else None

    doc = wait_for(disagree, timeout=60, what="the broadcast/all_reduce verdict", interval=0.5)
    assert (
        "is in broadcast #" in doc["verdict"]["message"]
        and "all_reduce #" in doc["verdict"]["message"]
    )
    assert (
        _main_functions(doc, 1)[-1] == "broadcast" and _main_functions(doc, 0)[-1] == "all_reduce"
    )


def test_a_healthy_run_with_a_slower_rank_is_never_called_hung(
    runs: tuple[dict[str, str], dict[str, Path]],
) -> None:
    env, dirs = runs
    run_dir = dirs["slow"]
    wait_for(
        lambda: '"step":5,' in (run_dir / "metrics.jsonl").read_text(),
        timeout=60,
        what="a few steps",
    )
    waited = 0
    calls = [("--json",)] * 4 + [("--json", "--rank", "0"), ("--json", "--rank", "1")]
    deadline = time.monotonic() + 60
    # Every look must say "no hang"; at least one must catch rank 0 waiting in all_reduce for the
    # slower rank 1 (the snapshot a one-look verdict would blame rank 1 on). On a loaded machine
    # the first six looks can all land between steps: look again, up to a minute.
    while calls or (not waited and time.monotonic() < deadline):
        args = calls.pop(0) if calls else ("--json",)
        code, doc, err = _stacks(env, run_dir, *args)
        assert code == 0, err
        assert doc["verdict"]["ranks"] == [], doc["verdict"]
        assert re.fullmatch(
            r"no hang: every rank progressed in the last \d+ s", doc["verdict"]["message"]
        ), doc["verdict"]
        rank0 = next((e for e in doc["ranks"] if e["rank"] == 0), None)
        waited += rank0 is not None and any(
            c["op"] == "all_reduce" and c["state"] != "completed" for c in rank0["collectives"]
        )
    assert waited
    code, text, _ = _stacks(env, run_dir)
    assert code == 0 and re.search(
        r"^verdict: no hang: every rank progressed in the last \d+ s$", text, re.M
    )
    kinds = [json.loads(x)["kind"] for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert "hang" not in kinds and "stalled" not in kinds


def test_a_finished_run_and_bad_usage(runs: tuple[dict[str, str], dict[str, Path]]) -> None:
    env, dirs = runs
    wait_final(dirs["none"], timeout=60)
    code, out, err = _stacks(env, dirs["none"])
    assert (
        code == 1
        and out == ""
        and len(err.strip().splitlines()) == 1
        and "is not running (succeeded)" in err
    )
    code, _, err = _stacks(env, dirs["sleep"], "--rank", "7")
    assert code == 2 and "has no rank 7" in err and "Traceback" not in err
    code, _, err = _stacks(env, dirs["sleep"], "--bogus")
    assert code == 2 and "Traceback" not in err
    assert run_json(dirs["none"])["status"] == "succeeded"
