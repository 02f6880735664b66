"""The exporter's step-time families (docs/exporter.md): each rank's step time and its split by
phase from its latest timed line, its CUDA peak; none for a rank whose steps are not timed."""

from __future__ import annotations

import json
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from runfixtures import make_run

from xl.launcher.exporter.metrics import RunsCollector


def test_step_time_by_phase_per_rank(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    now = time.time()
    run_dir = make_run(runs, "twonode", t0=now - 52)  # live, 8 ranks, steps not timed
    with open(run_dir / "metrics.jsonl", "a") as fh:
        for rank in (0, 5):
            for i, data in enumerate((0.01, 0.02, 0.25 if rank == 5 else 0.03)):
                rec = {
                    "t": now - 3 + i,
                    "rank": rank,
                    "kind": "train",
                    "step": 60 + i,
                    "steps": 2,
                    "step_s": round(data + 0.3, 6),
                    "data_s": data,
                    "compute_s": 0.2,
                    "comm_s": 0.08,
                    "other_s": 0.02,
                    "mem_peak_mib": 1024.0 + rank,
                }
                fh.write(json.dumps(rec) + "\n")
    registry = CollectorRegistry()
    registry.register(RunsCollector(runs, gpus=False))
    text = generate_latest(registry).decode()
    got: dict[str, dict[tuple[str, ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("run_id") == "20260530-twonode" and "rank" in s.labels:
                got.setdefault(s.name, {})[(s.labels["rank"], s.labels.get("phase", ""))] = s.value
    assert got["xl_rank_step_seconds"] == {("0", ""): 0.33, ("5", ""): 0.55}
    assert got["xl_rank_step_phase_seconds"] == {
        ("0", "data"): 0.03, ("0", "compute"): 0.2, ("0", "comm"): 0.08, ("0", "other"): 0.02,
        ("5", "data"): 0.25, ("5", "compute"): 0.2, ("5", "comm"): 0.08, ("5", "other"): 0.02,
    }
    assert got["xl_rank_memory_peak_bytes"] == {
        ("0", ""): 1024.0 * (1 << 20),
        ("5", ""): 1029.0 * (1 << 20),
    }
    assert len(got["xl_train_step"]) == 8  # every rank is there; only the timed ones have a split
