"""What the app leaves on the terminal as it closes on an ended run, from the run's record.

Everything the Monitor draws while it is open comes from the reader's RunView
(xl.launcher.view.runview), which decides the hang, the failure and each rank's state once.
"""

from __future__ import annotations

from rich.text import Text

from xl.launcher.rundir.runrecord import FINAL, RunRecord
from xl.launcher.view.runview import elapsed, outcome_style
from xl.textsafe import visible

# The record's own set of final statuses, under the name the screens use.
FINISHED = FINAL


def outcome_text(record: RunRecord, run_id: str, status: str, now: float) -> Text:
    """What stays on the terminal once the app closes on an ended run, as the plain view leaves
    it: the root cause's traceback, the outcome line, and the command that shows the failed
    rank's whole output."""
    failure = record.failure if status == "failed" else None
    rank = failure.rank if failure else None
    out = Text()
    if failure and failure.traceback:
        python = bool(failure.error) or "Traceback (most recent call last)" in failure.traceback
        out.append(f"xl: {'traceback' if python else 'last lines'} of rank {rank}:\n", style="bold")
        out.append(
            visible(str(failure.traceback).rstrip("\n"), lines=True) + "\n"
        )  # the rank's text
    took = elapsed(record, now)
    line = f"xl: run {run_id} {status}" + (f" after {took:.1f}s" if took is not None else "")
    why = failure.message if failure else None
    if not why and rank is not None:
        code = failure.exit_code if failure else None
        why = f"rank {rank} failed first" + (f" (exit code {code})" if code is not None else "")
    if why:
        line += f": {why}"
    out.append(visible(line), style=outcome_style(status))
    cause = failure.cause if failure else None
    if cause is not None:  # as the plain view says it: a line each; the rank's words drawn visibly
        out.append(
            visible(
                f"\ncause: {cause.summary}" + (f"\nfix: {cause.fix}" if cause.fix else ""),
                lines=True,
            )
        )
    if status == "failed":
        whose = f" --rank {rank}" if isinstance(rank, int) else ""
        out.append(f"\nxl: every line it printed: xl logs {run_id}{whose}")
    return out
