"""Hostile rank output costs bounded work: every parser of telemetry/logparse.py is linear and
reads a bounded part of a line, and parsing runs off the supervisor's loop.

Before, one 60,000-digit line ending " it/s" held the supervisor's loop for 19 s (the tqdm regex
backtracked over every digit). The lines below are parsed in a subprocess with a timeout: each
shape took the old parsers from seconds to hours at these sizes; none may take minutes now.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from xl.launcher.telemetry.logparse import parse_line
from xl.launcher.telemetry.service import Telemetry

HOSTILE = {
    "digits": "'1' * 600_000 + ' it/s'",
    "slashes": "'1/' * 300_000 + ' it/s'",
    "open brackets": "'1/1 [' * 200_000 + ' it/s'",
    "nested dicts": "\"{'a': \" * 200_000 + '}'",
    "rate digits": "'|' + '1.' * 300_000 + 'it/s'",
    "carriage returns": "'1/1 [x]\\r' * 100_000 + ' it/s'",
}


def test_hostile_lines_are_parsed_in_bounded_time() -> None:
    code = (
        "import sys\n"
        "from xl.launcher.telemetry.logparse import parse_line\n"
        f"for name, expr in {HOSTILE!r}.items():\n"
        "    line = eval(expr)\n"
        "    for _ in range(5):\n"
        "        out = parse_line(line)\n"
        "    print(name, out, flush=True)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{name} None" for name in HOSTILE]


def test_real_bars_and_dicts_are_still_read_beside_long_text() -> None:
    # A bar with a long description keeps its counters at the end (its tail is what is read).
    bar = "x" * 10_000 + " 40%|████      | 4/10 [00:01<00:02,  2.95it/s]"
    assert parse_line(bar) == {"step": 4, "total_steps": 10, "steps_per_s": 2.95}
    # A dict after a long prefix, and a number that only starts after other text.
    assert parse_line("#" * 5_000 + "{'loss': 0.25, 'epoch': 1.0}") == {"loss": 0.25, "epoch": 1.0}
    assert parse_line("step 12/20 [00:01<00:01, 10.5it/s]") == {
        "step": 12,
        "total_steps": 20,
        "steps_per_s": 10.5,
    }
    # Too large a dict (over MAX_DICT) is left alone instead of evaluated.
    assert parse_line("{'loss': 1.0, 'pad': '" + "a" * 20_000 + "'}") is None


def test_lines_are_parsed_off_the_callers_thread(tmp_path: Path) -> None:
    tel = Telemetry(tmp_path, token="tok-0123456789abcdef", inventory=False)
    tel.start()
    try:
        for _ in range(20):
            tel.feed_log_line(0, "9" * 60_000 + " it/s")
        tel.feed_log_line(0, " 40%|████      | 4/10 [00:01<00:02,  2.95it/s]")
        tel.feed_log_line(1, "plain output, not queued")
    finally:
        tel.stop()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    train = [json.loads(line) for line in lines if '"train"' in line]
    assert [(r["rank"], r["step"], r["source"]) for r in train] == [(0, 4, "log")]
    status = json.loads((tmp_path / "collector.json").read_text())
    assert status["unparsed_lines"] == 0
