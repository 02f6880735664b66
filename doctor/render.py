"""The report for people: Rich when stdout is a colour terminal, plain text otherwise."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xl.doctor.report import Report
from xl.doctor.status import Status

if TYPE_CHECKING:  # Rich is imported only when a terminal report is drawn
    from rich.console import RenderableType


def summary_line(report: Report, strict: bool = False) -> str:
    verdict = report.status.look.verdict
    return f"{report.summary()} — {verdict} (exit {report.exit_code(strict)})"


def render_plain(report: Report, strict: bool = False) -> str:
    """Text with no colour codes: for pipes, logs, NO_COLOR and TERM=dumb."""
    lines: list[str] = []
    for area, checks in report.by_area():
        lines.append(area)
        for c in checks:
            lines.append(f"  {c.status.label:<5}  {c.title}: {c.detail}")
            if c.fix and c.status is not Status.OK:
                lines.append(f"         fix: {c.fix}")
        lines.append("")
    lines.append(summary_line(report, strict))
    return "\n".join(lines) + "\n"


def render_report(report: Report, strict: bool = False) -> RenderableType:
    """A Rich renderable grouped by area: glyph, title, detail, fix; the summary line last."""
    from rich.console import Group  # noqa: PLC0415 - Rich (~45 ms) loads only to draw for a terminal
    from rich.table import Table  # noqa: PLC0415 - Rich (~45 ms) loads only to draw for a terminal
    from rich.text import Text  # noqa: PLC0415 - Rich (~45 ms) loads only to draw for a terminal

    parts: list[RenderableType] = []
    # One title width for every area, so the details line up down the whole report.
    title_w = max((len(c.title) for c in report.checks), default=10)
    for area, checks in report.by_area():
        parts.append(Text(area, style="bold underline"))
        table = Table.grid(padding=(0, 1))
        table.add_column(width=1, no_wrap=True)
        table.add_column(width=title_w, no_wrap=True, style="bold")
        table.add_column(ratio=1)
        for c in checks:
            body = Text(c.detail)
            if c.fix and c.status is not Status.OK:
                body.append("\n→ ", style="cyan")
                body.append(c.fix, style="cyan")
            table.add_row(Text(c.status.glyph, style=c.status.style), c.title, body)
        parts.append(table)
        parts.append(Text(""))
    parts.append(Text(summary_line(report, strict), style=report.status.style))
    return Group(*parts)
