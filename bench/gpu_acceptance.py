"""The GPU acceptance run: everything that only a real GPU machine can prove, in one command.

    .venv/bin/python bench/gpu_acceptance.py [--pairs 6] [--no-bench]

1. The machine: GPU model, driver, torch and its CUDA (tests/gpu/gpubox.py). With no CUDA device
   visible it says why on one line and exits 2: a GPU acceptance run that ran nothing is neither
   a pass nor something to skip quietly.
2. The suite, ``pytest -m gpu tests/gpu`` (`xl gpus` vs nvidia-smi and torch.cuda, `xl doctor`
   vs a real extension build, a real NCCL DDP run under `xl launch`).
3. bench/bench_overhead.py --gpu: step time of full monitoring vs plain torchrun, one rank per
   GPU on a GPU-bound model, with its 95% interval (goal: <= 1%).

Then one summary. Exit 0 when every test passed (skips named) and the overhead goal was not
missed; 1 otherwise; 2 when there is no CUDA device to test.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "gpu"))

import gpubox  # noqa: E402 - tests/gpu holds the one machine probe the suite uses too

SUITE_TIMEOUT_S = 2400
BENCH_TIMEOUT_S = 3600


@dataclass
class SuiteResult:
    passed: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    problem: str | None = None  # the suite itself could not run


def run_suite(tmp: Path) -> SuiteResult:
    junit = tmp / "junit.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-m", "gpu"]
    argv += [f"--junitxml={junit}", "tests/gpu"]
    try:
        proc = subprocess.run(argv, cwd=str(REPO), timeout=SUITE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return SuiteResult(problem=f"the suite did not finish in {SUITE_TIMEOUT_S} s")
    if not junit.exists():
        return SuiteResult(problem=f"pytest exited {proc.returncode} without a report")
    result = SuiteResult()
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "?")
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            result.failed.append(f"{name}: {(bad.get('message') or '').splitlines()[0][:200]}")
        elif skip is not None:
            result.skipped.append(f"{name}: {(skip.get('message') or '')[:200]}")
        else:
            result.passed += 1
    return result


def run_bench(tmp: Path, pairs: int) -> dict[str, Any]:
    out = tmp / "overhead.json"
    argv = [sys.executable, str(REPO / "bench" / "bench_overhead.py"), "--gpu"]
    argv += ["--pairs", str(pairs), "--json", str(out)]
    try:
        proc = subprocess.run(argv, cwd=str(REPO), timeout=BENCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"bench_overhead did not finish in {BENCH_TIMEOUT_S} s"}
    if proc.returncode != 0 or not out.exists():
        return {"error": f"bench_overhead exited {proc.returncode} (its output is above)"}
    figures: dict[str, Any] = json.loads(out.read_text())
    return figures


def overhead_line(b: dict[str, Any]) -> str:
    if "error" in b:
        return f"overhead: not measured: {b['error']}"
    lo, hi = b["overhead_ci95_pct"]
    return (
        f"overhead: {b['overhead_pct']:+.2f}% step time, 95% CI [{lo:+.2f}%, {hi:+.2f}%], "
        f"full monitoring vs torchrun ({b['ranks']} ranks, {b['pairs']} pairs, "
        f"{b['step_ms_torchrun']:.2f} ms/step); goal <= 1%: {b['verdict']}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=6, help="A/B pairs for the overhead bench")
    ap.add_argument("--no-bench", action="store_true", help="run the suite only")
    args = ap.parse_args(argv)
    machine = gpubox.probe()
    if machine.why_not:
        print(f"gpu_acceptance: {machine.why_not}; nothing was run", file=sys.stderr)
        return 2
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    with tempfile.TemporaryDirectory(prefix="xl-gpu-acceptance-") as tmp_s:
        tmp = Path(tmp_s)
        suite = run_suite(tmp)
        bench = None if args.no_bench else run_bench(tmp, args.pairs)
    print(f"\nGPU acceptance, {started}, on {platform.node()}")
    print(f"machine: {machine.summary()}")
    if suite.problem:
        print(f"suite: did not run: {suite.problem}")
    else:
        print(
            f"suite: {suite.passed} passed, {len(suite.failed)} failed, {len(suite.skipped)} "
            "skipped"
        )
    for line in suite.failed:
        print(f"  FAILED {line}")
    for line in suite.skipped:
        print(f"  skipped {line}")
    print(overhead_line(bench) if bench is not None else "overhead: not measured (--no-bench)")
    missed = bench is not None and str(bench.get("verdict", "")).startswith("MISSED")
    bad = suite.problem or suite.failed or (bench is not None and "error" in bench) or missed
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
