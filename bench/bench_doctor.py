"""Wall time of `xl doctor --json` as a new process vs `python -m torch.utils.collect_env`.

Both run in the same session, interleaved, several times; the medians and their ratio are printed.
The goal is a ratio <= 0.06 (it was 0.1 before the cuInit, fabric, kernel-module and library
probes) while the doctor decides far more than collect_env prints.
`xl doctor --build` compiles for real, so it is allowed the compiler's time: it is timed on its
own line, against the same anchor, and not held to the goal.

    .venv/bin/python bench/bench_doctor.py [--runs 7] [--doctor-tree DIR] [--no-build]
        [--sim-gpus N]

--sim-gpus N gives the doctor N simulated GPUs (tests/support/simnvml.py, through the real
nvidia-ml-py), so the per-GPU NVML queries (inventory with processes, compute mode, ECC, row
remaps, retired pages) are in the figure on a machine without a GPU.
--doctor-tree times the doctor package found in DIR (e.g. `git archive HEAD doctor | tar -x -C
DIR`) in place of this checkout's: the before/after figure of a change, in one session.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Runs `xl doctor` with xl.doctor's modules taken from another folder (the --doctor-tree).
_FROM_TREE = (
    "import sys, xl.doctor as d; d.__path__[:] = [sys.argv[1]]; "
    "from xl.doctor.cli import main; raise SystemExit(main(sys.argv[2:]))"
)


def _time(
    argv: list[str], env: dict[str, str] | None = None
) -> tuple[float, subprocess.CompletedProcess[bytes]]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, timeout=300, env=env)
    return time.perf_counter() - t0, proc


def _sim_env(gpus: int, where: str) -> dict[str, str]:
    """This environment plus a simulated driver with `gpus` busy GPUs (one process each)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
    import simnvml  # noqa: PLC0415 - only --sim-gpus needs the test support module

    lib = simnvml.build(where)
    gpu = [simnvml.SimGPU(processes=[simnvml.SimProcess(os.getpid(), 512)]) for _ in range(gpus)]
    sim = simnvml.SimNVML(lib, Path(where) / "simnvml.conf", gpu)
    return {**os.environ, **sim.env}


def _median_ms(times: list[float]) -> str:
    return f"median {statistics.median(times) * 1000:7.1f} ms  (min {min(times) * 1000:.1f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--doctor-tree", metavar="DIR", help="time the doctor package in DIR/doctor")
    ap.add_argument("--no-build", action="store_true", help="skip timing `xl doctor --build`")
    ap.add_argument("--sim-gpus", type=int, default=0, metavar="N", help="N simulated GPUs")
    args = ap.parse_args(argv)
    tmp = tempfile.TemporaryDirectory(prefix="bench-doctor-")
    env = _sim_env(args.sim_gpus, tmp.name) if args.sim_gpus else None
    if args.doctor_tree:
        doctor = [sys.executable, "-c", _FROM_TREE, f"{args.doctor_tree}/doctor", "--json"]
    else:
        doctor = [sys.executable, "-m", "xl", "doctor", "--json"]
    anchor = [sys.executable, "-m", "torch.utils.collect_env"]
    # One untimed run each warms the page cache so neither pays for a cold disk.
    _time(doctor, env)
    _time(anchor)
    d_times: list[float] = []
    a_times: list[float] = []
    b_times: list[float] = []
    for _ in range(args.runs):
        t, proc = _time(doctor, env)
        report = json.loads(proc.stdout)  # a run that printed no report does not count as fast
        if args.sim_gpus and len(report["gpus"]) != args.sim_gpus:
            print(
                f"the doctor saw {len(report['gpus'])} GPUs, not {args.sim_gpus}", file=sys.stderr
            )
            return 1
        d_times.append(t)
        t, proc = _time(anchor)
        if proc.returncode != 0:
            print(
                f"collect_env failed: {proc.stderr.decode(errors='replace')[-300:]}",
                file=sys.stderr,
            )
            return 1
        a_times.append(t)
    if not args.no_build and not args.doctor_tree:
        for _ in range(max(1, args.runs // 2)):
            t, proc = _time([*doctor, "--build"], env)
            json.loads(proc.stdout)
            b_times.append(t)
    d, a = statistics.median(d_times), statistics.median(a_times)
    print(
        f"runs: {args.runs}"
        + (f"  (doctor from {args.doctor_tree})" if args.doctor_tree else "")
        + (f"  ({args.sim_gpus} simulated GPUs)" if args.sim_gpus else "")
    )
    print(f"xl doctor --json            {_median_ms(d_times)}")
    print(f"torch.utils.collect_env     {_median_ms(a_times)}")
    print(f"ratio doctor/collect_env    {d / a:.3f}  (goal <= 0.06)")
    if b_times:
        b = statistics.median(b_times)
        print(f"xl doctor --json --build    {_median_ms(b_times)}")
        print(f"ratio build/collect_env     {b / a:.3f}  (compiles for real: no goal)")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
