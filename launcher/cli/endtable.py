"""The run's end as plain text: each rank's row with the run's figures (samples / time in
steps, its last good memory reading, its last evaluation at its own epoch, its last line of
output), the root cause and where the time went. What the plain view prints as a run ends, and
what `xl runs RUN` prints of any run. No Rich: drawn as Rich's ASCII box looks, since importing
and setting up Rich cost a run's end ~50 ms, a few percent of a short job's wall time."""

from __future__ import annotations

from xl.launcher.cli.consolerun import ConsoleRun
from xl.launcher.rundir.outcome import Failure
from xl.launcher.view import timing
from xl.launcher.view.runview import RankView
from xl.textsafe import visible
from xl.units import mib


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def cause_lines(failure: Failure | None) -> list[str]:
    """``cause: SUMMARY`` and ``fix: FIX``, a line each, said after the root cause (no fix line
    when none is known)."""
    cause = failure.cause if failure is not None else None
    if cause is None:
        return []
    lines = [f"cause: {visible(cause.summary)}"]
    return lines + ([f"fix: {visible(cause.fix)}"] if cause.fix else [])


def traceback_title(failure: Failure) -> str:
    """What the root cause's text is: a Python traceback, or (an argparse refusal, a signal, an
    exit without an exception) the rank's last lines of output."""
    python = bool(failure.error) or "Traceback (most recent call last)" in (failure.traceback or "")
    return f"{'traceback' if python else 'last lines'} of rank {failure.rank}"


def summary(run: ConsoleRun) -> str:
    text = f"run {run.title} {run.status} after {run.elapsed():.1f}s"
    if run.failure:
        text += "".join(
            [
                f": {visible(run.failure.message)}",
                *(f"\n{line}" for line in cause_lines(run.failure)),
            ]
        )
    spent = timing.describe(run.record.time) if run.final and run.record else None
    phases = timing.describe_phases(run.record.time) if spent and run.record else None
    # where the time went (docs/compare.md), and the steps' time by phase where they were timed
    return "\n".join(x for x in (text, spent, phases) if x)


def title(run: ConsoleRun) -> str:
    name = (run.record.name if run.record else None) or ""
    return f"{name}  {run.title}  {run.status}  {run.elapsed():.0f}s"


def render_text(run: ConsoleRun, width: int = 120) -> str:
    """The rank table as plain ASCII text (no colour, no control codes): for pipes and log files.

    Drawn here rather than by Rich (the same look as Rich's ASCII box): importing and setting up
    Rich cost a run's end ~50 ms, a few percent of a short job's wall time."""
    evals = has_eval(run)
    headers = column_headers(evals)
    right = _RIGHT | ({len(headers) - 2} if evals else set())
    # The run's figures (samples / time in steps), and in the last cell only what the rank
    # printed: xl's own words were events, printed as they came.
    rows = [
        cells(run.ranks[rank], run.last_line.get(rank, ""), evals, ended=run.final)
        for rank in sorted(run.ranks)
    ]
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers[:-1])]
    last = max(len(headers[-1]) // 2, width - 1 - 3 * len(headers) - sum(widths))
    widths.append(last)

    def line(cells: list[str]) -> str:
        out = []
        for i, (cell, w) in enumerate(zip(cells, widths, strict=True)):
            if len(cell) > w:
                cell = cell[: w - 1] + "\u2026"
            out.append(cell.rjust(w) if i in right else cell.ljust(w))
        return "| " + " | ".join(out) + " |"

    top = title(run)
    border = "+" + "-" * (len(line(list(headers))) - 2) + "+"
    text = [top.ljust(len(border)), border, line(list(headers))]
    text.append("|" + "+".join("-" * (w + 2) for w in widths) + "|")
    text += [line(row) for row in rows]
    text.append(border)
    return "\n".join(text) + "\n"


_HEADERS = (
    "rank",
    "state",
    "pid",
    "GPU",
    "step",
    "samples/s",
    "loss",
    "util",
    "mem",
    "last log line",
)
_RIGHT = {0, 2, 3, 4, 5, 6, 7, 8}  # right-justified columns (numbers)


def has_eval(run: ConsoleRun) -> bool:
    """Whether any rank has evaluated: only then do the tables have an eval column."""
    return any(r.eval_loss is not None for r in run.ranks.values())


def column_headers(evals: bool) -> tuple[str, ...]:
    return (*_HEADERS[:-1], "eval", _HEADERS[-1]) if evals else _HEADERS


def _eval(r: RankView) -> str:
    """The latest eval loss and, where known, the epoch it was taken at: "5.381 ep 2"."""
    if r.eval_loss is None:
        return ""
    epoch = r.eval_epoch
    return format(r.eval_loss, ".4g") + ("" if epoch is None else f" ep {epoch:.3g}")


def cells(r: RankView, last_line: str, evals: bool = False, *, ended: bool = False) -> list[str]:
    """One rank's row of the table, as text (``ended``: the run's figures, not the last
    line's)."""
    shown = r.state
    if r.exit_code not in (None, 0):
        shown = f"{shown} ({r.exit_code})"
    step = (
        ""
        if r.step is None
        else f"{r.step:.0f}" + (f"/{r.total_steps:.0f}" if r.total_steps else "")
    )
    # GPU figures where there is a GPU: what the rank's own processes hold on it, never the
    # whole GPU's use (every process's, shared by ranks on one GPU: the GPU table's figure), so
    # a rank NVML lists no process of shows none. The rank's footprint (PSS with its workers)
    # and its CPU for CPU ranks.
    mem, util = "", "" if r.gpu_util is None else f"{r.gpu_util:.0f}%"
    if r.gpu is not None:
        if r.gpu_proc_mem_mib is not None:
            mem = mib(r.gpu_proc_mem_mib)
            if r.gpu_mem_total_mib:
                mem += f"/{mib(r.gpu_mem_total_mib)}"
    elif r.mem_mib is not None:
        mem = mib(r.mem_mib)
    elif r.rss_mib is not None:
        mem = f"{mib(r.rss_mib)} rss"
    if r.gpu is None and r.cpu_pct is not None:
        util = f"{r.cpu_pct:.0f}% cpu"
    pid = "" if r.pid is None else str(r.pid)
    gpu = "cpu" if r.gpu is None else str(r.gpu)
    cells = [
        str(r.rank),
        shown,
        pid,
        gpu,
        step,
        _fmt(r.run_samples_per_s if ended else r.samples_per_s, ".1f"),
        _fmt(r.loss, ".4g"),
        util,
        mem,
    ]
    return [*cells, _eval(r), last_line] if evals else [*cells, last_line]


def end_text(run: ConsoleRun, width: int = 120) -> str:
    """The run's end: the rank table (past 64 ranks, the summary of nodes and outliers), where
    its steps' time went, the root cause's traceback, and the outcome line."""
    from xl.launcher.cli import console_summary, splittable  # noqa: PLC0415 - the run's end only

    if console_summary.summarised(run.ranks):
        text = console_summary.render_summary(run.ranks, title(run))
    else:
        text = render_text(run, width=width) + splittable.render(run.ranks)
    failure = run.failure
    if failure is not None and failure.traceback:
        text += f"xl: {traceback_title(failure)}:\n{visible(str(failure.traceback), lines=True)}\n"
    return text + f"xl: {summary(run)}\n"
