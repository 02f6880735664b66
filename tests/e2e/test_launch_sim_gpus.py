"""A real run on simulated GPUs: the order chosen reaches run.json and every rank's environment."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from procs import launched_run, run_json, wait_for, wait_no_processes, xl, xl_env
from simnvml import default_uuid

from xl.launcher.view.reader import RunReader
from xl.tui.widgets.rank_cells import format_cells, rank_values
from xl.units import mib

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
    args = ["--gpus", f"3,{default_uuid(1)}", "gpu.py"]
    with launched_run(args, env, cwd=tmp_path, how="to_end") as launched:
        proc, run_dir = launched.result, launched.run_dir
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


def test_fewer_ranks_than_gpus_expose_only_the_gpus_the_ranks_use(tmp_path: Path, simnvml) -> None:
    """--nproc 2 on 4 GPUs: the first 2 of the GPUs chosen (nvidia-smi order without --gpus)
    are the run's, and the only ones the ranks see, `run.json` records and `xl runs` lists."""
    sim = simnvml(gpus=4)
    home = tmp_path / "home"
    (tmp_path / "gpu.py").write_text(SCRIPT)
    env = xl_env(home, **sim.env)
    with launched_run(["--nproc", "2", "gpu.py"], env, cwd=tmp_path, how="to_end") as launched:
        proc, run_dir = launched.result, launched.run_dir
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


HOLD = """
import os, pathlib, sys, time
import xl

out = pathlib.Path(sys.argv[1])
(out / f"pid-{os.environ['RANK']}").write_text(str(os.getpid()))
deadline = time.time() + 60
step = 0
while not (out / "stop").exists() and time.time() < deadline:
    step += 1
    xl.log(step=step, loss=1.0 / step)
    time.sleep(0.2)
"""


def _mem_cells(text: str) -> dict[str, str]:
    """Each rank's mem cell from the plain rank table that ``text`` prints."""
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in text.splitlines() if "|" in ln]
    header = next(r for r in rows if r[:2] == ["rank", "state"])
    rank, mem = header.index("rank"), header.index("mem")
    return {r[rank]: r[mem] for r in rows if r[rank].isdigit()}


def test_each_rank_shows_its_own_gpu_memory_not_the_gpu_s(
    tmp_path: Path, simnvml, simnvml_gpu
) -> None:
    """Three ranks on three GPUs that each hold 30000 MiB in all: each rank's row (the plain end
    table, `xl runs RUN`, the Monitor's cells) shows what NVML lists for the rank's own process,
    1000 and 1100 MiB, never the GPU's 30000 (29.3G); rank 2, whose process NVML does not list,
    shows no figure rather than its GPU's."""
    sim = simnvml(gpus=[simnvml_gpu(memory_used_mib=30_000) for _ in range(3)])
    home = tmp_path / "home"
    (tmp_path / "hold.py").write_text(HOLD)
    env = xl_env(home, **sim.env)
    with launched_run(["--nproc", "3", "hold.py", str(tmp_path)], env, cwd=tmp_path) as launched:
        run_dir = launched.run_dir
        for rank in (0, 1):
            pid_file = tmp_path / f"pid-{rank}"
            wait_for(pid_file.exists, timeout=90, what=f"rank {rank}'s pid")
            sim.add_process(rank, int(pid_file.read_text()), 1000 + 100 * rank)
        wait_for((tmp_path / "pid-2").exists, timeout=90, what="rank 2's pid")

        def own_figures() -> set[tuple[int, float]]:
            seen = set()
            for ln in (run_dir / "metrics.jsonl").read_text().splitlines():
                rec = json.loads(ln)
                if rec.get("kind") == "sys" and "gpu_proc_mem_mib" in rec:
                    seen.add((rec["rank"], rec["gpu_proc_mem_mib"]))
            return seen

        wait_for(
            lambda: (
                {(0, 1000), (1, 1100)} <= own_figures()
                and any(
                    json.loads(ln).get("rank") == 2 and "gpu_util" in ln
                    for ln in (run_dir / "metrics.jsonl").read_text().splitlines()
                )
            ),
            timeout=60,
            what="each rank's own GPU memory in its sys lines",
        )
        (tmp_path / "stop").touch()
        done = launched.finish(timeout=90)
        out = done.stdout
        assert done.returncode == 0, out + done.stderr
        want = {"0": "1.0G/80.0G", "1": "1.1G/80.0G", "2": ""}
        assert _mem_cells(out) == want, out
        shown = xl(["runs", run_dir.name], env).stdout
        assert _mem_cells(shown) == want, shown
        assert "29.3G" not in out + shown  # the GPUs' 30000 MiB in all
        view = RunReader(run_dir).poll()
        monitor = {
            r: str(format_cells(rank_values(rv, time.time(), None))["mem"]).strip()
            for r, rv in view.ranks.items()
        }
        assert monitor == {0: "1.0G", 1: "1.1G", 2: "-"}, monitor
        wait_no_processes(run_dir, timeout=10)


def test_cpu_ranks_show_their_host_memory(tmp_path: Path) -> None:
    """No GPU: each rank's row shows the rank's footprint in host memory, as a GPU rank's shows
    its own GPU memory (the healthy case of a row with no GPU figure at all)."""
    home = tmp_path / "home"
    (tmp_path / "hold.py").write_text(HOLD)
    env = xl_env(home)
    with launched_run(["--nproc", "2", "hold.py", str(tmp_path)], env, cwd=tmp_path) as launched:
        run_dir = launched.run_dir
        wait_for((tmp_path / "pid-1").exists, timeout=90, what="rank 1's pid")

        def footprints() -> set[int]:
            lines = (run_dir / "metrics.jsonl").read_text().splitlines()
            return {
                rec["rank"]
                for rec in map(json.loads, lines)
                if rec.get("kind") == "sys" and rec.get("mem_mib")
            }

        wait_for(lambda: footprints() == {0, 1}, timeout=60, what="each rank's footprint")
        (tmp_path / "stop").touch()
        done = launched.finish(timeout=90)
        out = done.stdout
        assert done.returncode == 0, out + done.stderr
        view = RunReader(run_dir).poll()
        want = {str(r): mib(rv.mem_mib) for r, rv in view.ranks.items()}
        assert len(want) == 2 and all(m.endswith("M") for m in want.values()), want
        assert _mem_cells(out) == want, out
        shown = xl(["runs", run_dir.name], env).stdout
        assert _mem_cells(shown) == want, shown
        monitor = {
            str(r): str(format_cells(rank_values(rv, time.time(), None))["mem"]).strip()
            for r, rv in view.ranks.items()
        }
        assert monitor == want, monitor
        wait_no_processes(run_dir, timeout=10)
