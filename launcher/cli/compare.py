"""``xl compare RUN_A RUN_B [--json]``: what changed between two runs, and what it did.

The spec (script, args, environment with secrets masked, ranks, nodes, GPUs and their models),
the versions (torch, CUDA, driver, xl, the script's git commit), the median step time after
warm-up and samples/s with their ratio, the loss at common steps, and both time accountings
(xl.launcher.view.comparison; docs/compare.md). Text: a side-by-side table naming both runs.
Exit 0; 2 for an unknown or damaged run, or the same run twice.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from xl.errors import ArgumentParser
from xl.launcher.rundir.store import resolve_run
from xl.launcher.view import comparison
from xl.textsafe import visible


def render(c: comparison.Comparison) -> str:
    """The text table: a label column, then run A's column and run B's."""
    # Names, arguments and versions came from people and ranks: control characters drawn.
    rows = [
        ("", "A", "B"),
        *((visible(label), visible(a), visible(b)) for label, a, b in comparison.rows(c)),
    ]
    wl = max(len(r[0]) for r in rows)
    wa = max(len(r[1]) for r in rows)
    return "\n".join(f"{label.ljust(wl)}  {a.ljust(wa)}  {b}".rstrip() for label, a, b in rows)


def main(argv: Sequence[str]) -> int:
    p = ArgumentParser(
        prog="xl compare",
        description="Compare two runs: what changed, speed, loss, where the time went.",
    )
    p.add_argument("run_a", metavar="RUN_A", help="run id, unique prefix, or 'last'")
    p.add_argument("run_b", metavar="RUN_B", help="run id, unique prefix, or 'last'")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    ns = p.parse_args(list(argv))
    c = comparison.compare(resolve_run(ns.run_a), resolve_run(ns.run_b))
    print(json.dumps(c.doc, indent=2) if ns.json else render(c))
    return 0
