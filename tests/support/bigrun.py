"""A big live run's directory without its processes: what node 0 of an ``N``-rank run writes.

run.json with ``ranks`` ranks on ``ranks / per_node`` nodes (``node_rank``, host ``nodeK``), and
metrics.jsonl with two train lines a rank a second (step, loss, samples and the four phase times)
and one sys line. ``step_time(rank)`` is each rank's step time, the ground truth of the figures a
view or the exporter derives from these lines. Used by the exporter's and the plain view's tests
and by bench/bench_exporter.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

STEPS_PER_S = 2


def step_time(rank: int, slow: Iterable[int] = ()) -> float:
    """The rank's step time in seconds: 0.5 s spread by up to 6%, 2 s for a ``slow`` rank."""
    return 2.0 if rank in set(slow) else round(0.5 * (1.0 + (rank % 7) * 0.01), 4)


def make_big_run(
    root: Path,
    ranks: int,
    *,
    per_node: int = 8,
    t0: float,
    seconds: int = 2,
    failed: Iterable[int] = (),
    slow: Iterable[int] = (),
    status: str = "running",
) -> Path:
    """The run dir, with ``seconds`` of lines from ``t0``; ``failed`` ranks exited with code 1
    (their lines stop after the first second), ``slow`` ranks take 2 s a step."""
    run_dir = root / f"20261128-big-{ranks}"
    (run_dir / "logs").mkdir(parents=True)
    gone = set(failed)
    rows = [
        {
            "rank": r,
            "local_rank": r % per_node,
            "node": f"node{r // per_node}",
            "node_rank": r // per_node,
            "pid": 100_000 + r,
            "gpu": r % per_node,
            "exit_code": 1 if r in gone else _end_code(status),
        }
        for r in range(ranks)
    ]
    nodes = -(-ranks // per_node)
    run = {
        "run_id": run_dir.name,
        "name": f"big-{ranks}",
        "status": status,
        "started_at": t0,
        "ended_at": None if status == "running" else t0 + seconds,
        "world_size": ranks,
        "nnodes": nodes,
        "nproc_per_node": per_node,
        "node_rank": 0,
        "spec": {"script": "train.py", "args": [], "nproc": per_node, "nnodes": nodes},
        "argv": ["torchrun", "train.py"],
        "devices": [],
        "supervisor_pid": None,
        "ranks": rows,
    }
    if status == "failed" and gone:
        first = min(gone)
        run["failure"] = {
            "rank": first,
            "exit_code": 1,
            "message": f"rank {first} failed first: exit code 1",
        }
    (run_dir / "run.json").write_text(json.dumps(run) + "\n", encoding="utf-8")
    events = [{"t": t0, "kind": "run_started", "rank": None, "message": f"started {ranks} ranks"}]
    events += [
        {"t": t0 + 0.2, "kind": "rank_started", "rank": r, "message": f"rank {r} started"}
        for r in range(ranks)
    ]
    events += [
        {
            "t": t0 + 1,
            "kind": "rank_exited",
            "rank": r,
            "message": f"rank {r} exited with code 1",
            "exit_code": 1,
        }
        for r in sorted(gone)
    ]
    if status == "succeeded":
        events += [
            {
                "t": t0 + seconds,
                "kind": "rank_exited",
                "rank": r,
                "message": f"rank {r} exited with code 0",
                "exit_code": 0,
            }
            for r in range(ranks)
        ]
    (run_dir / "events.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in events), encoding="utf-8"
    )
    with (run_dir / "metrics.jsonl").open("wb") as fh:
        for second in range(seconds):
            fh.write(chunk(ranks, second, t0, skip=gone if second else (), slow=slow))
    return run_dir


def _end_code(status: str) -> int | None:
    """A rank's exit code that did not fail: none while running; 0 in a run that succeeded; xl's
    stop (SIGTERM) in one that failed."""
    return {"running": None, "succeeded": 0}.get(status, -15)


def chunk(
    ranks: int, second: int, t0: float, *, skip: Iterable[int] = (), slow: Iterable[int] = ()
) -> bytes:
    """One second of the run's lines (none from the ranks in ``skip``)."""
    out = []
    left_out, slow = set(skip), set(slow)
    for tick in range(STEPS_PER_S):
        step = second * STEPS_PER_S + tick + 1
        t = round(t0 + second + tick / STEPS_PER_S, 3)
        for r in range(ranks):
            if r in left_out:
                continue
            took = step_time(r, slow)
            out.append(
                json.dumps(
                    {
                        "t": t,
                        "rank": r,
                        "kind": "train",
                        "step": step,
                        "loss": round(2.5 * math.exp(-step / 400) + 0.3, 5),
                        "samples": 16,
                        "samples_per_s": round(16 / took, 3),
                        "step_s": took,
                        "data_s": 0.01,
                        "compute_s": round(took - 0.2, 4),
                        "comm_s": 0.15,
                        "other_s": 0.04,
                    }
                )
            )
    t = round(t0 + second + 0.05, 3)
    for r in range(ranks):
        if r not in left_out:
            out.append(
                json.dumps(
                    {"t": t, "rank": r, "kind": "sys", "gpu_util": 90, "gpu_mem_used_mib": 40000}
                )
            )
    return ("\n".join(out) + "\n").encode()
