"""`xl compare` on two runs of 64 ranks and 100k steps each, against starting `xl` at all.

    .venv/bin/python bench/bench_compare.py [--ranks 64] [--steps 100000] [--pairs 7] [--keep DIR]

Builds two finished run dirs under a temporary XL_HOME as a run leaves them: run.json, events.jsonl
(a stall, its recovery), and metrics.jsonl with a train line per rank per step (step, loss,
samples, samples_per_s) and a sys line per rank per second (with xl.watch's wait): 6.4M train
lines, ~0.7 GB, per run at the defaults. Then, as a run's end does, makes each run's digest and
time accounting (xl.launcher.view.digest.close_run): timed once per run and printed, since a
run pays it once, when it ends.

What is measured: the wall time of the real command, ``xl compare A B --json`` in a fresh
interpreter, as a person waits for it. The anchor, in the same run: ``xl --version`` (the
interpreter and xl's own start, which every command pays). Pairs alternate (anchor, compare),
``--pairs`` of them; printed: each median, the ratio compare / anchor, and compare's median in
seconds against the 1 s it must answer in. ``--no-digest`` times a comparison that must read
both runs' metrics whole instead (an older run without its digest).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

T0 = 1_700_000_000.0
STEP_S = 0.1


def write_run(root: Path, run_id: str, ranks: int, steps: int, lr: str, speed: float) -> Path:
    run_dir = root / run_id
    (run_dir / "logs").mkdir(parents=True)
    start, first = T0, T0 + 20.0
    step_s = STEP_S / speed
    last = first + steps * step_s
    stall_at = first + steps // 2 * step_s
    with open(run_dir / "metrics.jsonl", "w", encoding="utf-8") as fh:
        buf: list[str] = []
        next_sys = first
        for step in range(1, steps + 1):
            # a 30 s stall half-way
            t = first + step * step_s + (30.0 if step > steps // 2 else 0.0)
            loss = 2.5 * math.exp(-step / (steps / 5)) + 0.3
            sps = 32 / step_s
            for r in range(ranks):
                buf.append(
                    f'{{"t":{t:.3f},"rank":{r},"kind":"train","step":{step},'
                    f'"loss":{loss + r * 1e-4:.5f},"samples":32,"samples_per_s":{sps:.1f}}}\n'
                )
            if t >= next_sys:
                next_sys = t + 1.0
                for r in range(ranks):
                    buf.append(
                        f'{{"t":{t:.3f},"rank":{r},"kind":"sys","gpu_util":97,'
                        f'"comm_wait_s":0.004,"comm_steps":{int(1 / step_s)}}}\n'
                    )
            if len(buf) >= 200_000:
                fh.write("".join(buf))
                buf.clear()
        fh.write("".join(buf))
    last += 30.0
    events = [
        {"t": T0 + 1, "kind": "run_started", "rank": None, "message": "starting"},
        {
            "t": stall_at + 5,
            "kind": "stalled",
            "rank": 3,
            "idle_s": 5.0,
            "message": "rank 3 made no progress for 5 s",
        },
        {
            "t": stall_at + 30.05,
            "kind": "recovered",
            "rank": 3,
            "of": "stalled",
            "message": "rank 3 made progress again",
        },
    ]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rec = {
        "run_id": run_id,
        "name": "bench",
        "status": "succeeded",
        "spec": {"script": "train.py", "args": ["--lr", lr], "nproc": ranks, "nnodes": 1},
        "env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "WANDB_API_KEY": "secret-" + lr},
        "devices": [
            {"index": i % 8, "uuid": f"GPU-{i}", "name": "NVIDIA H100 80GB HBM3"} for i in range(8)
        ],
        "nnodes": 8,
        "nproc_per_node": ranks // 8,
        "world_size": ranks,
        "started_at": start,
        "ended_at": last + 4.0,
        "ranks": [
            {"rank": r, "local_rank": r % 8, "node": r // 8, "exit_code": 0, "state": "exited"}
            for r in range(ranks)
        ],
        "failure": None,
        "versions": {
            "xl": "0.1.0",
            "torch": "2.13.0+cu130",
            "cuda": "13.0",
            "driver": "580.65",
            "git": "abc123",
        },
    }
    (run_dir / "run.json").write_text(json.dumps(rec))
    return run_dir


def settle(run_dir: Path) -> tuple[float, float]:
    """What settling a run whose supervisor was gone does: the digest and run.json's time, from
    the whole run dir (a supervisor reads the run as it goes, and at its end only the rest).
    Wall and CPU seconds."""
    from xl.launcher.rundir import runrecord as record  # noqa: PLC0415 - after sys.path is set
    from xl.launcher.view import digest  # noqa: PLC0415 - after sys.path is set

    rec = record.load(run_dir)
    assert rec is not None
    began, cpu = time.perf_counter(), time.process_time()
    waited = digest.close_run(run_dir, rec)
    rec.update(ranks=digest.with_waits([r.to_json() for r in rec.ranks], waited))
    record.save(run_dir, rec)
    return time.perf_counter() - began, time.process_time() - cpu


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds, and the CPU seconds the command used (user + system): on a busy machine the
    wall time waits for a core, the CPU time does not."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    spent = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return spent, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--keep", type=Path, help="build the runs here and leave them")
    ap.add_argument(
        "--no-digest", action="store_true", help="compare runs whose digest is missing (read whole)"
    )
    ns = ap.parse_args()
    home = ns.keep or Path(tempfile.mkdtemp(prefix="xl-bench-compare-"))
    runs = home / "runs"
    try:
        began = time.perf_counter()
        a = write_run(runs, "20250101-000000-bench-a", ns.ranks, ns.steps, "0.1", 1.0)
        b = write_run(runs, "20250101-010000-bench-b", ns.ranks, ns.steps, "0.2", 1.25)
        size = sum((d / "metrics.jsonl").stat().st_size for d in (a, b)) / 2**20
        print(
            f"built 2 runs of {ns.ranks} ranks x {ns.steps} steps ({size:.0f} MiB of metrics) in "
            f"{time.perf_counter() - began:.1f} s"
        )
        for d in (a, b):
            wall, cpu = settle(d)
            print(
                f"  digest + time accounting of {d.name} read whole: {wall:.1f} s ({cpu:.1f} s "
                "CPU), once"
            )
            if ns.no_digest:
                (d / "digest.json").unlink()
        env = {**os.environ, "XL_HOME": str(home), "PYTHONPATH": str(ROOT)}
        compare = [sys.executable, "-m", "xl", "compare", a.name, b.name, "--json"]
        anchor = [sys.executable, "-m", "xl", "--version"]
        timed(compare, env)  # warm the page cache and the bytecode, as any second run is
        if ns.no_digest:
            for d in (a, b):
                (d / "digest.json").unlink()
        ours, base = [], []
        for _ in range(ns.pairs):
            base.append(timed(anchor, env))
            ours.append(timed(compare, env))
            if ns.no_digest:
                for d in (a, b):
                    (d / "digest.json").unlink()
        m_ours, m_base = (
            statistics.median(w for w, _ in ours),
            statistics.median(w for w, _ in base),
        )
        c_ours, c_base = (
            statistics.median(c for _, c in ours),
            statistics.median(c for _, c in base),
        )
        print(
            f"xl --version (anchor): median {m_base * 1000:.0f} ms wall, {c_base * 1000:.0f} ms "
            f"CPU over {ns.pairs}"
        )
        print(
            f"xl compare A B --json: median {m_ours * 1000:.0f} ms wall (max "
            f"{max(w for w, _ in ours) * 1000:.0f} ms), {c_ours * 1000:.0f} ms CPU"
        )
        print(f"ratio compare / anchor: {m_ours / m_base:.2f} wall, {c_ours / c_base:.2f} CPU")
        print(
            f"under 1 s: {'yes' if m_ours < 1.0 else 'NO'} (wall; a loaded machine adds its wait "
            "for a core to both)"
        )
        doc = json.loads(
            subprocess.run(
                compare, env=env, capture_output=True, text=True, timeout=600, check=True
            ).stdout
        )
        print(
            f"  speed ratio B/A {doc['speed']['ratio']}, {len(doc['loss']['steps'])} common loss "
            f"steps, stalled {doc['time']['a']['stalled_s']} s"
        )
    finally:
        if ns.keep is None:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
