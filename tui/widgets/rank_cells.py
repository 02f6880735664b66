"""What a rank's row in the Monitor's table shows: its values, its cells, and their segments.

Pure functions of a rank's data and the row's styles, so the widget (rank_table.py) only decides
which rows to draw and when; a value that recurs (a state, a meter, "0s ago") is drawn once and
then comes from the widget's cache.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from xl.tui import fmt
from xl.tui.fmt import Cell
from xl.tui.widgets.text_lines import text_segments

if TYPE_CHECKING:
    from xl.launcher.view.runview import RankView

PADDING = 1  # blank columns either side of each cell


# A step's phases as a bar, in this order: each phase is its letter on its colour, so the bar
# reads with colour and without (NO_COLOR): "dddccn" is half data, a third compute, the rest comm.
PHASES = (
    ("data_s", "d", "data", "black on yellow"),
    ("compute_s", "c", "compute", "black on green"),
    ("comm_s", "n", "comm", "black on magenta"),
    ("other_s", "o", "other", "black on bright_black"),
)
TIME_WIDTH = 5  # "350ms", "1.25s", "12.5s", " 125s": the step time before its bar


def step_time(seconds: float | None) -> str:
    """A step's wall time in at most five columns."""
    if seconds is None or not 0 <= seconds < 1e5:
        return "-"
    if seconds < 0.9995:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds:.3g}s" if seconds < 99.95 else f"{seconds:.0f}s"


def bar_counts(parts: tuple[float, ...], cells: int) -> list[int]:
    """How many of ``cells`` each phase gets: its share, rounded so the counts add up (largest
    remainders first); a phase with no time gets none."""
    total = sum(max(0.0, p) for p in parts)
    if total <= 0 or cells <= 0:
        return [0] * len(parts)
    exact = [max(0.0, p) / total * cells for p in parts]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(parts)), key=lambda i: exact[i] - counts[i], reverse=True)[
        : cells - sum(counts)
    ]:
        counts[i] += 1
    return counts


def split_cell(step_s: float | None, parts: tuple[float, ...] | None, cells: int) -> Text:
    """The step time and, when the step's split is known, its bar of ``cells`` cells."""
    shown = step_time(step_s)
    if shown == "-":
        return Text("-", style="dim")
    text = Text(shown.rjust(TIME_WIDTH))
    if parts is None or cells <= 0:  # not split, or no room for the bar: the time alone
        return text
    text.append(" ")
    for (_, letter, _, style), n in zip(PHASES, bar_counts(parts, cells), strict=True):
        if n:
            text.append(letter * n, style=style)
    return text


# A rank's row as plain values (rank_values), in format_cells' order: rank, state, step, total
# steps, loss, samples/s, GPU util, its memory on its GPU, the GPU's total, RSS, GPU, node, last
# seen, eval loss, eval epoch, step time, the step's split, its footprint.
_N = float | None
RankValues = tuple[
    int, str, _N, _N, _N, _N, _N, _N, _N, _N, int | str | None, str | None, str, _N, _N, _N,
    tuple[float, ...] | None, _N,
]


def rank_values(rv: RankView, now: float, node: str | None) -> RankValues:
    """What a rank's row shows, as plain values: cheap to compare with what the row showed last
    (a row is drawn again only when they differ)."""
    split = rv.split
    return (
        rv.rank,
        rv.state,
        rv.step,
        rv.total_steps,
        rv.loss,
        rv.row_samples_per_s,  # the run's, once the rank ended
        rv.gpu_util,
        # The rank's own memory on its GPU: the whole GPU's use is every process's, and the
        # GPU table shows it.
        rv.gpu_proc_mem_mib,
        rv.gpu_mem_total_mib,
        rv.rss_mib,
        rv.gpu,
        node,
        fmt.ago(rv.last_seen, now),
        rv.eval_loss,
        rv.eval_epoch,  # the eval's own epoch, not where training is now
        rv.step_s,
        None if split is None else tuple(split[key] for key, _, _, _ in PHASES),
        rv.mem_mib,
    )


def format_cells(values: RankValues, bar: int = 6) -> dict[str, Cell]:
    """The row's cells (str or rich Text) from rank_values; ``bar``: the cells of the step's bar."""
    (
        rank,
        state,
        step,
        total_steps,
        loss,
        sps,
        util,
        own,
        total,
        rss,
        gpu,
        node,
        seen,
        evl,
        eval_epoch,
        step_s,
        split,
        footprint,
    ) = values
    mem: Cell
    if gpu is not None:  # what the rank's processes hold on its GPU, against the GPU's size
        mem = "-" if own is None else fmt.meter(own / total if total else None, 4, fmt.mib(own))
    elif footprint is not None:
        mem = fmt.mib(footprint)  # the rank's footprint (PSS, with its children): its memory
    elif rss is not None:
        mem = f"{fmt.mib(rss)} rss"
    else:
        mem = "-"
    return {
        "time": split_cell(step_s, split, bar),
        "rank": str(rank),
        "node": node or "-",
        "gpu": "cpu" if gpu is None else str(gpu),
        "util": fmt.meter(
            None if util is None else util / 100, 4, "-" if util is None else f"{util:3.0f}%"
        ),
        "mem": mem,
        "step": "-"
        if step is None
        else (f"{step:.0f}/{total_steps:.0f}" if total_steps else f"{step:.0f}"),
        "sps": fmt.rate(sps),
        "loss": fmt.number(loss),
        "seen": seen,
        "state": fmt.coloured(state),
        "eval": eval_cell(evl, eval_epoch),
    }


def eval_cell(eval_loss: float | None, epoch: float | None) -> str:
    """The latest eval loss and, where the framework logs one, its epoch: "5.381 ep 2"."""
    if eval_loss is None:
        return "-"
    return fmt.number(eval_loss) + ("" if epoch is None else f" ep {epoch:.3g}")


def cell_segments(
    value: Cell, width: int, under: Style, over: Style, console: Console
) -> list[Segment]:
    """A cell as drawn in a row: padding, then its text cut or padded to ``width``, in the row's
    style under the cell's own and the cursor's colour over both."""
    pad = " " * PADDING
    if isinstance(value, Text):
        text = value.copy()
        text.truncate(width, overflow="ellipsis", pad=True)
        segments = [Segment(pad, under)]
        for seg in text_segments(text, console):
            if seg.text:
                segments.append(
                    Segment(seg.text, under + seg.style + over if seg.style else under + over)
                )
        segments.append(Segment(pad, under))
        return segments
    plain = str(value)  # most cells: plain text, one segment
    if cell_len(plain) > width:
        plain = set_cell_size(plain, width - 1) + "…"
    if over:
        return [
            Segment(pad, under),
            Segment(set_cell_size(plain, width), under + over),
            Segment(pad, under),
        ]
    return [Segment(f"{pad}{set_cell_size(plain, width)}{pad}", under)]


def join_row(cells: Iterable[list[Segment]], under: Style, fill: int) -> list[Segment]:
    """A row's segments from its cells', plus ``fill`` blank columns. Neighbouring text in the
    row's own style becomes one segment (a third as many for the compositor and the terminal
    writer, on every line of every refresh)."""
    segments: list[Segment] = []
    run: list[str] = []
    for cell in cells:
        for seg in cell:
            if seg.style is under:
                run.append(seg.text)
                continue
            if run:
                segments.append(Segment("".join(run), under))
                run = []
            segments.append(seg)
    if fill > 0:
        run.append(" " * fill)
    if run:
        segments.append(Segment("".join(run), under))
    return segments
