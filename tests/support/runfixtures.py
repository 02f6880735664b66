"""Recorded run directories for the TUI tests (docs/contracts.md, 'The run directory').

``python tests/support/runfixtures.py [OUT]`` regenerates tests/fixtures/runs/. Every timestamp is
``T0 + offset`` so a test that fixes its clock at ``T0 + n`` sees stable elapsed / last-seen values;
``make_run(..., t0=time.time() - 60)`` makes the same run look live.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

T0 = 1_780_000_000.0  # a fixed, plausible unix time for recorded fixtures
KINDS = ("healthy", "straggler", "failed", "wide", "twonode")
# twonode: 2 nodes x 4 ranks, node 0 named after node 1 in sort order (the table must follow
# ranks, not names) and a straggler on node 1.
TWONODE_HOSTS = ("trn-b12", "trn-a07")

TRACEBACK = """Traceback (most recent call last):
  File "/home/ada/train.py", line 88, in <module>
    main()
  File "/home/ada/train.py", line 71, in main
    loss = model(batch).loss
  File "/home/ada/model.py", line 40, in forward
    h = self.proj(x)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 79.15 GiB \
total capacity)"""


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def _gpu(i: int) -> dict[str, Any]:
    return {
        "index": i,
        "uuid": f"GPU-{i:08d}-0000-4000-8000-{i:012d}",
        "name": "NVIDIA A100-SXM4-80GB",
    }


def make_run(root: Path, kind: str, *, t0: float = T0, run_id: str | None = None) -> Path:
    """Write one run directory of ``kind`` (healthy|straggler|failed|wide|twonode) under
    ``root``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    world = {"wide": 64, "twonode": 8}.get(kind, 2)
    nodes = {"wide": 8, "twonode": 2}.get(kind, 1)
    per_node = world // nodes
    steps = {"healthy": 100, "straggler": 60, "failed": 30, "wide": 40, "twonode": 50}[kind]
    total_steps = 100 if kind != "failed" else 1000
    run_id = run_id or f"20260530-{kind}"
    run_dir = root / run_id
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    status = {
        "healthy": "succeeded",
        "straggler": "running",
        "failed": "failed",
        "wide": "running",
        "twonode": "running",
    }[kind]
    end = t0 + steps + 2 if status in ("succeeded", "failed") else None

    metrics: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = [
        {"t": t0, "kind": "run_started", "rank": None, "message": f"started {world} ranks"}
    ]
    ranks = []
    for r in range(world):
        node = r // per_node
        local = r % per_node
        host = (
            TWONODE_HOSTS[node]
            if kind == "twonode"
            else f"node{node}"
            if nodes > 1
            else "localhost"
        )
        ranks.append(
            {
                "rank": r,
                "local_rank": local,
                "node": host,
                "pid": 40_000 + r,
                "gpu": local if kind != "healthy" else [1, 0][r],
                "exit_code": None,
            }
        )
        events.append(
            {"t": t0 + 0.5, "kind": "rank_started", "rank": r, "message": f"rank {r} started"}
        )
    slow_rank = {"straggler": 1, "twonode": 5}.get(kind)
    for r in range(world):
        # A straggler takes 1.6x as long per step; a 64-rank run spreads ranks a little.
        pace = 1.6 if r == slow_rank else (1.0 + (r % 7) * 0.01)
        last_step = int(steps / pace) if slow_rank is not None else steps
        for step in range(1, last_step + 1):
            t = t0 + 1 + step * pace
            loss = 2.5 * math.exp(-step / 40) + 0.3 + 0.02 * math.sin(step + r)
            samples = 32 / pace * (1 + 0.03 * math.sin(step * 0.7 + r))
            metrics.append(
                {
                    "t": round(t, 3),
                    "rank": r,
                    "kind": "train",
                    "step": step,
                    "total_steps": total_steps,
                    "loss": round(loss, 5),
                    "samples_per_s": round(samples, 3),
                }
            )
            if step % 2 == 0:
                metrics.append(
                    {
                        "t": round(t + 0.1, 3),
                        "rank": r,
                        "kind": "sys",
                        "gpu_util": 92 - (30 if r == slow_rank else 0) - (r % 5),
                        "gpu_mem_used_mib": 40_000 + 100 * r,
                        "gpu_mem_total_mib": 81_920,
                        # one rank a GPU: its own processes hold all the GPU's use
                        "gpu_proc_mem_mib": 40_000 + 100 * r,
                        "rss_mib": 3_000 + r,
                    }
                )
        log_lines = [f"[rank {r}] loading data", f"[rank {r}] model has 124M parameters"]
        log_lines += [
            f"[rank {r}] step {s} loss {2.5 * math.exp(-s / 40) + 0.3:.4f}"
            for s in range(10, last_step + 1, 10)
        ]
        if kind == "failed" and r == 1:
            log_lines += TRACEBACK.splitlines()
        (run_dir / "logs" / f"rank-{r}.log").write_text(
            "\n".join(log_lines) + "\n", encoding="utf-8"
        )
    metrics.sort(key=lambda m: m["t"])

    if slow_rank is not None:
        events.append(
            {
                "t": t0 + 30,
                "kind": "straggler",
                "rank": slow_rank,
                "message": f"rank {slow_rank} is 1.6x slower than the median (37% less GPU "
                "utilization)",
            }
        )
    failure = None
    if kind == "failed":
        failure = {"rank": 1, "exit_code": 1, "traceback": TRACEBACK}
        ranks[1]["exit_code"] = 1
        ranks[0]["exit_code"] = -15
        events += [
            {
                "t": t0 + steps + 1,
                "kind": "rank_exited",
                "rank": 1,
                "message": "rank 1 exited with code 1",
                "exit_code": 1,
            },
            {
                "t": t0 + steps + 1.2,
                "kind": "failure",
                "rank": 1,
                "message": "rank 1 failed first: torch.OutOfMemoryError: CUDA out of memory",
                "exit_code": 1,
            },
            {
                "t": t0 + steps + 1.5,
                "kind": "rank_exited",
                "rank": 0,
                "message": "rank 0 was terminated (signal 15)",
                "exit_code": -15,
            },
            {"t": end, "kind": "run_ended", "rank": None, "message": "run failed"},
        ]
    if kind == "healthy":
        for r in ranks:
            r["exit_code"] = 0
        events += [
            {
                "t": t0 + steps + 1.5,
                "kind": "rank_exited",
                "rank": r,
                "message": f"rank {r} exited with code 0",
                "exit_code": 0,
            }
            for r in range(world)
        ]
        events.append({"t": end, "kind": "run_ended", "rank": None, "message": "run succeeded"})
    _write_jsonl(run_dir / "metrics.jsonl", metrics)
    _write_jsonl(run_dir / "events.jsonl", sorted(events, key=lambda e: e["t"]))

    devices = [_gpu(i) for i in range(per_node if kind != "healthy" else 2)]
    if kind == "healthy":
        devices = [_gpu(1), _gpu(0)]
    run = {
        "run_id": run_id,
        "name": {
            "healthy": "bert-finetune",
            "straggler": "gpt2-ddp",
            "failed": "llama-oom",
            "wide": "wide-64",
            "twonode": "gpt2-2node",
        }[kind],
        "status": status,
        "started_at": t0,
        "ended_at": end,
        "world_size": world,
        "nnodes": nodes,
        "nproc_per_node": per_node,
        "spec": {
            "script": "train.py",
            "args": ["--epochs", "1"],
            "nproc": per_node,
            "nnodes": nodes,
        },
        "argv": [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={per_node}",
            "train.py",
        ],
        "devices": devices,
        "supervisor_pid": None,
        "ranks": ranks,
    }
    if failure:
        run["failure"] = failure
    (run_dir / "run.json").write_text(json.dumps(run, indent=2) + "\n", encoding="utf-8")
    return run_dir


def append_live(run_dir: Path, *, ranks: int, step: int, t: float | None = None) -> int:
    """Append one train line per rank (what 64 ranks logging at once look like); returns bytes."""
    now = time.time() if t is None else t
    rows = []
    for r in range(ranks):
        loss = 2.5 * math.exp(-step / 400) + 0.3 + 0.01 * math.sin(step + r)
        rows.append(
            json.dumps(
                {
                    "t": now,
                    "rank": r,
                    "kind": "train",
                    "step": step,
                    "total_steps": 100_000,
                    "loss": loss,
                    "samples_per_s": 30.0 + (r % 5),
                }
            )
        )
    data = "\n".join(rows) + "\n"
    with (run_dir / "metrics.jsonl").open("a", encoding="utf-8") as fh:
        fh.write(data)
        fh.flush()
    return len(data)


# Per rank: (step_s, data_s, compute_s, comm_s, other_s, mem_mib). Rank 1 waits for data; rank 0
# waits in communication for it: the straggler run seen with the step split (xl.figures).
SPLIT = {0: (0.35, 0.02, 0.2, 0.12, 0.01, 5120.0), 1: (0.35, 0.21, 0.12, 0.01, 0.01, 5220.0)}
# Per rank: what its own processes hold on its GPU (NVML), less than the GPU's 40000 MiB in all.
SPLIT_GPU_MEM = {0: 30_000.0, 1: 30_400.0}
STRAGGLER_DATA = (
    "rank 1 is the straggler: 210 ms of its 350 ms step waiting for data; the other rank waits "
    "~120 ms in communication for it"
)


def add_step_split(run_dir: Path, *, t0: float = T0) -> Path:
    """A recorded 2-rank run's last ten steps timed and split (SPLIT), its ranks' footprints in
    sys lines, and its straggler event with the phase it names (replacing any before it)."""
    rows = []
    for i in range(10):
        t = t0 + 120 + i
        for r, (step_s, data_s, compute_s, comm_s, other_s, mem) in SPLIT.items():
            rows.append(
                {
                    "t": t + 0.5 * r,
                    "rank": r,
                    "kind": "train",
                    "step": 90 + i,
                    "total_steps": 100,
                    "loss": 0.5 + r / 50,
                    "samples_per_s": 30.0 - 10 * r,
                    "step_s": step_s,
                    "data_s": data_s,
                    "compute_s": compute_s,
                    "comm_s": comm_s,
                    "other_s": other_s,
                }
            )
            rows.append(
                {
                    "t": t + 0.2,
                    "rank": r,
                    "kind": "sys",
                    "gpu_util": 90,
                    "gpu_mem_used_mib": 40000,
                    "gpu_mem_total_mib": 81920,
                    "gpu_proc_mem_mib": SPLIT_GPU_MEM[r],
                    "rss_mib": 3000,
                    "mem_mib": mem,
                }
            )
    with (run_dir / "metrics.jsonl").open("a", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(row) + "\n" for row in rows))
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    events = [e for e in events if e.get("kind") != "straggler"]
    events.append(
        {
            "t": t0 + 125,
            "kind": "straggler",
            "rank": 1,
            "phase": "data",
            "method": "step_phase",
            "message": STRAGGLER_DATA,
        }
    )
    _write_jsonl(run_dir / "events.jsonl", events)
    return run_dir


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "fixtures" / "runs"
    out.mkdir(parents=True, exist_ok=True)
    for kind in KINDS:
        make_run(out, kind)
    print(f"wrote {len(KINDS)} runs under {os.fspath(out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
