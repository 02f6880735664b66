"""The step split on the GPU's own clock, on a real GPU (skipped where none is visible): a plain
DDP loop that never calls xl (tests/gpu/steps_gpu.py) under the real `xl launch`.

- One rank on NCCL: its lines say ``clock: cuda``, the parts add up to ``step_s``, and its
  compute + communication per step is within 10% of the device time ``torch.profiler`` gives
  its kernels over the same steps; ``xl runs --json`` says ``cuda``.
- The hooks add no device synchronisation to the training thread: the same loop makes as many
  with them as under ``--no-instrument``.
- Two ranks on one GPU over gloo with CUDA tensors (launched as CPU ranks, each taking GPU 0
  itself: xl runs one rank per GPU): both on the device's clock, their wait for each other in
  ``comm``.
- A rank whose GPU work is slower (``torch.cuda._sleep`` in its forward, its host as fast as
  the others') is the straggler, in ``compute``.
- ``mem_peak_mib`` is the allocator's peak per step: what the same loop reads from
  ``torch.cuda.max_memory_allocated`` (reset each step) under ``--no-instrument``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SCRIPT = HERE / "steps_gpu.py"
LAUNCH_TIMEOUT_S = 420
PHASES = ("data_s", "compute_s", "comm_s", "other_s")
FAST = {"XL_STRAGGLER_WINDOW_S": "4", "XL_STRAGGLER_SUSTAIN": "3"}


class Run:
    def __init__(self, run_dir: Path, out: Path, home: Path) -> None:
        self.dir, self.out, self.home = run_dir, out, home
        text = (run_dir / "metrics.jsonl").read_text()
        self.metrics = [json.loads(line) for line in text.splitlines() if line.strip()]
        text = (run_dir / "events.jsonl").read_text()
        self.events = [json.loads(line) for line in text.splitlines() if line.strip()]

    def steps(self, rank: int) -> list[dict[str, Any]]:
        return [
            m for m in self.metrics if m["rank"] == rank and m["kind"] == "train" and "step_s" in m
        ]

    def truth(self, rank: int) -> dict[str, Any]:
        return json.loads((self.out / f"rank-{rank}.json").read_text())


def _launch(tmp: Path, box: Any, xl_args: list[str], script_args: list[str], **env: str) -> Run:
    home, out = tmp / "xl-home", tmp / "out"
    out.mkdir(parents=True)
    argv = [sys.executable, "-m", "xl", "launch", "--no-tui", *xl_args, "--", str(SCRIPT)]
    proc = subprocess.run(
        [*argv, "--out", str(out), *script_args],
        env=box.clean_env(XL_HOME=str(home), PYTHONUNBUFFERED="1", **env),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    runs = sorted((home / "runs").glob("*/run.json"))
    assert len(runs) == 1, f"expected one run dir; xl launch said:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"the run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return Run(runs[0].parent, out, home)


def _on_device(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    timed = [line for line in lines if line.get("clock") == "cuda"]
    assert len(timed) >= 0.8 * len(lines), [line.get("clock") for line in lines]
    for line in timed:
        assert min(line[k] for k in PHASES) >= 0, line
        assert sum(line[k] for k in PHASES) == pytest.approx(line["step_s"], abs=2e-5), line
    return timed


def test_one_rank_on_nccl_is_split_on_the_gpus_clock_as_the_profiler_sees_it(
    tmp_path: Path, box: Any
) -> None:
    run = _launch(tmp_path, box, ["--gpus", "0"], ["--steps", "300", "--profile", "100:200"])
    timed = _on_device(run.steps(0))
    # The lines whose steps all lie in the profiled window, weighted by their steps.
    inside = [
        line
        for line in timed
        if line["step"] - line.get("steps", 1) + 1 >= 100 and line["step"] < 200
    ]
    assert inside, timed
    steps = sum(line.get("steps", 1) for line in inside)
    busy = sum((line["compute_s"] + line["comm_s"]) * line.get("steps", 1) for line in inside)
    profiled = json.loads((run.out / "profile.json").read_text())["device_s"]
    assert busy / steps == pytest.approx(profiled, rel=0.10), (busy / steps, profiled)
    listed = subprocess.run(
        [sys.executable, "-m", "xl", "runs", "--json"],
        env=box.clean_env(XL_HOME=str(run.home)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    (doc,) = json.loads(listed.stdout)
    assert doc["split"]["0"]["clock"] == "cuda", doc["split"]


def test_the_hooks_add_no_device_sync_to_the_training_thread(tmp_path: Path, box: Any) -> None:
    args = ["--steps", "200", "--count-syncs"]
    hooked = _launch(tmp_path / "on", box, ["--gpus", "0"], args)
    bare = _launch(tmp_path / "off", box, ["--gpus", "0", "--no-instrument"], args)
    assert _on_device(hooked.steps(0))
    assert hooked.truth(0)["syncs"] == bare.truth(0)["syncs"] >= 0


def test_two_ranks_on_one_gpu_over_gloo_are_on_the_devices_clock(tmp_path: Path, box: Any) -> None:
    run = _launch(
        tmp_path,
        box,
        ["--nproc", "2"],
        ["--backend", "gloo", "--one-gpu", "--width", "1024", "--steps", "200"],
        CUDA_VISIBLE_DEVICES="",
    )
    for rank in (0, 1):
        assert run.truth(rank)["device"] == "cuda:0"
        timed = _on_device(run.steps(rank))
        # gloo copies CUDA tensors through the host: the ranks' waits for each other are comm.
        assert statistics.median(line["comm_s"] for line in timed) > 0, timed


def test_a_rank_slow_on_its_gpu_is_the_straggler_in_compute(
    tmp_path: Path, box: Any, machine: Any
) -> None:
    slow = ["--steps", "300", "--delay-rank", "1", "--delay-ms", "60"]
    if len(machine.devices) >= 2:
        run = _launch(tmp_path, box, ["--gpus", "0,1"], slow, **FAST)
    else:  # one GPU: two ranks on it over gloo
        one = ["--backend", "gloo", "--one-gpu", "--width", "1024"]
        run = _launch(
            tmp_path, box, ["--nproc", "2"], [*one, *slow], CUDA_VISIBLE_DEVICES="", **FAST
        )
    stragglers = [e for e in run.events if e["kind"] == "straggler"]
    assert stragglers and {e["rank"] for e in stragglers} == {1}, stragglers
    assert stragglers[0]["phase"] == "compute", stragglers[0]
    slow_compute = statistics.median(line["compute_s"] for line in _on_device(run.steps(1)))
    assert slow_compute >= 0.05  # its 60 ms spin each step, on the device


def test_mem_peak_is_the_allocators_peak_in_the_step(tmp_path: Path, box: Any) -> None:
    args = ["--steps", "120", "--width", "2048"]
    hooked = _launch(tmp_path / "on", box, ["--gpus", "0"], args)
    bare = _launch(tmp_path / "off", box, ["--gpus", "0", "--no-instrument"], [*args, "--own-peak"])
    peaks = bare.truth(0)["peaks_mib"][20:]
    seen = [line["mem_peak_mib"] for line in hooked.steps(0)[5:] if "mem_peak_mib" in line]
    assert seen and peaks
    assert statistics.median(seen) == pytest.approx(statistics.median(peaks), rel=0.02)
