"""CPU cost of one ``RunReader.poll()`` on a wide live run, against per-line ``json.loads``.

    .venv/bin/python bench/bench_reader.py [--seconds 200] [--against OTHER/reader.py]

The workload is bench_tui.py's writer: a run of 64 ranks (runfixtures "wide") where every rank
appends a train line at 10 Hz (640 lines/s) and a sys line once a second. Each chunk is one
second of those lines (704 lines, ~90 KiB), generated up front; the bench appends a chunk to
metrics.jsonl, then times one poll() (which reads exactly that chunk, as the TUI's 1 Hz poll
does), and repeats. The first poll, which reads the fixture's history, is not timed.

The anchor, measured in the same run on the same chunks: read the chunk's bytes from the file,
split the lines and ``json.loads`` each one -- what a naive reader pays before it does anything
with the records. The ratio poll / anchor is the reader's cost in those units (at or under 1 means
the whole poll costs no more than decoding the lines one json.loads at a time).

Prints the median and 90th percentile per-poll CPU time (time.process_time) and wall time, for
the reader and the anchor, and the ratio of the medians. ``--against PATH`` times another copy
of reader.py too (e.g. ``git show HEAD~1:launcher/rundir/reader.py > /tmp/old.py``), in the same
run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

import runfixtures  # noqa: E402

RANKS = 64
HZ = 10


def chunk(second: int, t0: float) -> bytes:
    """One second of the bench_tui writer's output: 10 train lines and 1 sys line per rank."""
    rows = []
    for tick in range(HZ):
        step = 1000 + second * HZ + tick
        t = t0 + second + tick / HZ
        for r in range(RANKS):
            loss = 2.5 * math.exp(-step / 400) + 0.3 + 0.01 * math.sin(step + r)
            rows.append(
                {
                    "t": t,
                    "rank": r,
                    "kind": "train",
                    "step": step,
                    "total_steps": 100_000,
                    "loss": loss,
                    "samples_per_s": 30.0 + (r % 5),
                }
            )
    t = t0 + second + 0.05
    for r in range(RANKS):
        rows.append(
            {
                "t": t,
                "rank": r,
                "kind": "sys",
                "gpu_util": 50 + 40 * math.sin(second + r),
                "gpu_mem_used_mib": 40000 + 10 * (second % 100) + r,
                "gpu_mem_total_mib": 81920,
                "rss_mib": 3000 + r,
            }
        )
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def load_reader(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class Anchor:
    """The floor: read what was appended, split it into lines, json.loads each."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size

    def poll(self) -> int:
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        self.offset += len(data)
        loads = json.loads
        return len([loads(line) for line in data.split(b"\n") if line])


def measure(
    name: str, make: Callable[[Path], Any], chunks: list[bytes], t0: float
) -> dict[str, Any]:
    """Time ``make(run_dir).poll()`` once per appended chunk, on a fresh copy of the wide run."""
    root = Path(tempfile.mkdtemp(prefix="xl-bench-reader-"))
    try:
        run_dir = runfixtures.make_run(root, "wide", t0=t0)
        poller = make(run_dir)
        poller.poll()  # the fixture's history: not what a 1 Hz poll costs
        cpu, wall = [], []
        with open(run_dir / "metrics.jsonl", "ab") as out:
            for data in chunks:
                out.write(data)
                out.flush()
                c0, w0 = time.process_time(), time.perf_counter()
                poller.poll()
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - w0)
        return {"name": name, "cpu": cpu, "wall": wall}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def summary(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[int(len(ordered) * 0.9)] * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=int, default=200, help="chunks (polls) to time per reader")
    ap.add_argument("--against", type=Path, help="another reader.py to time in the same run")
    args = ap.parse_args()

    t0 = time.time() - 60
    chunks = [chunk(s, t0 + 100) for s in range(args.seconds)]
    readers = {"poll": ROOT / "launcher" / "rundir" / "reader.py"}
    if args.against:
        readers[f"poll ({args.against})"] = args.against
    makers: dict[str, Callable[[Path], Any]] = {"json.loads": lambda d: Anchor(d / "metrics.jsonl")}
    for i, (name, path) in enumerate(readers.items()):
        makers[name] = load_reader(path, f"bench_reader_impl{i}").RunReader

    # Interleave rounds so that load changes on the machine land on every reader alike.
    rounds = 3
    per_round = max(1, args.seconds // rounds)
    results: dict[str, dict[str, list[float]]] = {n: {"cpu": [], "wall": []} for n in makers}
    for r in range(rounds):
        part = chunks[r * per_round : (r + 1) * per_round]
        for name, make in makers.items():
            got = measure(name, make, part, t0)
            results[name]["cpu"] += got["cpu"]
            results[name]["wall"] += got["wall"]

    lines = chunks[0].count(b"\n")
    print(
        f"bench_reader: {RANKS} ranks, {lines} lines ({len(chunks[0]) / 1024:.0f} KiB) per poll, "
        f"{len(results['poll']['cpu'])} polls each"
    )
    print(f"  {'':40}{'cpu median':>12}{'cpu p90':>10}{'wall median':>13}")
    for name, res in results.items():
        cpu_med, cpu_p90 = summary(res["cpu"])
        wall_med, _ = summary(res["wall"])
        print(f"  {name:40}{cpu_med:>9.3f} ms{cpu_p90:>7.3f} ms{wall_med:>10.3f} ms")
    anchor = summary(results["json.loads"]["cpu"])[0]
    for name in readers:
        print(
            f"  {name} / json.loads (cpu medians): {summary(results[name]['cpu'])[0] / anchor:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
