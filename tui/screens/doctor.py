"""Doctor: runs the checks in a worker, lists them worst first, shows the chosen one's fix."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Footer, Header, LoadingIndicator, Static

from xl.tui.screens.base import XLScreen

if TYPE_CHECKING:
    from xl.doctor.report import Report

ORDER = ("fail", "error", "warn", "ok", "skip")  # worst first: what needs attention on top
STYLE = {
    "fail": "bold red",
    "error": "bold magenta",
    "warn": "yellow",
    "ok": "green",
    "skip": "dim",
}
LABEL = {"fail": "FAIL", "error": "ERROR", "warn": "WARN", "ok": "ok", "skip": "skip"}


class DoctorScreen(XLScreen):
    AUTO_FOCUS = "#doctor-table"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("r", "rerun", "Re-run")]

    class Done(Message):
        def __init__(self, report: Report | None, error: str | None) -> None:
            super().__init__()
            self.report = report
            self.error = error

    def __init__(self) -> None:
        super().__init__(id="doctor")
        self.checks: dict[str, Any] = {}

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Static("", id="doctor-summary")
        yield LoadingIndicator(id="doctor-loading")
        with Vertical(id="doctor-body"):
            yield DataTable(id="doctor-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="doctor-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "xl — Doctor"
        table = self.query_one(DataTable)
        table.add_column("Status", key="status")
        table.add_column("Check", key="title")
        table.add_column("Detail", key="detail")
        self.action_rerun()

    def action_rerun(self) -> None:
        self.query_one("#doctor-loading").display = True
        self.query_one("#doctor-summary", Static).update("Running the checks…")
        self._run()

    @work(thread=True, exclusive=True, group="doctor")
    def _run(self) -> None:
        try:
            report = self.backend.doctor_report()
            self.post_message(self.Done(report, None))
        except Exception as exc:  # run_doctor never raises; this is a missing module or a bug
            self.post_message(
                self.Done(None, f"the doctor could not run: {type(exc).__name__}: {exc}")
            )

    def on_doctor_screen_done(self, message: Done) -> None:
        self.query_one("#doctor-loading").display = False
        summary = self.query_one("#doctor-summary", Static)
        if message.report is None:
            summary.update(Text(message.error or "no report", style="bold red"))
            return
        checks = sorted(
            message.report.checks,
            key=lambda c: (ORDER.index(c.status) if c.status in ORDER else 0),
        )
        counts = {s: sum(1 for c in checks if c.status == s) for s in ORDER}
        line = Text("Overall: ")
        status = message.report.status or "ok"
        line.append(LABEL.get(status, status), style=STYLE.get(status, ""))
        line.append("   " + "  ".join(f"{n} {s}" for s, n in counts.items() if n))
        summary.update(line)
        table = self.query_one(DataTable)
        cursor = table.cursor_row
        # A re-run can change which checks exist; the list is short (16 rows), so rebuilding the
        # rows here is cheaper than reconciling order changes cell by cell.
        table.clear()
        self.checks = {}
        for check in checks:
            self.checks[check.id] = check
            table.add_row(
                Text(LABEL.get(check.status, check.status), style=STYLE.get(check.status, "")),
                check.title,
                check.detail,
                key=check.id,
            )
        if checks:
            table.move_cursor(row=min(cursor, len(checks) - 1))
            self._show(checks[min(cursor, len(checks) - 1)].id)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self._show(event.row_key.value)

    def _show(self, check_id: str) -> None:
        check = self.checks.get(check_id)
        if check is None:
            return
        text = Text()
        text.append(f"{check.title}  ", style="bold")
        text.append(
            f"[{check.id}] {LABEL.get(check.status, check.status)}\n",
            style=STYLE.get(check.status, ""),
        )
        text.append(check.detail + "\n")
        if check.fix:
            text.append("\nFix: ", style="bold")
            text.append(check.fix)
        self.query_one("#doctor-detail", Static).update(text)
