"""The console views' run (``xl launch --no-tui``, ``xl attach`` off the app): the reader's
``RunView``, the one model every view draws, plus each rank's last line of output, which only
these views show."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from xl.launcher.rundir.events import EventLine
from xl.launcher.rundir.lastbytes import last_output_line, said
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.outcome import Failure
from xl.launcher.rundir.runrecord import RunRecord
from xl.launcher.view.reader import RunReader
from xl.launcher.view.runview import RankView, RunView
from xl.textsafe import visible


@dataclass
class ConsoleRun:
    """The console view's run: the reader's RunView (the one model every view draws), plus what
    only this view shows, each rank's last line of output."""

    run_dir: Path
    view: RunView | None = None  # the latest poll's
    last_line: dict[int, str] = field(default_factory=dict)
    new_lines: list[tuple[int, str]] = field(default_factory=list)
    reader: RunReader = field(init=False)
    # new_lines from the reader (False: the plain view copies the logs itself)
    read_lines: bool = True
    ended_lines: bool = False  # last_line holds each rank's last line as its log ended
    _before: dict[int, str] = field(default_factory=dict, init=False, repr=False)  # its last line

    def __post_init__(self) -> None:
        self.reader = RunReader(self.run_dir)

    @property
    def loaded(self) -> bool:
        """run.json was read: the run's status and record are known."""
        return self.view is not None and self.view.loaded

    @property
    def record(self) -> RunRecord | None:
        return self.view.record if self.view is not None and self.view.loaded else None

    @property
    def ranks(self) -> dict[int, RankView]:
        return self.view.ranks if self.view is not None else {}

    @property
    def events(self) -> list[EventLine]:
        return self.view.events[-50:] if self.view is not None else []

    @property
    def new_events(self) -> list[EventLine]:
        return self.view.new_events if self.view is not None else []

    @property
    def status(self) -> str:
        return self.record.status if self.record is not None else "starting"

    @property
    def final(self) -> bool:
        return self.record is not None and self.record.final

    @property
    def exit_code(self) -> int:
        """0 when the run succeeded, else 1 (failed, stopped, or the view was left early)."""
        return 1 if self.record is None else self.record.exit_code

    @property
    def verdict(self) -> str | None:
        """The hang's verdict while one is in force (RunView.hang)."""
        hang = self.view.hang if self.view is not None else None
        return hang.message if hang is not None else None

    @property
    def failure(self) -> Failure | None:
        """The root cause, once the run failed."""
        return self.view.failure if self.view is not None and self.view.failed else None

    def poll(self) -> None:
        self.view = self.reader.poll()
        self.new_lines = []
        for rank in sorted(self.ranks) if self.read_lines else ():
            for text in self.reader.new_log_lines(rank):
                # a tqdm redraw: its latest text, shown safely
                text = visible(text.rsplit("\r", 1)[-1])
                self.new_lines.append((rank, text))
                shown = said(text, self._before.get(rank, ""))
                self._before[rank] = text
                if shown is not None and not self.ended_lines:
                    self.last_line[rank] = shown
        if self.final and not self.ended_lines:
            self.take_last_lines()

    def take_last_lines(self) -> None:
        """Each rank's last line as its log ends (lastbytes.last_output_line): what the end
        tables show, the same wherever they are drawn."""
        layout = RunLayout(self.run_dir)
        for rank in self.ranks:
            self.last_line[rank] = visible(last_output_line(layout.rank_log(rank)))
        self.ended_lines = True

    def elapsed(self) -> float:
        took = self.view.elapsed(time.time()) if self.view is not None else None
        return max(0.0, took or 0.0)

    @property
    def title(self) -> str:
        return self.record.run_id if self.record is not None else self.run_dir.name
