"""The view side of a run: an incremental tail of its run directory.

    r = RunReader(run_dir)
    view = r.poll()          # RunView: run.json, per-rank RankView, events
    r.read_log(rank, 100)    # last lines of a rank's log
    r.new_log_lines(rank)    # lines appended since the previous call

Each ``poll()`` reads only what was appended since the previous one (run.json is re-read when it
changes), so polling at a few Hz costs next to nothing even for long runs. Readers never write
to the run directory: the TUI, ``xl attach`` and the ``--no-tui`` view all use this.
"""

from __future__ import annotations

import dataclasses
import os
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from xl.figures import PLAIN_SYS, PLAIN_TRAIN, TIMED, number, phases, steps_of
from xl.launcher.rundir.events import EventKind, EventLine, parse_lines
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.metrics import MetricKind, MetricsRow, read_rows
from xl.launcher.rundir.outcome import DONE_STATES, rank_outcome
from xl.launcher.rundir.runrecord import RankRow, RunRecord, RunStatus, read_object
from xl.launcher.rundir.tail import Tail
from xl.launcher.view.runview import HangRule, History, RankView, RunView, failure_of

__all__ = ["RankView", "RunReader", "RunView"]  # the model's types, where the reader's users look

# On first open of a huge metrics file, only its tail is read: the view needs recent values.
MAX_INITIAL_BYTES = 64 << 20
_MAX_EVENTS = 5000


_NONFINITE = ("nan", "inf", "-inf")  # how xl.log names a non-finite figure

# The kinds the reader matches, as module names: an enum member read off its class costs a call
# of the enum's own attribute lookup, ~4x a plain one, on every event and every poll.
_FAILURE, _RECOVERED = EventKind.FAILURE, EventKind.RECOVERED
_STALLED, _STRAGGLER = EventKind.STALLED, EventKind.STRAGGLER
_SYS = MetricKind.SYS

# The keys of the train figures that fewer lines carry (RunReader._apply_rarer).
_RARER = frozenset(
    {"eval_loss", "epoch", "lr", "learning_rate", "step_s", *(k for k, _ in PLAIN_TRAIN)}
)

# A rank's own memory: a live process always holds some, so a zero (or nothing) after a reading
# is the sampler catching the process as it ended, never the rank's footprint.
_OWN_MEMORY = frozenset({"mem_mib", "rss_mib", "gpu_proc_mem_mib"})

# RankView's fields as a fresh rank has them (its histories and totals are the reader's own).
_new, _set = object.__new__, object.__setattr__  # how _Rank.view() makes a frozen RankView

_FRESH = {
    f.name: f.default
    for f in dataclasses.fields(RankView)
    if f.default is not dataclasses.MISSING and not f.name.endswith("_history")
}


class _Rank:
    """One rank as the reader keeps it between polls, and no one else sees: its figures by
    RankView's field names (``values``), its histories, the steps its ETA is taken from and the
    diagnosis in force. ``view()`` is what leaves the reader: a frozen RankView of it."""

    __slots__ = (
        "flag",
        "loss",
        "rank",
        "samples",
        "step_s",
        "steps",
        "totals",
        "totals_view",
        "util",
        "values",
    )

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.values: dict[str, Any] = {**_FRESH, "rank": rank}
        self.loss, self.samples, self.util, self.step_s = History(), History(), History(), History()
        self.totals: dict[str, float] = {}
        self.totals_view: MappingProxyType[str, float] | None = None  # the last view's, unchanged
        self.steps: deque[tuple[float, float]] = deque(maxlen=64)
        self.flag: str | None = None  # the stalled/straggler/waiting diagnosis in force

    def took(self, t: float, rec: Mapping[str, Any]) -> None:
        """A line with ``step_s``: its history, and its phases added to the totals."""
        step_s = self.values["step_s"]
        if step_s is not None:
            self.step_s.append((t, step_s))
        parts = phases(rec)
        if parts is None:
            return
        n = steps_of(rec)
        self.values["steps_timed"] += n
        self.totals_view = None
        totals = self.totals
        for key, value in parts.items():
            totals[key] = totals.get(key, 0.0) + value * n

    def view(self) -> RankView:
        # Made without RankView.__init__ (a call per field, 40 of them, per rank and poll): the
        # fields go in at once, as the frozen dataclass's own init would set them. The ETA is
        # worked out inline (a call less per rank and poll): seconds to total_steps at the
        # recent step rate, None when unknown.
        values = self.values
        fields = values.copy()
        steps = self.steps
        if len(steps) > 1:  # else no rate yet, and eta_s stays None (as values has it)
            step, total = values["step"], values["total_steps"]
            (t0, s0), (t1, s1) = steps[0], steps[-1]
            if step is not None and total and t1 > t0 and s1 > s0:
                fields["eta_s"] = max(0.0, (total - step) / ((s1 - s0) / (t1 - t0)))
        fields["loss_history"] = self.loss.snapshot()
        fields["samples_history"] = self.samples.snapshot()
        fields["gpu_util_history"] = self.util.snapshot()
        fields["step_s_history"] = self.step_s.snapshot()
        if self.totals_view is None:  # new phases since the last view
            self.totals_view = MappingProxyType(self.totals.copy())
        fields["phase_totals"] = self.totals_view
        view = _new(RankView)
        _set(view, "__dict__", fields)
        return view


class RunReader:
    """One run directory, read incrementally. Not for two threads at once: one thread polls it
    (the Monitor's worker, a scrape, the console view), and what ``poll()`` returns is a snapshot
    that any thread may read, since nothing in it changes afterwards."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.layout = RunLayout(self.run_dir)
        self._metrics = Tail(self.layout.metrics, MAX_INITIAL_BYTES)
        self._events = Tail(self.layout.events)
        self._loaded = False  # run.json read once
        self._record = RunRecord.from_json({})
        self._hangs = HangRule()
        self._failed: EventLine | None = None  # the newest failure event
        self._run_mtime: int | None = None
        self._ranks: dict[int, _Rank] = {}
        self._event_list: list[EventLine] = []  # the newest _MAX_EVENTS, as handed out
        self._applied: tuple[int | None, int] | None = None  # (run.json mtime, ranks) last applied
        self._views: dict[int, RankView] = {}  # the last poll's snapshots, while nothing changed
        self._touched: dict[int, _Rank] = {}  # the ranks this poll's metrics lines touched
        self._log_tails: dict[int, Tail] = {}

    def _rank(self, rank: int) -> _Rank:
        kept = self._ranks.get(rank)
        if kept is None:
            kept = self._ranks[rank] = _Rank(rank)
        return kept

    @staticmethod
    def _changed(path: Path, last_mtime: int | None) -> tuple[bool, int | None]:
        """(whether ``path`` changed since ``last_mtime``, its mtime now)."""
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return False, last_mtime
        return mtime != last_mtime, mtime

    def poll(self) -> RunView:
        changed, mtime = self._changed(self.layout.run, self._run_mtime)
        run = read_object(self.layout.run) if changed else None
        if run is not None:  # parsed once per change of run.json, not once per view that draws it
            # (None: mid-replace on some filesystems; the next poll reads it again.)
            self._run_mtime = mtime
            self._loaded = True
            self._record = RunRecord.from_json(run, self.run_dir.name)
        self._apply_metrics(read_rows(self._metrics.read()))
        new_events = parse_lines(self._events.read())
        for event in new_events:
            self._apply_event(event)
        if new_events:
            # A new list a change, not a copy a poll (of up to _MAX_EVENTS): the views share one
            # until an event comes, and nothing changes it once handed out.
            self._event_list = (self._event_list + new_events)[-_MAX_EVENTS:]
        # Rank states follow run.json, the events and which ranks exist: with none of them new,
        # they are what the last poll made them.
        applied = (self._run_mtime, len(self._ranks))
        renewed = bool(new_events) or applied != self._applied
        if renewed:  # any rank's state may have moved: a snapshot of each
            self._apply_run()
            self._applied = applied
            self._views = {r: self._ranks[r].view() for r in sorted(self._ranks)}
        else:
            # Only the ranks whose lines came have changed: the others' snapshots still say it
            # all (frozen, so two RunViews may share them). No new rank here, so the order holds.
            views = self._views
            for r, kept in self._touched.items():
                views[r] = kept.view()
        return RunView(
            record=self._record,
            ranks=dict(self._views),
            events=self._event_list,
            new_events=new_events,
            loaded=self._loaded,
            hang_found=self._hangs.hang,
            failure=failure_of(self._record, self._failed),
        )

    def _apply_metrics(self, rows: list[MetricsRow]) -> None:
        """The rows onto their ranks; ``_touched`` is then the ranks they touched (by rank).
        A subclass may see the rows first (the exporter's reader does), then call this."""
        # The per-row hot path (640 rows a second on a 64-rank run): a finite float, what nearly
        # every figure is, is taken without a call to number(). The ranks touched are the lookup
        # table itself: a miss only on a rank's first line of the poll.
        ranks = self._ranks
        touched: dict[int, _Rank] = {}
        self._touched = touched
        sys_kind = _SYS
        for rank, t, kind, rec in rows:
            kept = touched.get(rank)
            if kept is None:
                kept = touched[rank] = ranks.get(rank) or self._rank(rank)
            v = kept.values
            last_seen = v["last_seen"]
            if last_seen is None or t > last_seen:
                v["last_seen"] = t
            if kind is sys_kind:
                self._apply_sys(kept, t, rec)
                continue
            # Each figure below is taken as it is when it is a finite int or float (what JSON
            # numbers nearly always are) and through number() only otherwise: a call less each.
            # The test is written out in each block, not a function of its own: that call a
            # figure costs this loop 10-18% (bench_reader's rows, in-process).
            # ``known`` counts the line's keys read here (t, rank, its kind when it names one):
            # a line with no other key holds none of the rarer figures.
            known = 2 if kind is None else 3
            if "step" in rec:
                known += 1
                step = rec["step"]
                if (type(step) is not float and type(step) is not int) or step - step != 0:
                    step = number(step)
                if step is not None:
                    v["step"] = step
                    steps = kept.steps
                    if not steps or step > steps[-1][1]:
                        steps.append((t, step))
                    elif step < steps[-1][1]:  # a new run phase restarted the count
                        steps.clear()
                        steps.append((t, step))
            if "total_steps" in rec:
                known += 1
                total = rec["total_steps"]
                if (type(total) is not float and type(total) is not int) or total - total != 0:
                    total = number(total)
                if total is not None:
                    v["total_steps"] = total
            if "loss" in rec and "eval_loss" not in rec:
                known += 1
                loss = rec["loss"]
                # 0.0: a float against a float is the interpreter's fast compare (as below)
                if (type(loss) is not float and type(loss) is not int) or loss - loss != 0.0:
                    loss = number(loss)
                if loss is not None:
                    v["loss"] = loss
                    kept.loss.append((t, loss))
                else:  # xl.log writes a nan / inf loss as null plus "nonfinite": shown as such
                    nonfinite = rec.get("nonfinite")
                    named = nonfinite.get("loss") if isinstance(nonfinite, dict) else None
                    v["loss"] = float(named) if named in _NONFINITE else None
            if "samples_per_s" in rec:
                known += 1
                samples = rec["samples_per_s"]
                if (
                    type(samples) is not float and type(samples) is not int
                ) or samples - samples != 0.0:
                    samples = number(samples)
                v["samples_per_s"] = samples
                if samples is not None:
                    kept.samples.append((t, samples))
                    count = rec.get("samples")
                    if samples > 0 and (type(count) is int or type(count) is float) and count > 0:
                        v["samples_counted"] += count
                        v["samples_time_s"] += count / samples
            if len(rec) > known and not _RARER.isdisjoint(rec):  # one test, not one a figure
                self._apply_rarer(kept, t, rec)

    @staticmethod
    def _apply_rarer(kept: _Rank, t: float, rec: Mapping[str, Any]) -> None:
        """The train figures that fewer lines carry (each sets fields of its own)."""
        v = kept.values
        for key in ("eval_loss", "epoch"):
            if key in rec:
                value = number(rec[key])
                if value is not None:  # finite figures only: a null leaves the last one shown
                    v[key] = float(value)
        if "eval_loss" in rec and number(rec["eval_loss"]) is not None:
            # Its own epoch: the line's, else the epoch in force when it came (a later epoch's
            # training lines move ``epoch`` on, never the eval's).
            v["eval_epoch"] = v["epoch"]
        if "lr" in rec:
            v["lr"] = number(rec["lr"])
        if "learning_rate" in rec:
            v["lr"] = number(rec["learning_rate"])
        for key, attr in PLAIN_TRAIN:
            if key in rec:
                v[attr] = number(rec[key])
        if "step_s" in rec:  # a timed step: its split comes with it (xl.figures.TIMED)
            for key in TIMED:
                v[key] = number(rec.get(key))
            kept.took(t, rec)

    @staticmethod
    def _apply_sys(kept: _Rank, t: float, rec: Mapping[str, Any]) -> None:
        v = kept.values
        for key, attr in PLAIN_SYS:
            if key in rec:
                value = rec[key]  # a finite int or float as it is, as in _apply_metrics
                if (type(value) is not float and type(value) is not int) or value - value != 0:
                    value = number(value)
                if not value and attr in _OWN_MEMORY and v[attr]:
                    continue  # read as the rank died: its last good reading stands
                v[attr] = value
        if "gpu" in rec:
            v["gpu"] = _gpu(rec["gpu"])
        if isinstance(rec.get("pid"), int) and v["pid"] is None:
            v["pid"] = rec["pid"]
        if v["gpu_util"] is not None and "gpu_util" in rec:
            kept.util.append((t, v["gpu_util"]))

    def _apply_event(self, event: EventLine) -> None:
        self._hangs.see(event)
        kind = event.kind
        if kind is _FAILURE:
            self._failed = event
        rank = event.rank
        if rank is None:
            return
        kept = self._rank(rank)
        v = kept.values
        if kind is _STALLED or kind is _STRAGGLER:
            # stalled outranks straggler: a hung rank is the bigger news. A rank that waits in a
            # collective for the culprit of a hang (``waiting_on``) is its victim: "waiting".
            stalled = kind is _STALLED
            flag = "waiting" if stalled and event.waiting_on else kind.value
            if stalled or kept.flag not in ("stalled", "waiting"):
                kept.flag = flag
                v["diagnosis"] = event.said
                v["straggler_phase"] = None if stalled else event.phase
        elif kind is _RECOVERED and (
            (of := event.of) is not None
            and (of.value == kept.flag or (kept.flag == "waiting" and of is _STALLED))
        ):
            kept.flag = None
            v["diagnosis"] = None
            v["straggler_phase"] = None

    def _apply_run(self) -> None:
        stopped = self._record.status == RunStatus.STOPPED
        failure = self._record.failure
        culprit = failure.rank if failure is not None else None
        recorded: dict[int, object] = {}  # run.json's state of each rank
        for row in self._record.ranks:
            if row.rank is None:
                continue
            kept = self._rank(row.rank)
            _take_row(kept.values, row)
            recorded[kept.rank] = row.state
        for kept in self._ranks.values():
            v = kept.values
            said = recorded.get(kept.rank)
            if (
                v["exit_code"] is not None
                or stopped
                or (isinstance(said, str) and said in DONE_STATES)
            ):
                # Ended (or ended by the run's stop): the one rank-outcome rule. A rank the
                # supervisor ended because another one failed was stopped; only the root cause
                # failed.
                blamed = not isinstance(culprit, int) or kept.rank == culprit
                v["state"] = rank_outcome(
                    v["exit_code"], stopped=stopped, recorded=said, blamed=blamed
                ).value
            else:
                # Alive: a diagnosis in force, else what run.json says ("starting" until the
                # supervisor learned its pid), else running.
                v["state"] = kept.flag or ("starting" if said == "starting" else "running")

    # -- logs -------------------------------------------------------------------------------

    def log_path(self, rank: int) -> Path:
        return self.layout.rank_log(rank)

    def read_log(self, rank: int, max_lines: int = 200) -> list[str]:
        """The last ``max_lines`` lines of a rank's log (reads at most the last 1 MiB)."""
        path = self.log_path(rank)
        try:
            size = os.stat(path).st_size
            with open(path, "rb") as fh:
                start = max(0, size - (1 << 20))
                fh.seek(start)
                data = fh.read()
        except OSError:
            return []
        lines = data.decode("utf-8", errors="replace").splitlines()
        if start > 0 and lines:
            lines = lines[1:]
        return lines[-max_lines:] if max_lines > 0 else []

    def new_log_lines(self, rank: int, *, restart: bool = False) -> list[str]:
        """Lines appended to a rank's log since the previous call (the first call, or with
        ``restart``: those of its last MiB; ``log_skipped`` then says how many came before)."""
        tail = self._log_tails.get(rank)
        if tail is None or restart:
            tail = self._log_tails[rank] = Tail(self.log_path(rank), 1 << 20)
        return [line.decode("utf-8", errors="replace") for line in tail.read()]

    def log_skipped(self, rank: int) -> int:
        """How many of a rank's log lines its tail left out (those before its last MiB)."""
        tail = self._log_tails.get(rank)
        return 0 if tail is None else tail.skipped_lines


def _gpu(value: Any) -> int | str | None:
    """A rank's GPU as a record names it: its index (or a name, e.g. a MIG UUID)."""
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None


def _take_row(v: dict[str, Any], row: RankRow) -> None:
    """A rank's row of run.json onto its figures: where it runs, its pid and how it ended."""
    for key, value in (
        ("host", row.host), ("node_rank", row.node_rank), ("gpu", row.gpu), ("pid", row.pid)
    ):
        if value is not None:  # a row that does not say keeps what the rank's lines said
            v[key] = value
    v["exit_code"] = row.exit_code
