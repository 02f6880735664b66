"""bench/bench_scale.py in its small mode: 32 ranks on 4 nodes into a real node 0.

The bench's figures are speed and are judged in bench/README.md, never here. What is checked is
that it ran as it says: every figure there, from a real supervisor that holds every rank (run.json
and metrics.jsonl on node 0), a Monitor that drew them, the one rank that stopped named and no
other, and nothing it started left behind.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "bench_scale.py"
KEYS = (
    "ranks", "nodes", "node0_cpu_cores", "node0_rss_mib", "wire_bytes_per_rank_s",
    "monitor_refresh_s", "monitor_cpu_cores", "stall_threshold_s", "hang_named_after_s", "scrape_s",
)


def _bench(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XL_")}
    return subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _left(tag: str) -> list[str]:
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("XL_BENCH_SCALE") == tag:
                out.append(f"{proc.pid} {' '.join(proc.cmdline())[:100]}")
        except (psutil.Error, OSError):
            continue
    return out


def _run(*extra: str) -> dict[str, Any]:
    done = _bench(
        "--ranks", "32", "--ranks-per-node", "8", "--json", "--seconds", "5", "--warmup", "3",
        "--stall-s", "6", *extra,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    for key in KEYS:
        assert isinstance(result.get(key), (int, float)) and math.isfinite(result[key]), (
            key,
            result,
        )
    assert (result["ranks"], result["nodes"]) == (32, 4)
    # Node 0 held every rank: 8 of its own, 24 of 3 simulated nodes, in run.json and in its metrics.
    assert result["run_json_ranks"] == 32 and result["ranks_logging"] == 32, result
    assert result["collector_rejects"] == {}, result
    assert (
        result["node0_cpu_cores"] > 0
        and result["node0_rss_mib"] > 0
        and result["wire_bytes_per_rank_s"] > 0
    )
    assert (
        result["monitor_refreshes"] >= 1
        and result["monitor_rows"] == 32
        and result["monitor_cpu_cores"] > 0
    )
    assert result["scrape_s"] > 0 and result["scrape_kib"] > 0
    # The stopped rank is on the last node, and cannot be named before its threshold.
    assert result["stall_threshold_s"] == 6 and result["culprit"] // 8 == 3
    assert result["hang_named_after_s"] >= result["stall_threshold_s"], result
    assert result["run_status"] == "stopped"
    assert _left(result["bench_id"]) == []
    return result


def test_a_synchronous_hang_is_named_with_the_rank_that_stopped() -> None:
    """The default: one rank stops and the 31 others wait in the all-reduce for it (node 0's real
    ranks and the simulated ones): the hang names that rank alone, and each other rank is told it
    waits on it."""
    result = _run()
    assert result["hang_named_by"] == "hang", result
    assert (
        result["victims_told"] == 31
        and result["false_alarms"] == []
        and result["false_alarm_count"] == 0
    ), result


def test_one_rank_stalled_while_the_others_go_on_is_named_and_no_other() -> None:
    result = _run("--hang", "one")
    assert result["hang_named_by"] == "stalled" and "hang_after_s" not in result, result
    assert result["false_alarms"] == [], result


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--ranks", "12"], "must be a multiple of --ranks-per-node 8"),
        (["--ranks", "8"], "for 2 nodes or more"),
        (["--ranks", "32", "--steps-per-s", "0"], "--steps-per-s must be in"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], says: str) -> None:
    done = _bench(*args, timeout=60)
    assert done.returncode == 2
    assert (
        says in done.stderr
        and len(done.stderr.strip().splitlines()) == 1
        and "Traceback" not in done.stderr
    )
