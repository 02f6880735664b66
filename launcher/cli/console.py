"""Watch a run without the TUI: a Rich live table on a terminal, plain lines otherwise.

The view only reads the run dir (it never owns the run), so `xl launch --no-tui` and
`xl attach` show the same thing, and closing the view leaves the run going.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from xl.launcher.cli import endtable
from xl.launcher.cli.consolerun import ConsoleRun
from xl.launcher.cli.endtable import render_text  # noqa: F401 - the plain table, where its users look
from xl.launcher.rundir.events import EventKind, EventLine
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.tail import RankLogs
from xl.launcher.view.runview import RankView, hang_label, lifecycle_style, outcome_style
from xl.textsafe import bytes_for_terminal, visible

if TYPE_CHECKING:
    from rich.console import Group
    from rich.text import Text

# new lines 20 times a second: prompt for a person and for the run's end, cheap beside the ranks
POLL_S = 0.05
RENDER_S = 0.25


# ---------------------------------------------------------------------------------- plain lines
# A restart is news (the run lost progress) but no failure: yellow, as a straggler is.
_EVENT_STYLE = {EventKind.FAILURE: "red", EventKind.RESTARTED: "yellow"}


def _plain_event(ev: EventLine) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(ev.t or time.time()))
    text = f"{stamp} xl: {ev.said}"
    if ev.kind is EventKind.HANG:
        text = f"{stamp} xl: {hang_label(ev)}: {ev.message} (every rank's stack: {ev.stacks})"
    if ev.kind is EventKind.FAILURE:
        cause = ev.cause
        said = (
            [f"cause: {cause.summary}", *([f"fix: {cause.fix}"] if cause.fix else [])]
            if cause is not None
            else []
        )
        return "\n".join(visible(line) for line in (text, *said))
    return visible(text)


def fold_env_diffs(events: list[EventLine]) -> list[EventLine]:
    """``events`` with each run of consecutive ``env_diff`` events (one per field in which a node
    differs, written together) made one event per node: a person reads one line per odd node,
    with every field that differs there, its value beside the others' and the fixes."""
    if not any(ev.kind is EventKind.ENV_DIFF for ev in events):
        return events
    out: list[EventLine] = []
    run: list[EventLine] = []
    for ev in [*events, None]:
        if ev is not None and ev.kind is EventKind.ENV_DIFF:
            run.append(ev)
            continue
        if run:
            out += _node_events(run)
            run = []
        if ev is not None:
            out.append(ev)
    return out


def _node_events(events: list[EventLine]) -> list[EventLine]:
    """One event per node of these ``env_diff`` events (by node rank), its message the node's
    line; its time the node's first event's."""
    from xl.doctor.api import Diff, node_lines  # noqa: PLC0415 - several nodes only

    def value(v: object) -> str | int | None:
        return v if v is None or (isinstance(v, (str, int)) and not isinstance(v, bool)) else str(v)

    diffs: list[Diff] = []
    first: dict[int, EventLine] = {}
    for ev in events:
        node = ev.node if isinstance(ev.node, int) else -1
        host, name, severity = (ev.text(k) or "" for k in ("host", "field", "severity"))
        said, others = value(ev.data.get("value")), value(ev.data.get("others"))
        diffs.append(Diff(node, host, name, said, others, severity, ev.text("fix")))
        first.setdefault(node, ev)
    lines = node_lines(diffs)  # one per node, by node rank
    return [first[node].reworded(line) for node, line in zip(sorted(first), lines, strict=True)]


# after the end (or a rank's exit): how long its relay may take to write its last lines
_SETTLE_S = 3.0
_END_POLL_S = 0.005  # once every rank has ended, run.json is looked at this often (a stat)
# A run with nothing new for a while (ranks importing, computing, waiting) is looked at 5 times a
# second instead of 20: each look is ~0.5 ms of CPU taken from the ranks; the first line after a
# quiet spell shows within 0.2 s, and lines that keep coming are polled for at POLL_S again.
_QUIET_S = 1.0
_QUIET_POLL_S = 0.2
_BUSY = 1 << 20  # a poll that copied this much polls again at once (a flood of output)
# events about a rank that wait for its last lines
_HELD = (EventKind.RANK_EXITED, EventKind.FAILURE)


class _Plain:
    """Plain output: every rank's log copied whole and prefixed (bytes: large reads and writes), and
    the events, each printed once the lines before it are (a rank's exit after its last line)."""

    def __init__(self, run: ConsoleRun, out: TextIO, lines: bool) -> None:
        self.run, self.out = run, out
        self.logs = RankLogs(RunLayout(run.run_dir).logs) if lines else None
        # a terminal: escapes drawn
        self.binary = bytes_for_terminal(out.buffer) if hasattr(out, "buffer") else None
        self.held: list[tuple[float, EventLine]] = []

    def write(self, data: bytes) -> None:
        if self.binary is not None:
            self.binary.write(data)
        else:
            self.out.write(data.decode("utf-8", "replace"))

    def copy(self) -> int:
        if self.logs is None:
            return 0
        self.logs.discover()
        moved = self.logs.copy(self.write)
        for rank, line in () if self.run.ended_lines else self.logs.last_line.items():
            # for the table's last-line column (once the run ended: each log's end, taken whole)
            text = visible(line.decode("utf-8", "replace").strip())
            if text and rank in self.run.ranks:
                self.run.last_line[rank] = text
        return moved

    def events(self, new: list[EventLine], *, force: bool = False) -> None:
        now = time.monotonic()
        self.held += [(now, ev) for ev in new]
        ready = []
        while self.held:
            since, ev = self.held[0]
            if not force and now - since < _SETTLE_S and not self._ready(ev):
                break
            if not force and self._more_diffs(ev, now):
                break
            self.held.pop(0)
            ready.append(ev)
        if ready:
            self.write("".join(line + "\n" for line in self._said(ready)).encode())

    def _more_diffs(self, ev: EventLine, now: float) -> bool:
        """``ev`` is an ``env_diff`` and only ``env_diff`` events are held after it: another of
        the same verdict may come in the next poll (the line of a node takes all of them), so
        they wait for another event, or _SETTLE_S after the last."""
        if ev.kind is not EventKind.ENV_DIFF:
            return False
        if any(e.kind is not EventKind.ENV_DIFF for _, e in self.held):
            return False
        return now - self.held[-1][0] < _SETTLE_S

    def _said(self, events: list[EventLine]) -> list[str]:
        """A line an event, a line an odd node for its ``env_diff`` events; past 64 ranks, ranks
        that started or ended cleanly together: one."""
        events = fold_env_diffs(events)
        if len(events) < 2:
            return [_plain_event(ev) for ev in events]
        from xl.launcher.cli import console_summary  # noqa: PLC0415 - not on the way to the start

        rec = self.run.record
        world = max(len(self.run.ranks), (rec.world_size or 0) if rec else 0)
        return console_summary.fold_events(events, _plain_event, world)

    def _ready(self, ev: EventLine) -> bool:
        rank = ev.rank
        if self.logs is None or ev.kind not in _HELD or rank is None:
            return True
        self.logs.discover()  # a log not seen yet is one not copied yet
        return self.logs.caught_up(rank)

    def settled(self) -> bool:
        return not self.held and (self.logs is None or not self.logs.writing())

    def flush(self) -> None:
        (self.binary or self.out).flush()


def _pause(run: ConsoleRun, quiet: bool = False) -> None:
    """Until the next poll (``quiet``: nothing new for _QUIET_S). Once every rank has ended the
    run's end is near: run.json is looked at every 5 ms (a stat; a full poll each time cost the
    view ~0.15 s of CPU while torchrun tears down), so a short job's end is seen at once."""
    if not (run.ranks and all(r.exit_code is not None for r in run.ranks.values())):
        time.sleep(_QUIET_POLL_S if quiet else POLL_S)
        return
    layout = RunLayout(run.run_dir)
    # torchrun's teardown is mostly quiet; the run's end is run.json's final status, then its
    # run_ended event
    deadline = time.monotonic() + (_QUIET_POLL_S if quiet else POLL_S)
    before = (_mtime(layout.run), _mtime(layout.events))
    while time.monotonic() < deadline and (_mtime(layout.run), _mtime(layout.events)) == before:
        time.sleep(_END_POLL_S)


def _mtime(path: Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


# A run whose supervisor is gone was settled by another process, which writes run_ended just
# after run.json: this long after run.json's last write, none is coming (a run of an older xl,
# a writer killed between the two).
_WRITER_S = 0.5
# A supervisor that never writes run_ended after the final status (frozen, SIGSTOPped) holds the
# view no longer than this after the end was seen.
_ENDED_WAIT_S = 10.0


def _ended(events: list[EventLine]) -> bool:
    return any(ev.kind is EventKind.RUN_ENDED for ev in events)


def _nothing_to_come(run: ConsoleRun, final_at: float) -> bool:
    """Once run.json says the run ended, whether events.jsonl can still grow although its
    run_ended was not read: the supervisor (or whoever settles the run) saves the final status
    first and appends run_ended after, so a view that stopped at the status would lose it. Asked
    before a poll, so that poll reads whatever the writer wrote before it was found gone."""
    from xl.launcher import runprocs  # noqa: PLC0415 - the run's end only: not on the way to the start

    rec = run.record
    if rec is None or time.monotonic() - final_at > _ENDED_WAIT_S:
        return True
    if runprocs.supervisor_alive(rec):
        return False
    written = _mtime(RunLayout(run.run_dir).run)
    return written is None or time.time() - written / 1e9 > _WRITER_S


def watch_plain(
    run: ConsoleRun, out: TextIO, on_tick: Callable[[], None] | None = None, lines: bool = True
) -> int:
    print(
        f"xl: run {run.run_dir.name} ({run.run_dir}); 'xl attach {run.run_dir.name}' "
        "reopens it",
        file=out,
        flush=True,
    )
    plain = _Plain(run, out, lines)
    run.read_lines = False
    final_at: float | None = None
    ended = False  # run_ended was read: every event of the run is in
    news_at = time.monotonic()
    while True:
        drained = ended or (final_at is not None and _nothing_to_come(run, final_at))
        run.poll()
        ended = ended or _ended(run.new_events)
        # what is known before these lines (a rank's exit waits for them)
        plain.events(run.new_events)
        moved = plain.copy()
        if moved or run.new_events:
            news_at = time.monotonic()
        plain.events([])
        plain.flush()
        if run.final:
            # Polled on after the end is seen until its last event is read (run_ended, written
            # after the final status) and the logs settle: the end table comes after every event.
            if final_at is None:
                final_at = time.monotonic()
                continue  # at once: a short job's end is not held up by a sleep
            settled = plain.settled() or time.monotonic() - final_at > _SETTLE_S
            if not moved and (ended or drained) and settled:
                break
        if on_tick is not None:
            on_tick()
        if moved < _BUSY:
            _pause(run, quiet=time.monotonic() - news_at > _QUIET_S)
    plain.events([], force=True)
    if plain.logs is not None:
        plain.logs.finish(plain.write)
    plain.flush()
    # Where no live table can redraw (a pipe, a file, CI's log), the table comes once, at the end:
    # every rank's state, pid, GPU, exit code and the run's figures, plain and aligned.
    print(endtable.end_text(run, width=max(100, _width(out))), file=out, end="", flush=True)
    return run.exit_code


def _width(out: TextIO) -> int:
    return shutil.get_terminal_size((120, 24)).columns if out.isatty() else 120


# ---------------------------------------------------------------------------------- Rich live view


def render(
    run: ConsoleRun, *, events: bool = True, ascii_only: bool = False, width: int | None = None
) -> Group:
    """The live view as a Rich renderable (rank table + recent events). An eval column once a
    rank has evaluated, where ``width`` (the terminal's) leaves room for it beside the loss."""
    from rich import box  # noqa: PLC0415 - Rich costs ~40 ms; `xl launch --detach` never draws
    from rich.console import Group  # noqa: PLC0415 - as above
    from rich.table import Table  # noqa: PLC0415 - as above
    from rich.text import Text  # noqa: PLC0415 - as above

    from xl.launcher.cli import console_summary  # noqa: PLC0415 - as above: drawn with Rich

    if console_summary.summarised(run.ranks):  # past 64 ranks: nodes and outliers, no rows
        big = console_summary.render_summary(run.ranks, endtable.title(run)).rstrip("\n")
        return Group(Text(big), *_tail(run, events, Text))
    name = (run.record.name if run.record else None) or ""
    title = f"{name}  [b]{run.title}[/b]  {run.status}  {run.elapsed():.0f}s"
    table = Table(
        title=title,
        title_justify="left",
        expand=True,
        show_lines=False,
        box=box.ASCII if ascii_only else box.HEAVY_HEAD,
    )
    evals = endtable.has_eval(run) and (width is None or width >= _EVAL_MIN_WIDTH)
    for col, kw in (
        ("rank", {"justify": "right"}),
        ("state", {"no_wrap": True}),  # "failed (1)" on one line, even at 80 columns
        ("pid", {"justify": "right"}),
        ("GPU", {"justify": "right"}),
        ("step", {"justify": "right"}),
        ("samples/s", {"justify": "right"}),
        ("loss", {"justify": "right"}),
        ("util", {"justify": "right"}),
        ("mem", {"justify": "right"}),
        *((("eval", {"justify": "right", "no_wrap": True}),) if evals else ()),
        ("last log line", {"ratio": 1, "no_wrap": True, "overflow": "ellipsis"}),
    ):
        table.add_column(col, **kw)
    for rank in sorted(run.ranks):
        r, last = run.ranks[rank], run.last_line.get(rank, "")
        row = endtable.cells(r, last, evals, ended=run.final)
        table.add_row(
            row[0],
            Text(row[1], style=lifecycle_style(r.state)),
            *row[2:-1],
            _last_line(r, last, Text, diagnosis=not run.final),
        )
    return Group(table, *_tail(run, events, Text))


# the last events looked at for the tail's 5 lines: enough that the env_diff events of the
# odd nodes (one per field) make their lines whole
_TAIL_FOLDED = 64


def _tail(run: ConsoleRun, events: bool, text: type[Text]) -> list[Text]:
    """Under the table: the hang verdict in force, and the last events."""
    parts = [text(f"hang: {visible(run.verdict)}", style="bold yellow")] if run.verdict else []
    for ev in fold_env_diffs(run.events[-_TAIL_FOLDED:])[-5:] if events else []:
        style = _EVENT_STYLE.get(ev.kind, "dim") if ev.kind is not None else "dim"
        parts.append(text(_plain_event(ev), style=style))
    return parts


# narrower, an eval column would squeeze the loss to "0.…" (the end table has it)
_EVAL_MIN_WIDTH = 100


def _last_line(r: RankView, last: str, text: type[Text], *, diagnosis: bool = True) -> Text:
    """What the rank last printed, first; while the run goes, xl's diagnosis of it after, never
    in its place (once it ended, the events said it)."""
    out = text(last)
    if r.diagnosis and diagnosis:
        out.append(("  " if last else "") + f"xl: {visible(r.diagnosis)}", style="yellow")
    return out


def watch_live(run: ConsoleRun, on_tick: Callable[[], None] | None = None) -> int:
    from rich.console import Console  # noqa: PLC0415 - Rich: ~40 ms; --detach never draws
    from rich.live import Live  # noqa: PLC0415 - as above
    from rich.panel import Panel  # noqa: PLC0415 - as above

    console = Console()
    last = 0.0
    final_at: float | None = None
    run.poll()
    ended = _ended(run.new_events)
    with Live(
        render(run, width=console.width), console=console, auto_refresh=False, transient=False
    ) as live:
        while True:
            drained = ended or (final_at is not None and _nothing_to_come(run, final_at))
            run.poll()
            ended = ended or _ended(run.new_events)
            now = time.monotonic()
            if run.new_events or now - last >= RENDER_S or run.final:
                live.update(render(run, width=console.width), refresh=True)
                last = now
            # the last frame's events end with the run's own (run_ended comes after the status)
            if run.final and (ended or drained):
                break
            if run.final and final_at is None:
                final_at = now
                continue
            if on_tick is not None:
                on_tick()
            time.sleep(POLL_S)
    from xl.launcher.cli import splittable  # noqa: PLC0415 - the run's end only

    if split := splittable.render(run.ranks):
        console.print(split, end="", highlight=False)
    failure = run.failure
    if failure is not None and failure.traceback:
        console.print(
            Panel(
                visible(str(failure.traceback), lines=True),
                title=endtable.traceback_title(failure),
                border_style="red",
            )
        )
    console.print(
        endtable.summary(run), style=outcome_style(run.status), highlight=False, markup=False
    )
    return run.exit_code


def watch(
    run_dir: Path,
    *,
    plain: bool | None = None,
    on_tick: Callable[[], None] | None = None,
    lines: bool = True,
) -> int:
    """Show ``run_dir`` until it ends; returns 0 succeeded, 1 failed or stopped.

    ``lines=False``: events and the outcome only, no rank output (plain view)."""
    run = ConsoleRun(run_dir)
    if plain is None:
        plain = not sys.stdout.isatty()
    if plain or not lines:
        return watch_plain(run, sys.stdout, on_tick, lines)
    return watch_live(run, on_tick)
