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
of reader.py too (e.g. ``git show HEAD~1:launcher/view/reader.py > /tmp/old.py``), in the same
run, with this tree's other modules.

``--ref REV`` compares this tree's reader with the whole package as it was at git revision REV
(e.g. one before a change to the RankViews it builds, which reader.py alone cannot show): REV is
unpacked into a temporary folder, and each round runs this bench once in a process of its own
on this tree and once on REV's (``--rounds``, alternating, so a change of load lands on both).
Each process reports its poll / json.loads ratio; the verdict is the median over the rounds of
this tree's ratio over REV's, with its range (<= 1: no slower than REV).

``--digest RANKS`` times the run-end digest instead (``digest.build``, CPU, median of 7) of a run
in which every one of RANKS ranks stepped 10 times and was called stalled, half of them coming
back and half exiting (bench_node0.py's run); with ``--ref`` each round is a pair of processes
again, their order turning each round, and the verdict the median of this tree's ms over REV's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The package's folders, as pyproject.toml's package-dir maps them under ``xl``.
MAPPED = ("launcher", "doctor", "tui", "examples")

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
    import runfixtures  # noqa: PLC0415 - from the tree being timed (--root), put on sys.path in main

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


def stalled_run(root: Path, ranks: int) -> Path:
    """A run dir in which every rank steps 10 times (a second apart), is called stalled at +40 s,
    and then either comes back (even ranks: a line at +50..56 s and a ``recovered``) or exits."""
    t0 = 1_700_000_000.0
    run_dir = root / "run"
    run_dir.mkdir()
    run = {"run_id": "run", "status": "succeeded", "started_at": t0, "ended_at": t0 + 70}
    (run_dir / "run.json").write_text(json.dumps({**run, "ranks": []}))

    def line(r: int, step: int, t: float) -> dict[str, Any]:
        loss = 2.0 + r / 1e4
        return {
            "t": t,
            "rank": r,
            "kind": "train",
            "step": step,
            "loss": loss,
            "samples_per_s": 64.0,
        }

    lines = [line(r, s, t0 + s) for s in range(1, 11) for r in range(ranks)]
    lines += [line(r, 11, t0 + 50 + r % 7) for r in range(0, ranks, 2)]
    events = [
        {"t": t0 + 40 + r / ranks, "kind": "stalled", "rank": r, "idle_s": 30.0}
        for r in range(ranks)
    ]
    events += [
        {"t": t0 + 52 + r % 7, "kind": "recovered", "rank": r, "of": "stalled"}
        for r in range(0, ranks, 2)
    ]
    events += [
        {"t": t0 + 60, "kind": "rank_exited", "rank": r, "exit_code": 0} for r in range(1, ranks, 2)
    ]
    for name, rows in (("metrics.jsonl", lines), ("events.jsonl", events)):
        (run_dir / name).write_text("".join(json.dumps(x) + "\n" for x in rows))
    return run_dir


def time_digest(ranks: int, times: int = 7) -> float:
    """The median CPU ms of ``digest.build`` on ``stalled_run(ranks)``, with the tree's own modules
    (the digest in launcher/view/, or launcher/rundir/ in a tree from before)."""
    try:
        from xl.launcher.rundir.runrecord import load  # noqa: PLC0415 - the tree being timed
        from xl.launcher.view import digest  # noqa: PLC0415
    except ImportError:
        from xl.launcher.rundir import digest  # type: ignore[no-redef] # noqa: PLC0415
        from xl.launcher.rundir.record import load  # type: ignore[no-redef] # noqa: PLC0415
    with tempfile.TemporaryDirectory(prefix="xl-bench-digest-") as tmp:
        run_dir = stalled_run(Path(tmp), ranks)
        rec = load(run_dir)
        took = []
        for _ in range(times):
            c0 = time.process_time()
            digest.build(run_dir, rec)
            took.append(time.process_time() - c0)
    return statistics.median(took) * 1e3


def summary(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[int(len(ordered) * 0.9)] * 1e3


def unpack(rev: str, into: Path) -> Path:
    """``rev``'s tree in ``into``/tree, and a folder (returned) where ``xl`` is that tree's
    package laid out as installed: put first on PYTHONPATH, it is what ``import xl`` finds."""
    tree, pkg = into / "tree", into / "pkg" / "xl"
    tree.mkdir()
    pkg.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True, timeout=120
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True, timeout=120)
    for item in (tree / "xl").iterdir():
        (pkg / item.name).symlink_to(item)
    for name in MAPPED:
        (pkg / name).symlink_to(tree / name)
    return pkg.parent


def one_run(tree: Path, pkg: Path | None, seconds: int, digest: int = 0) -> float:
    """This bench in a process of its own on ``tree`` (``pkg``: its package folder, else the
    installed one): its poll / json.loads ratio of CPU medians (``digest``: the digest's ms)."""
    env = dict(os.environ)
    if pkg is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pkg), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [
            *(sys.executable, __file__, "--root", str(tree), "--seconds", str(seconds), "--json"),
            *(("--digest", str(digest)) if digest else ()),
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tempfile.gettempdir(),
        timeout=600,
    )
    return float(json.loads(out.stdout.splitlines()[-1])["ratio"])


def against_rev(rev: str, rounds: int, seconds: int, digest: int = 0) -> int:
    unit = f"digest of {digest} stalled ranks, ms" if digest else "poll / json.loads"
    with tempfile.TemporaryDirectory(prefix="xl-bench-reader-rev-") as tmp:
        pkg = unpack(rev, Path(tmp))
        ours: list[float] = []
        theirs: list[float] = []
        for r in range(rounds):
            # The digest's pairs turn their order each round (the poll's keep theirs, as before).
            if digest and r % 2:
                theirs.append(one_run(Path(tmp) / "tree", pkg, seconds, digest))
                ours.append(one_run(ROOT, None, seconds, digest))
            else:
                ours.append(one_run(ROOT, None, seconds, digest))
                theirs.append(one_run(Path(tmp) / "tree", pkg, seconds, digest))
            print(
                f"  round {r + 1}: this tree {ours[-1]:.3f}, {rev} {theirs[-1]:.3f} ({unit})",
                flush=True,
            )
    paired = [a / b for a, b in zip(ours, theirs, strict=True)]
    what = f"digests of {digest} stalled ranks" if digest else f"{seconds} polls"
    print(
        f"bench_reader: this tree / {rev}: {statistics.median(paired):.3f}x "
        f"[{min(paired):.3f}, {max(paired):.3f}] over {rounds} rounds of {what} "
        f"({unit}: {statistics.median(ours):.3f} vs {statistics.median(theirs):.3f}); "
        f"load {os.getloadavg()[0]:.1f}"
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=int, default=200, help="chunks (polls) to time per reader")
    ap.add_argument("--against", type=Path, help="another reader.py to time in the same run")
    ap.add_argument("--ref", metavar="REV", help="compare with the package at git revision REV")
    ap.add_argument("--rounds", type=int, default=8, help="--ref: rounds, each tree once a round")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)  # --ref's children
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--digest", type=int, default=0, metavar="RANKS", help="time the digest")
    args = ap.parse_args()
    if args.ref:
        return against_rev(args.ref, args.rounds, args.seconds, args.digest)
    if args.digest:
        ms = time_digest(args.digest)
        print(
            json.dumps({"ratio": ms}) if args.json else f"digest, {args.digest} ranks: {ms:.1f} ms"
        )
        return 0
    sys.path.insert(0, str(args.root / "tests" / "support"))

    t0 = time.time() - 60
    chunks = [chunk(s, t0 + 100) for s in range(args.seconds)]
    # The reader lives in launcher/view/; a tree from before that package, in launcher/rundir/.
    here = args.root / "launcher" / "view" / "reader.py"
    readers = {"poll": here if here.exists() else args.root / "launcher" / "rundir" / "reader.py"}
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

    anchor = summary(results["json.loads"]["cpu"])[0]
    if args.json:
        print(json.dumps({"ratio": summary(results["poll"]["cpu"])[0] / anchor}))
        return 0
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
