"""A run's cgroup's memory on every rank's sys line: what the kernel counts for the run's
processes together and its --memory-limit (read from a cgroup folder as v1 and v2 write it);
a run without one, or without the memory controller, has neither figure."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from xl.launcher.telemetry.roster import from_rows
from xl.launcher.telemetry.sampler import Sampler

MIB = 1 << 20


@pytest.fixture
def ranks() -> Iterator[list[dict[str, int]]]:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in "ab"]
    try:
        yield from_rows([{"rank": r, "pid": p.pid} for r, p in enumerate(procs)])
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)


def _folder(tmp_path: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return str(tmp_path)


def test_v1_usage_and_limit_reach_every_rank_s_line(
    tmp_path: Path, ranks: list[dict[str, int]]
) -> None:
    group = _folder(
        tmp_path,
        {"memory.usage_in_bytes": f"{300 * MIB}\n", "memory.limit_in_bytes": f"{512 * MIB}\n",
         "memory.max_usage_in_bytes": f"{400 * MIB}\n"},
    )
    records, gone = Sampler(inventory=False, cgroup=group).sample(ranks)
    assert gone == [] and len(records) == 2
    for rec in records:
        assert rec["cgroup_mem_mib"] == 300.0 and rec["cgroup_mem_limit_mib"] == 512.0, rec
        assert rec["rss_mib"] < rec["cgroup_mem_mib"]  # one rank's own, beside the run's


def test_v2_without_a_limit_has_only_the_usage(tmp_path: Path, ranks: list[dict[str, int]]) -> None:
    group = _folder(tmp_path, {"memory.current": f"{MIB * 3 // 2}\n", "memory.max": "max\n"})
    records, _ = Sampler(inventory=False, cgroup=group).sample(ranks)
    assert [r["cgroup_mem_mib"] for r in records] == [1.5, 1.5]
    assert not any("cgroup_mem_limit_mib" in r for r in records)


@pytest.mark.parametrize("group", [None, "no-memory-controller", "gone"])
def test_no_cgroup_memory_no_figures(
    tmp_path: Path, ranks: list[dict[str, int]], group: str | None
) -> None:
    if group == "no-memory-controller":  # a v2 cgroup without the memory controller
        group = _folder(tmp_path, {"cgroup.procs": f"{os.getpid()}\n", "cgroup.controllers": ""})
    elif group == "gone":
        group = str(tmp_path / "removed")
    records, _ = Sampler(inventory=False, cgroup=group).sample(ranks)
    assert len(records) == 2 and not any(k.startswith("cgroup") for r in records for k in r)
