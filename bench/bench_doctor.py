"""Wall time of `xl doctor --json` as a new process vs `python -m torch.utils.collect_env`.

Both run in the same session, interleaved, several times; the medians and their ratio are printed.
The goal (issue 3) is a ratio <= 0.2 while the doctor decides far more than collect_env prints.

    .venv/bin/python bench/bench_doctor.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def _time(argv: list[str]) -> tuple[float, subprocess.CompletedProcess[bytes]]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, timeout=120)
    return time.perf_counter() - t0, proc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args(argv)
    doctor = [sys.executable, "-m", "xl", "doctor", "--json"]
    anchor = [sys.executable, "-m", "torch.utils.collect_env"]
    # One untimed run each warms the page cache so neither pays for a cold disk.
    _time(doctor)
    _time(anchor)
    d_times: list[float] = []
    a_times: list[float] = []
    for _ in range(args.runs):
        t, proc = _time(doctor)
        json.loads(proc.stdout)  # a run that printed no report does not count as fast
        d_times.append(t)
        t, proc = _time(anchor)
        if proc.returncode != 0:
            print(
                f"collect_env failed: {proc.stderr.decode(errors='replace')[-300:]}",
                file=sys.stderr,
            )
            return 1
        a_times.append(t)
    d, a = statistics.median(d_times), statistics.median(a_times)
    print(f"runs: {args.runs}")
    print(f"xl doctor --json            median {d * 1000:7.1f} ms  (min {min(d_times) * 1000:.1f})")
    print(f"torch.utils.collect_env     median {a * 1000:7.1f} ms  (min {min(a_times) * 1000:.1f})")
    print(f"ratio doctor/collect_env    {d / a:.3f}  (goal <= 0.2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
