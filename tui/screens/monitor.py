"""Monitor: one run, live or finished, read from its run directory through the RunReader."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Footer, Header, Static
from textual.worker import get_current_worker

from xl.textsafe import visible
from xl.tui import fmt
from xl.tui.run_outcome import FINISHED
from xl.tui.screens.base import XLScreen
from xl.tui.screens.confirm import ConfirmScreen
from xl.tui.screens.monitor_header import header_text
from xl.tui.screens.monitor_nodes import NodesView
from xl.tui.screens.monitor_remote_log import RemoteLog
from xl.tui.screens.stacks import StacksScreen
from xl.tui.widgets.charts import RunCharts
from xl.tui.widgets.rank_log import LogLines, LogPane
from xl.tui.widgets.rank_table import RankTable
from xl.tui.widgets.text_lines import TextLines
from xl.tui.widgets.verdict import VerdictBanner, straggler_text

if TYPE_CHECKING:
    from xl.launcher.rundir.outcome import Failure
    from xl.launcher.view.reader import RunReader
    from xl.launcher.view.runview import Progress, RunView

RANK_KEYS = Binding.Group("Rank", compact=True)
CHARTS_MIN_HEIGHT = 32
PROGRESS_WIDTH = 32  # cells of the progress bar
LOG_TAIL = 400  # lines shown when switching to a rank; older output stays in the run dir


def failure_text(failure: Failure | None, keep: int) -> Text | None:
    """The failure banner: the rank that failed first and the last ``keep`` lines of its
    traceback (the run's root cause, RunView.failure); None while none failed."""
    if failure is None:
        return None
    text = Text()
    text.append(f"✗ Run failed: rank {failure.rank} failed first", style="bold")
    if failure.exit_code is not None:
        text.append(f" (exit code {failure.exit_code})")
    text.append("\n")
    if failure.cause is not None:  # why, and the fix, before the traceback's end
        text.append(f"cause: {visible(failure.cause.summary)}\n", style="bold")
        if failure.cause.fix:
            text.append(f"fix: {visible(failure.cause.fix)}\n")
    trace = failure.traceback or failure.message or ""
    lines = str(trace).strip().splitlines()
    if len(lines) > keep:
        lines = ["…", *lines[-keep:]]  # the end of a traceback says what happened
    text.append(visible("\n".join(lines), lines=True))  # a rank's text: control characters drawn
    return text


def progress_text(prog: Progress) -> Text:
    """One line: a bar (readable without colour, as the table's meters), steps and ETA."""
    text = fmt.meter(prog.fraction, PROGRESS_WIDTH, f"{prog.fraction:4.0%}", style="cyan")
    text.append(f"  step {prog.step}/{prog.total}")
    if prog.eta_s is not None:
        text.append(f"  ETA {fmt.duration(prog.eta_s)}")
    return text


def _log_lines(reader: RunReader, rank: int, reset: bool, tailed: set[int]) -> list[str]:
    """The lines of ``rank``'s log the Monitor has not shown yet; after a switch (``reset``),
    its last LOG_TAIL lines, carrying how many came before them (LogLines)."""
    if not reset:
        return list(reader.new_log_lines(rank))
    # A rank shown before starts over at its end: what it wrote meanwhile is skipped, and counted.
    fresh = reader.new_log_lines(rank, restart=rank in tailed)
    tailed.add(rank)
    shown = fresh[-LOG_TAIL:]
    skipped = reader.log_skipped(rank) + len(fresh) - len(shown)
    return LogLines(shown, skipped=skipped, path=reader.log_path(rank))


class CloseWhenDone:
    """The Monitor that `xl launch` opened on its run closes the app a moment after the run
    ended, as torchrun returns (the outcome stays on the terminal: XLApp.leave). A key pressed
    meanwhile keeps it open; so does the person being on another screen when it ends."""

    def __init__(self, monitor: MonitorScreen) -> None:
        self.monitor = monitor
        self.timer: Timer | None = None

    def arm(self) -> None:
        m = self.monitor
        delay = m.xl.closes_when_done(m.run_dir)
        if delay is None or not m.is_current:
            return
        self.timer = m.set_timer(delay, self._close)
        m.notify(
            f"Run {m.run_dir.name} {m.status}: closing in {delay:g} s; any key keeps the monitor "
            f"open",
            timeout=delay + 1,
        )

    def keep_open(self) -> None:
        if self.timer is not None:
            self.timer.stop()
            self.timer = None
            self.monitor.notify("The monitor stays open: q leaves it")

    def _close(self) -> None:
        m = self.monitor
        if self.timer is not None and m.is_current:
            m.xl.detach(m.run_dir, m.status)


class StopRun:
    """`s`: once the person confirms, the run is stopped on a worker thread (the backend signals
    every rank, and waits out the grace period before SIGKILL). Asked once: a second `s` while
    it stops does nothing."""

    def __init__(self, monitor: MonitorScreen) -> None:
        self.monitor = monitor
        self.stopping = False

    def ask(self) -> None:
        m = self.monitor
        if m.status in FINISHED or self.stopping:
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.stopping = True
                m.notify("Stopping the run: ranks get SIGTERM, then SIGKILL after a grace period")
                m.run_worker(self._stop, thread=True, exclusive=True, group="monitor-stop")

        m.app.push_screen(
            ConfirmScreen(f"Stop run {m.run_dir.name}? Every rank is terminated.", yes="Stop"),
            answered,
        )

    def _stop(self) -> None:
        m = self.monitor
        try:
            m.backend.stop(m.run_dir)
        except Exception as exc:  # show why it could not stop rather than dying
            m.app.call_from_thread(m.notify, f"Could not stop the run: {exc}", severity="error")


class MonitorScreen(XLScreen):
    AUTO_FOCUS = "#rank-table"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "stop", "Stop run"),
        Binding("d", "detach", "Detach"),
        Binding("c", "charts", "Charts"),
        Binding(
            "k", "stacks", "Stacks", show=False
        ),  # the hang banner and Help name it; the footer is full at 80 columns
        Binding("f", "follow", "Follow log", show=False),  # the log's title names it
        # One footer entry for both ("[] Rank"): with `? Help` and `q Quit` it fits 80 columns.
        Binding("left_square_bracket", "rank(-1)", "Prev rank", group=RANK_KEYS),
        Binding("right_square_bracket", "rank(1)", "Next rank", group=RANK_KEYS),
        Binding("escape", "back", "Back"),
    ]

    class Polled(Message):
        """One poll's result; floods collapse to the newest one."""

        def __init__(
            self,
            view: RunView | None,
            log_rank: int | None,
            log_lines: list[str] | None,
            error: str | None,
        ) -> None:
            super().__init__()
            self.view = view
            self.log_rank = log_rank
            self.log_lines = log_lines
            self.error = error

    class NoticeDone(Message):
        """The run's notice is done with (every node joined, or the run ended): the app forgets it,
        so no later Monitor of the run shows it again."""

        def __init__(self, run_dir: Path) -> None:
            super().__init__()
            self.run_dir = run_dir

    def __init__(
        self, run_dir: Path, *, standalone: bool, interval: float = 1.0, notice: str | None = None
    ) -> None:
        super().__init__(classes="monitor")
        # What the person must still do for the run, e.g. node 0's command for the other nodes
        # (it carries the run's token, so it lives in memory only); shown until every node joined.
        self._notice = notice
        self.run_dir = Path(run_dir)
        self.standalone = standalone
        self.interval = interval
        self.reader: RunReader | None = None
        self.view: RunView | None = None
        self.status: str | None = None
        self._log_rank: int | None = None
        self._log_needs_reset = True
        self._log_feed = RemoteLog(self.run_dir, LOG_TAIL, _log_lines)  # a rank's lines, any node
        self.polls = 0
        # One thread polls the reader for the screen's life (_poller): the reader is its alone,
        # and what it posts is a snapshot (RunView) that the screen draws while the next poll
        # goes on. _wake cuts the wait short: a rank switch polls at once.
        self._wake = threading.Event()
        self._stopped = False
        self._charts_chosen = False  # `c` pressed: the charts stay as the person left them
        self._close_when_done = CloseWhenDone(self)
        self._stop_run = StopRun(self)

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield TextLines("Opening the run…", id="run-header")
        yield Static("", id="failure-banner")
        yield VerdictBanner(id="verdict-banner")
        yield TextLines("", id="straggler-banner")
        # Text, not markup: a command with [brackets] must show (and copy) as it is.
        yield Static(Text(self._notice or ""), id="notice-banner")
        yield TextLines("", id="progress")
        # A row per rank; past BIG_RUN ranks, the nodes and outliers lead.
        yield NodesView(lambda: self.clock(), id="ranks-view")
        with Horizontal(id="monitor-lower"):
            yield RunCharts(id="charts")
            yield LogPane(id="log-pane")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"xl — {self.run_dir.name}"
        self.query_one("#failure-banner").display = False
        self.query_one("#notice-banner").display = self._notice is not None
        self.query_one("#progress").display = False
        self.query_one("#straggler-banner").display = False
        # Charts need room; on a small terminal (80x24) they start hidden and `c` shows them.
        self.query_one("#charts").display = self.app.size.height >= CHARTS_MIN_HEIGHT
        self._poller()

    def on_resize(self, event: events.Resize) -> None:
        # Opened small then the terminal grew (or shrank): the charts follow, until `c` decides.
        if (
            not self._charts_chosen
            and (event.size.height >= CHARTS_MIN_HEIGHT) != self.query_one("#charts").display
        ):
            self.action_charts(chosen=False)

    def on_unmount(self) -> None:
        self._stopped = True
        self._wake.set()

    @property
    def clock(self) -> fmt.Clock:
        return self.xl.clock

    @property
    def nodes_view(self) -> NodesView:
        return self.query_one(NodesView)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if (action in ("stop", "detach", "stacks") and self.status in FINISHED) or (
            action == "stop" and self.backend.read_only
        ):
            # Off the footer: nothing left to stop, detach from or ask; a viewer stops nothing.
            return False
        return not (action == "back" and self.standalone and self.nodes_view.drilled is None)

    # -- polling -----------------------------------------------------------------------------

    def _request_poll(self) -> None:
        """Poll now rather than at the end of the interval; a poll running now is followed by
        another at once, never joined by a second thread."""
        self._wake.set()

    @work(thread=True, exclusive=True, group="monitor-poll")
    def _poller(self) -> None:
        # One thread for the screen's life, as on the GPUs screen: a worker and a timer per poll
        # cost a thread-pool job, a timer task and a few Worker.StateChanged messages each second.
        worker = get_current_worker()

        def ended() -> bool:
            return self._stopped or worker.is_cancelled

        while not ended():
            if not self.post_message(self._poll_once()):
                return
            self._wake.wait(self._delay)
            self._wake.clear()

    @property
    def _delay(self) -> float:
        # A finished run changes no more: poll rarely (the run could be re-read, never resumed).
        return self.interval if self.status not in FINISHED else self.interval * 5

    def _poll_once(self) -> Polled:
        try:
            if self.reader is None:
                self.reader = self.backend.reader(self.run_dir)
            reader = self.reader
            view = reader.poll()
            rank = self._log_rank
            lines = (
                None
                if rank is None
                else self._log_feed.lines(self.backend, reader, view, rank, self._log_needs_reset)
            )
            self._log_needs_reset = self._log_needs_reset and rank is None
            return self.Polled(view, rank, lines, None)
        except Exception as exc:  # a run dir that vanished or a reader bug: say so, keep the UI
            return self.Polled(None, None, None, f"{type(exc).__name__}: {exc}")

    def on_monitor_screen_polled(self, message: Polled) -> None:
        self.polls += 1
        if message.view is not None:
            self.view = message.view
            self._render_view(message.view)
            if self._log_rank is None:
                table = self.query_one(RankTable)
                if table.current_rank is not None:
                    self._choose_rank(table.current_rank)
        elif message.error:
            self._set_text(
                "#run-header",
                Text(f"Cannot read {self.run_dir}: {message.error}", style="bold red"),
            )
        if message.log_lines is not None and message.log_rank is not None:
            self.query_one(LogPane).take(message.log_rank, message.log_lines)

    def _render_view(self, view: RunView) -> None:
        now = self.clock()
        if view.status != self.status:
            self.status = view.status
            self.refresh_bindings()  # the footer drops "Stop run" and "Detach" once the run is over
            if view.final:
                self._close_when_done.arm()
        if self._notice is not None and (view.final or view.all_nodes_joined):
            self._notice = None
            self.post_message(self.NoticeDone(self.run_dir))
            self.query_one("#notice-banner").display = False
        width = self.query_one("#run-header").size.width or self.app.size.width
        self._set_text("#run-header", header_text(view, self.run_dir.name, now, width))
        self._render_banners(view)
        self._render_progress(view.progress())
        self.nodes_view.show_view(view, now)  # every rank's row, or past BIG_RUN the nodes'
        if self.query_one("#charts").display:
            self._render_charts(view, now)

    def _render_charts(self, view: RunView, now: float) -> None:
        ranks = view.ranks
        t0 = view.record.started_at or min(
            (rv.loss_history[0][0] for rv in ranks.values() if rv.loss_history), default=now
        )
        charts, rank = self.query_one(RunCharts), self._log_rank
        if self.nodes_view.update_spreads(view):  # past BIG_RUN ranks: the spreads
            followed = ranks.get(rank) if rank is not None else None
            charts.show_spreads(self.nodes_view.spreads, followed, t0=t0, highlight=rank)
        else:
            charts.show_ranks(ranks, t0=t0, highlight=rank)

    def _render_banners(self, view: RunView) -> None:
        banner = self.query_one("#failure-banner", Static)
        text = failure_text(
            view.failure, keep=6 if self.app.size.height >= CHARTS_MIN_HEIGHT else 3
        )
        banner.display = text is not None
        if text is not None:
            banner.update(text)
        self.query_one(VerdictBanner).show(view.hang)
        slow = straggler_text(view.ranks.values())
        self.query_one("#straggler-banner").display = slow is not None
        if slow is not None:
            self._set_text("#straggler-banner", slow)

    def _render_progress(self, prog: Progress | None) -> None:
        """A line of text, not Textual's ProgressBar: that one repaints itself on a timer of its
        own every second, between the Monitor's refreshes, which cost as much as the line is
        worth."""
        self.query_one("#progress").display = prog is not None
        if prog is not None:
            self._set_text("#progress", progress_text(prog))

    def _set_text(self, selector: str, text: Text) -> None:
        self.query_one(selector, TextLines).update(text)

    # -- ranks and log -----------------------------------------------------------------------

    def on_nodes_view_rank_chosen(self, message: NodesView.RankChosen) -> None:
        self._choose_rank(message.rank)

    def on_nodes_view_drilled(self, message: NodesView.Drilled) -> None:
        self.refresh_bindings()  # `escape` goes back to the nodes, or leaves the Monitor

    def _choose_rank(self, rank: int) -> None:
        if rank == self._log_rank:
            return
        self._log_rank = rank
        self._log_needs_reset = True
        self.query_one(LogPane).choose(rank)
        if self.view is not None:
            self._request_poll()

    def action_follow(self) -> None:
        self.query_one(LogPane).follow_end()

    def action_rank(self, delta: int) -> None:
        table = self.query_one(RankTable)
        if table.row_count:
            table.move_cursor(row=(table.cursor_row + delta) % table.row_count)

    def action_charts(self, chosen: bool = True) -> None:
        self._charts_chosen = self._charts_chosen or chosen
        charts = self.query_one("#charts")
        charts.display = not charts.display
        if charts.display and self.view is not None:
            # The last poll's snapshot draws them at once: nothing in it changes meanwhile.
            self._render_charts(self.view, self.clock())

    def action_stacks(self) -> None:
        rank = self.query_one(RankTable).current_rank
        if rank is not None and self.status not in FINISHED:
            # Every rank is asked: the verdict shown is the whole run's, whichever rank is chosen.
            self.app.push_screen(StacksScreen(rank, lambda: self.backend.stacks(self.run_dir)))

    def on_key(self, event: events.Key) -> None:
        self._close_when_done.keep_open()

    # -- stop / detach -----------------------------------------------------------------------

    def action_stop(self) -> None:
        self._stop_run.ask()

    def action_detach(self) -> None:
        if self.standalone or self.xl.closes_on_detach(self.run_dir):
            self.xl.detach(self.run_dir, self.status)
            return
        # A run opened inside the app: it keeps running and the app goes back, as escape does.
        self.action_back()

    def action_back(self) -> None:
        if self.nodes_view.back():  # from a node's ranks to every node
            return
        if not self.standalone:
            self.app.pop_screen()
