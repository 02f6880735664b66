"""Collectives that can never match, named at once (no stall needed), and ranks merely at
different collectives left alone: real gloo CPU runs under the real `xl launch`, with the stall
threshold set far out of reach so that only the mismatch rule can name anything."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import (
    describe_run,
    kill_run,
    wait_for,
    wait_no_processes,
    wait_ranks_running,
    xl,
    xl_env,
)
from where import SUPPORT

pytestmark = pytest.mark.e2e

SCRIPT = SUPPORT / "hang_ddp.py"
RUNS = {
    # rank 1 calls broadcast where rank 0 calls all_reduce: the same number, never to match
    "bcast": ["--mode", "bcast"],
    # rank 1 evaluates for 12 s after a broadcast; rank 0 waits meanwhile in the next all_reduce
    "eval": ["--mode", "eval", "--eval-s", "12", "--bcast-each", "--steps", "8"],
}


def _line(text: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dict[str, str], dict[str, Path]]]:
    home = tmp_path_factory.mktemp("mismatch-home")
    env = xl_env(home, XL_STALL_MIN_S="600")
    dirs: dict[str, Path] = {}
    try:
        for name, args in RUNS.items():
            started = xl(
                ["launch", "--detach", "--nproc", "2", "--name", name, str(SCRIPT), *args],
                env,
                cwd=home,
            )
            assert started.returncode == 0, started.stderr
            dirs[name] = home / "runs" / started.stdout.strip()
        for run_dir in dirs.values():
            wait_ranks_running(run_dir, 2, timeout=90)
        yield env, dirs
    finally:
        for run_dir in dirs.values():
            xl(["stop", run_dir.name], env, timeout=60)
            kill_run(run_dir)
        for run_dir in dirs.values():
            wait_no_processes(run_dir, timeout=30)


def test_a_mismatch_is_named_at_once_with_both_ranks_places(
    runs: tuple[dict[str, str], dict[str, Path]],
) -> None:
    env, dirs = runs
    run_dir = dirs["bcast"]
    # The run's own capture names it, with no stall said (the threshold is 600 s).
    hang = wait_for(
        lambda: next((e for e in _events(run_dir) if e["kind"] == "hang"), None),
        timeout=120,
        what="the mismatch's hang event",
        explain=lambda: describe_run(run_dir),
    )
    reduce_at, bcast_at = _line("xl.log(step=step") - 1, _line('if args.mode == "bcast":') + 1
    places = (
        r"mismatch at #(\d+) of process group default_pg \(different collectives; they can "
        r"never match\): "
        rf"rank 0 is in all_reduce #\1 at hang_ddp.py:{reduce_at}; "
        rf"rank 1 is in broadcast #\1 at hang_ddp.py:{bcast_at}"
    )
    assert re.fullmatch(places, hang["message"]), hang
    assert hang["ranks"] == [0, 1] and "stalled" not in [e["kind"] for e in _events(run_dir)]
    saved = json.loads((run_dir / hang["stacks"]).read_text())
    assert saved["verdict"]["message"] == hang["message"]
    # The Flight Recorder's shapes come with each collective (the script's tensor is 8 floats).
    rank0 = next(e for e in saved["ranks"] if e["rank"] == 0)
    assert all(c["in"] == c["out"] == [[8]] for c in rank0["collectives"]), rank0["collectives"]
    # `xl stacks` says the same, whatever the progress (no rank progressed for 600 s yet).
    done = xl(["stacks", run_dir.name, "--json"], env, timeout=60)
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout)["verdict"]
    assert (
        verdict["ranks"] == [0, 1]
        and re.fullmatch(places, verdict["message"])
        and verdict["mismatch"] is True
    )
    text = xl(["stacks", run_dir.name], env, timeout=60).stdout
    assert f"verdict: {verdict['message']}" in text


def test_ranks_at_different_collectives_of_different_numbers_are_no_mismatch(
    runs: tuple[dict[str, str], dict[str, Path]],
) -> None:
    env, dirs = runs
    run_dir = dirs["eval"]
    wait_for(
        lambda: "evaluates" in (run_dir / "logs" / "rank-1.log").read_text(),
        timeout=90,
        what="rank 1's evaluation",
    )

    def apart() -> dict[str, Any] | None:
        """A look that finds rank 0 waiting in an all_reduce while rank 1's newest is a
        broadcast."""
        done = xl(["stacks", run_dir.name, "--json"], env, timeout=60)
        if done.returncode != 0:
            return None
        doc = json.loads(done.stdout)
        newest = {e["rank"]: (e.get("collectives") or [{}])[-1] for e in doc["ranks"]}
        if (
            newest.get(0, {}).get("op") == "all_reduce"
            and newest[0].get("state") != "completed"
            and newest.get(1, {}).get("op") == "broadcast"
        ):
            return doc
        return None

    doc = wait_for(
        apart,
        timeout=60,
        what="rank 0 in all_reduce while rank 1 evaluates after a broadcast",
        interval=0.5,
    )
    assert doc["verdict"]["ranks"] == [] and "mismatch" not in doc["verdict"]["message"], doc[
        "verdict"
    ]
    # The run goes on and ends well; the quiet spell of the evaluation was never called a hang.
    wait_for(
        lambda: json.loads((run_dir / "run.json").read_text())["status"] == "succeeded",
        timeout=120,
        what="the run's end",
    )
    assert "hang" not in [e["kind"] for e in _events(run_dir)]
