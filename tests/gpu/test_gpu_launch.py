"""`xl launch` of a real NCCL DDP run, one rank per visible GPU (world size 1 on a 1-GPU box).

One run (tests/gpu/ddp_gpu.py, ~10 s of GPU-bound steps) is checked for everything only real
GPUs show: xl.log of CUDA tensors adds no device sync on the training thread, xl.watch's
all-reduce hook on NCCL (times recorded, gradients still averaged exactly), the sampler's
per-rank GPU figures from real NVML, and `xl gpus` naming each rank's process mid-run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]  # a real build / run: minutes

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LAUNCH_TIMEOUT_S = 420
PROBE_VALUE = 12345.0  # ddp_gpu.py logs it behind a ~0.2 s kernel


class Run:
    def __init__(self, run_dir: Path, out: Path) -> None:
        self.dir = run_dir
        self.record: dict[str, Any] = json.loads((run_dir / "run.json").read_text())
        self.metrics = [
            json.loads(line)
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()
        ]
        self.reports = {
            r["rank"]: r for r in (json.loads(p.read_text()) for p in out.glob("rank-*.json"))
        }
        snap = out / "gpus.json"
        self.gpus_mid_run: dict[str, Any] = json.loads(snap.read_text()) if snap.exists() else {}

    def lines(self, rank: int, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.metrics if m.get("rank") == rank and m.get("kind") == kind]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, box: Any, machine: Any) -> Run:
    tmp = tmp_path_factory.mktemp("nccl-run")
    out = tmp / "out"
    out.mkdir()
    env = box.clean_env(XL_HOME=str(tmp / "xl-home"), PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "xl", "launch", "--gpus", "all", "--no-tui", "--name"]
    argv += ["gpu-acceptance", "--", str(HERE / "ddp_gpu.py"), "--out", str(out)]
    proc = subprocess.run(
        argv,
        env=env,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    runs = sorted((tmp / "xl-home" / "runs").glob("*/run.json"))
    assert len(runs) == 1, f"expected one run dir; xl launch said:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"the run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return Run(runs[0].parent, out)


def test_one_rank_per_gpu_and_the_run_succeeded(run: Run, machine: Any) -> None:
    n = len(machine.devices)
    assert run.record["status"] == "succeeded"
    ranks = sorted(run.record["ranks"], key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == list(range(n))
    assert [r["gpu"] for r in ranks] == list(range(n))  # --gpus all: nvidia-smi order
    assert [r["exit_code"] for r in ranks] == [0] * n
    assert sorted(run.reports) == list(range(n)) and all(
        r["world"] == n for r in run.reports.values()
    )


def test_xl_log_of_cuda_tensors_adds_no_device_sync(run: Run) -> None:
    for rank, rep in run.reports.items():
        assert rep["control_syncs"] >= 1, "the sync counter saw no deliberate .item(): not counting"
        assert rep["syncs_in_log"] == 0, f"rank {rank}: xl.log synchronised {rep['syncs_in_log']}x"
        # xl.log returned while the GPU still had ~0.2 s of work queued before the logged value.
        said = json.dumps(rep)  # the whole report (pytest would shorten the dict)
        assert rep["probe_busy_s"] > 0.05, said  # the GPU really was busy (else proves nothing)
        assert rep["probe_log_s"] < min(0.01, rep["probe_busy_s"] / 5), said
        # ... and the value still arrived, read off the training thread once it was ready.
        probes = [m["probe"] for m in run.lines(rank, "train") if "probe" in m]
        assert probes == [PROBE_VALUE], f"rank {rank}: probe values {probes}"
        losses = [m["loss"] for m in run.lines(rank, "train") if "loss" in m]
        assert len(losses) >= rep["steps"] * 0.99 and all(isinstance(v, float) for v in losses)


def test_watch_times_the_nccl_all_reduce_and_keeps_gradients_exact(run: Run) -> None:
    checksums = {r["param_checksum"] for r in run.reports.values()}
    assert len(checksums) == 1, f"ranks ended with different weights: {checksums}"
    for rank, rep in run.reports.items():
        assert rep["last_loss"] < rep["first_loss"], rep
        watched = [m for m in run.lines(rank, "sys") if m.get("comm_steps")]
        assert watched, f"rank {rank}: no comm_wait_s from xl.watch in metrics.jsonl"
        assert all(0 <= m["comm_wait_s"] <= m["comm_wait_max_s"] for m in watched)


def test_sampler_reads_each_rank_gpu_from_nvml(run: Run) -> None:
    for r in run.record["ranks"]:
        rank, gpu = r["rank"], r["gpu"]
        sampled = [m for m in run.lines(rank, "sys") if "gpu_util" in m]
        assert sampled, f"rank {rank}: no GPU figures from the sampler"
        assert {m["gpu"] for m in sampled} == {gpu}
        assert max(m["gpu_util"] or 0 for m in sampled) > 0, "GPU-bound steps, 0% utilization"
        assert all(0 < m["gpu_mem_used_mib"] <= m["gpu_mem_total_mib"] for m in sampled)
        # Found through NVML's process list by the rank's PID (in a container: through NSpid).
        own = [m for m in sampled if m.get("gpu_proc_mem_mib")]
        assert own, f"rank {rank}: NVML's process list never named the rank's pid {r['pid']}"
        # The rank's own share of its GPU: within the whole GPU's used memory, and at least what
        # torch reserved there (the CUDA context comes on top).
        for m in own:
            assert m["gpu_proc_mem_mib"] <= m["gpu_mem_used_mib"], m
            if m.get("cuda_reserved_mib"):
                assert m["gpu_proc_mem_mib"] >= m["cuda_reserved_mib"], m


def test_xl_gpus_labels_every_rank_process(run: Run) -> None:
    doc = run.gpus_mid_run
    assert doc.get("gpus"), f"rank 0's `xl gpus --json` mid-run: {doc}"
    labelled = {
        p["rank"]: (g["index"], p["pid"], p["run_id"])
        for g in doc["gpus"]
        for p in g["processes"]
        if p["run_id"] == run.record["run_id"]
    }
    expected = {r["rank"]: (r["gpu"], r["pid"], run.record["run_id"]) for r in run.record["ranks"]}
    assert labelled == expected
