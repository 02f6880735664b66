"""CPU cost of one `xl exporter` scrape of a 64-rank live run, against the app's own poll.

    .venv/bin/python bench/bench_exporter.py [--rounds 30] [--interval 15]

The run is bench_reader.py's: 64 ranks (runfixtures "wide") each appending a train line at 10 Hz
and a sys line once a second. Before each scrape the bench appends ``--interval`` seconds of those
lines (Prometheus's default scrape interval is 15 s: 15 x 704 lines, ~1.3 MiB), then times one
whole scrape as the exporter's /metrics handler makes it: the collector reads what was appended,
builds every metric family, and prometheus-client writes the exposition (text format).

``--big N`` (e.g. 4096) times instead one scrape of a live N-rank run of 8-rank nodes
(tests/support/bigrun.py: 2 train lines a rank a second with the four phase times, a sys line a
second; 15 s of them, ~184,000 lines at 4,096 ranks, between scrapes), as xl exporter makes it by
default past 256 ranks (per-node series) and with ``--per-rank``, in alternating order: wall and
CPU medians, the slowest, and each exposition's size.

The anchor, measured in the same run on a copy of the same run dir that gets the same lines:
one ``RunReader.poll()``, what the app's Monitor pays to read those lines. Exporter and anchor
take turns, in alternating order, and the ratio is of the medians: the exporter's scrape in units
of "reading the same lines the way the app does".
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "bench"))

import bigrun  # noqa: E402
import runfixtures  # noqa: E402
from bench_reader import RANKS, chunk  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from xl.launcher.exporter.metrics import RunsCollector  # noqa: E402
from xl.launcher.view.reader import RunReader  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--interval", type=int, default=15, help="seconds of lines between two scrapes")
    ap.add_argument("--big", type=int, default=0, help="time scrapes of a run of this many ranks")
    ns = ap.parse_args()
    if ns.big:
        return big(ns.big, ns.rounds, ns.interval)
    tmp = Path(tempfile.mkdtemp(prefix="xl-bench-exporter-"))
    try:
        t0 = time.time() - 60
        runs = tmp / "exp" / "runs"
        runs.mkdir(parents=True)
        run = runfixtures.make_run(runs, "wide", t0=t0)
        anchor_dir = shutil.copytree(run, tmp / "anchor" / run.name)
        registry = CollectorRegistry(auto_describe=False)
        collector = RunsCollector(runs)
        registry.register(collector)
        reader = RunReader(anchor_dir)
        generate_latest(registry)  # the first scrape reads the history: not timed, as bench_reader
        reader.poll()
        body = b""
        exp_cpu: list[float] = []
        anc_cpu: list[float] = []
        wall: list[float] = []
        for rnd in range(ns.rounds):
            data = b"".join(chunk(rnd * ns.interval + s, t0) for s in range(ns.interval))
            for d in (run, anchor_dir):
                with (d / "metrics.jsonl").open("ab") as fh:
                    fh.write(data)

            def scrape() -> None:
                nonlocal body
                w = time.perf_counter()
                c = time.process_time()
                body = generate_latest(registry)
                exp_cpu.append(time.process_time() - c)
                wall.append(time.perf_counter() - w)

            def poll() -> None:
                c = time.process_time()
                reader.poll()
                anc_cpu.append(time.process_time() - c)

            for step in (scrape, poll) if rnd % 2 == 0 else (poll, scrape):
                step()
        e, a = statistics.median(exp_cpu), statistics.median(anc_cpu)
        lines = ns.interval * (RANKS * 11)
        print(
            f"scrape of {RANKS} ranks, {ns.interval} s of lines ({lines} lines) between scrapes, "
            f"{ns.rounds} rounds"
        )
        print(
            f"  exporter scrape: median {e * 1e3:.1f} ms CPU "
            f"({statistics.median(wall) * 1e3:.1f} ms wall), exposition {len(body) / 1024:.0f} "
            "KiB"
        )
        print(f"  anchor RunReader.poll on the same lines: median {a * 1e3:.1f} ms CPU")
        print(f"  ratio exporter / anchor: {e / a:.2f}")
        print(f"  at one scrape every {ns.interval} s: {e / ns.interval * 100:.2f}% of a core")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def big(ranks: int, rounds: int, interval: int) -> int:
    """Scrapes of a ``ranks``-rank run: per-node (the default past 256 ranks) and per-rank."""
    tmp = Path(tempfile.mkdtemp(prefix="xl-bench-exporter-big-"))
    try:
        t0 = time.time() - 600
        ways = {}
        for way in ("per-node", "per-rank"):
            runs = tmp / way / "runs"
            runs.mkdir(parents=True)
            run = bigrun.make_big_run(runs, ranks, t0=t0, seconds=20)
            registry = CollectorRegistry(auto_describe=False)
            registry.register(RunsCollector(runs, per_rank=way == "per-rank"))
            ways[way] = (run, registry)
        first: dict[str, float] = {}
        wall: dict[str, list[float]] = {w: [] for w in ways}
        cpu: dict[str, list[float]] = {w: [] for w in ways}
        size: dict[str, int] = {}
        for rnd in range(-1, rounds):
            if rnd >= 0:
                data = b"".join(
                    bigrun.chunk(ranks, 20 + rnd * interval + s, t0) for s in range(interval)
                )
                for run, _ in ways.values():
                    with (run / "metrics.jsonl").open("ab") as fh:
                        fh.write(data)
            for way in list(ways) if rnd % 2 == 0 else list(ways)[::-1]:
                w, c = time.perf_counter(), time.process_time()
                body = generate_latest(ways[way][1])
                took, used = time.perf_counter() - w, time.process_time() - c
                if rnd < 0:
                    first[way] = took  # the first scrape reads the run's history
                else:
                    wall[way].append(took)
                    cpu[way].append(used)
                    size[way] = len(body)
        print(
            f"scrape of {ranks} ranks ({ranks // 8} nodes of 8), {interval} s of lines between "
            f"scrapes, {rounds} rounds"
        )
        for way in ways:
            print(
                f"  {way}: median {statistics.median(wall[way]):.3f} s wall "
                f"({statistics.median(cpu[way]):.3f} s CPU), slowest {max(wall[way]):.3f} s, "
                f"first (history) {first[way]:.3f} s; exposition {size[way] / 1024:.0f} KiB"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
