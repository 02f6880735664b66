"""The plain view's end table of where each rank's steps' time went (per step: the time and its
share in each phase), drawn under the rank table when the ranks timed their steps.

    where the step time went (per step)
    rank  steps  step    data        compute    comm        other
       0     70  312 ms  5.0 ms 2%   20 ms 6%   260 ms 83%  27 ms 9%
       1     70  312 ms  250 ms 80%  21 ms 7%   4.1 ms 1%   37 ms 12%

From each RankView's ``phase_totals`` (the lines the view read; docs/contracts.md,
"metrics.jsonl"). Plain text, no Rich: the end of a run is drawn without it.
"""

from __future__ import annotations

from collections.abc import Mapping

from xl.figures import PHASES
from xl.launcher.view import timing
from xl.launcher.view.runview import RankView

HEADERS = ("rank", "steps", "step", *PHASES)


def rank_rows(ranks: Mapping[int, RankView]) -> list[list[str]]:
    """One row per rank that timed steps, in rank order."""
    rows = []
    for rank in sorted(ranks):
        rv = ranks[rank]
        split = timing.per_step({"steps": rv.steps_timed, **rv.phase_totals})
        cells = timing.split_cells(split)
        if split is not None and cells is not None:
            rows.append([str(rank), str(split["steps"]), *cells])
    return rows


def render(ranks: Mapping[int, RankView]) -> str:
    """The table as text ending in a newline, or "" when no rank timed a step."""
    rows = rank_rows(ranks)
    if not rows:
        return ""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]

    def line(cells: list[str] | tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(w) if i < 2 else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return (
        "\n".join(["where the step time went (per step)", line(HEADERS), *(line(r) for r in rows)])
        + "\n"
    )
