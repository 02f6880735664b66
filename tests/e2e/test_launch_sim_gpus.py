"""A real run on simulated GPUs: the order chosen reaches run.json and every rank's environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from procs import kill_run, only_run, run_json, wait_no_processes, xl, xl_env
from simnvml import default_uuid

pytestmark = pytest.mark.e2e

SCRIPT = """
import json, os
print("env " + json.dumps({k: os.environ.get(k)
                           for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "LOCAL_RANK")}))
"""


def test_ranks_get_the_gpus_in_the_order_given(tmp_path: Path, simnvml) -> None:
    sim = simnvml(gpus=4)
    home = tmp_path / "home"
    (tmp_path / "gpu.py").write_text(SCRIPT)
    env = xl_env(home, **sim.env)
    proc = xl(
        ["launch", "--no-tui", "--gpus", f"3,{default_uuid(1)}", "gpu.py"],
        env,
        cwd=tmp_path,
        timeout=90,
    )
    run_dir = only_run(home)
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        run = run_json(run_dir)
        assert [(d["index"], d["uuid"]) for d in run["devices"]] == [
            (3, default_uuid(3)),
            (1, default_uuid(1)),
        ]
        assert [(r["rank"], r["gpu"], r["gpu_uuid"]) for r in run["ranks"]] == [
            (0, 3, default_uuid(3)),
            (1, 1, default_uuid(1)),
        ]
        for rank in (0, 1):
            line = next(
                ln
                for ln in (run_dir / "logs" / f"rank-{rank}.log").read_text().splitlines()
                if ln.startswith("env ")
            )
            assert json.loads(line[4:]) == {
                "CUDA_VISIBLE_DEVICES": "3,1",
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "LOCAL_RANK": str(rank),
            }
        wait_no_processes(run_dir, timeout=3)
    finally:
        kill_run(run_dir)


def test_fewer_ranks_than_gpus_expose_only_the_gpus_the_ranks_use(tmp_path: Path, simnvml) -> None:
    """--nproc 2 on 4 GPUs: the first 2 of the GPUs chosen (nvidia-smi order without --gpus)
    are the run's, and the only ones the ranks see, `run.json` records and `xl runs` lists."""
    sim = simnvml(gpus=4)
    home = tmp_path / "home"
    (tmp_path / "gpu.py").write_text(SCRIPT)
    env = xl_env(home, **sim.env)
    proc = xl(["launch", "--no-tui", "--nproc", "2", "gpu.py"], env, cwd=tmp_path, timeout=90)
    run_dir = only_run(home)
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        run = run_json(run_dir)
        assert [d["index"] for d in run["devices"]] == [0, 1]
        assert [(r["rank"], r["gpu"]) for r in run["ranks"]] == [(0, 0), (1, 1)]
        for rank in (0, 1):
            line = next(
                ln
                for ln in (run_dir / "logs" / f"rank-{rank}.log").read_text().splitlines()
                if ln.startswith("env ")
            )
            assert json.loads(line[4:])["CUDA_VISIBLE_DEVICES"] == "0,1"
        listed = xl(["runs"], env).stdout.splitlines()
        header = listed[0].split()
        assert listed[1].split()[header.index("GPUS")] == "0,1"
        # --gpus keeps its order: the first two as written.
        dry = xl(
            ["launch", "--dry-run", "--json", "--gpus", "3,1,2", "--nproc", "2", "gpu.py"],
            env,
            cwd=tmp_path,
        )
        assert json.loads(dry.stdout)["env"]["CUDA_VISIBLE_DEVICES"] == "3,1"
        wait_no_processes(run_dir, timeout=3)
    finally:
        kill_run(run_dir)
