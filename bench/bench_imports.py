"""The CPU each process of a run spends importing, beside the budget it is held to in modules.

    .venv/bin/python bench/bench_imports.py [--repeat N]

tests/test_import_budgets.py holds each process to a count of modules it adds (deterministic,
so a busy machine cannot fail it). What those imports cost in CPU is measured here: for each
process, the CPU time (user + system, inside the interpreter) of its import statement alone,
after what that process already has, in ``--repeat`` fresh interpreters; the best and the median
are printed, with the ratio of the best to the figure the process was last held to
(``Budget.cpu_ms``). Compare two checkouts by running this in each, one after the other.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

# The budgets live with the test that enforces their module counts: one table for both.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from test_import_budgets import PROCESSES


def import_ms(statement: str, after: str) -> float:
    """The CPU ``statement``'s imports take in a fresh interpreter that already ran ``after``,
    measured inside the process (two whole interpreters' CPU differ by more noise than the
    imports cost)."""
    code = (
        f"{after}\nimport time\nstart = time.process_time()\n{statement}\n"
        "print((time.process_time() - start) * 1000)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(f"{'process':34} {'best ms':>8} {'median':>8} {'held to':>8} {'best/held':>9}")
    for name, budget in PROCESSES.items():
        runs = [import_ms(budget.statement, budget.after) for _ in range(args.repeat)]
        best = min(runs)
        print(
            f"{name:34} {best:8.1f} {statistics.median(runs):8.1f} {budget.cpu_ms:8d} "
            f"{best / budget.cpu_ms:9.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
