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

import os
from pathlib import Path
from typing import Any

from xl.figures import PLAIN_SYS, PLAIN_TRAIN, TIMED, number
from xl.launcher.rundir.jsonl import decode_lines
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.outcome import DONE_STATES, rank_outcome
from xl.launcher.rundir.record import RankRow, RunRecord, RunStatus, read_object
from xl.launcher.rundir.runview import HangRule, RankView, RunView, failure_of
from xl.launcher.rundir.tail import Tail

__all__ = ["RankView", "RunReader", "RunView"]  # the model's types, where the reader's users look

# On first open of a huge metrics file, only its tail is read: the view needs recent values.
MAX_INITIAL_BYTES = 64 << 20
_MAX_EVENTS = 5000


_NONFINITE = ("nan", "inf", "-inf")  # how xl.log names a non-finite figure


class RunReader:
    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.layout = RunLayout(self.run_dir)
        self._metrics = Tail(self.layout.metrics, MAX_INITIAL_BYTES)
        self._events = Tail(self.layout.events)
        self._loaded = False  # run.json read once
        self._record = RunRecord.from_json({})
        self._hangs = HangRule()
        self._failed: dict[str, Any] | None = None  # the newest failure event
        self._run_mtime: int | None = None
        self._collector_mtime: int | None = None
        self._collector: dict[str, Any] | None = None
        self._ranks: dict[int, RankView] = {}
        self._event_list: list[dict[str, Any]] = []
        self._applied: tuple[int | None, int] | None = None  # (run.json mtime, ranks) last applied
        self._log_tails: dict[int, Tail] = {}

    def _rank(self, rank: int) -> RankView:
        view = self._ranks.get(rank)
        if view is None:
            view = self._ranks[rank] = RankView(rank)
        return view

    @staticmethod
    def _read_json(path: Path, last_mtime: int | None) -> tuple[dict[str, Any] | None, int | None]:
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return None, last_mtime
        if mtime == last_mtime:
            return None, last_mtime
        obj = read_object(path)
        # None: mid-replace on some filesystems; the next poll reads it again.
        return obj, (mtime if obj is not None else last_mtime)

    def poll(self) -> RunView:
        run, self._run_mtime = self._read_json(self.layout.run, self._run_mtime)
        if run is not None:  # parsed once per change of run.json, not once per view that draws it
            self._loaded = True
            self._record = RunRecord.from_json(run, self.run_dir.name)
        status, self._collector_mtime = self._read_json(self.layout.collector, self._collector_mtime)
        if status is not None:
            self._collector = status
        self._apply_metrics(decode_lines(self._metrics.read()))
        new_events: list[dict[str, Any]] = []
        for event in decode_lines(self._events.read()):
            if isinstance(event, dict):
                new_events.append(event)
                self._apply_event(event)
        self._event_list.extend(new_events)
        if len(self._event_list) > _MAX_EVENTS:
            del self._event_list[: len(self._event_list) - _MAX_EVENTS]
        # Rank states follow run.json, the events and which ranks exist: with none of them new,
        # they are what the last poll made them.
        applied = (self._run_mtime, len(self._ranks))
        if new_events or applied != self._applied:
            self._apply_run()
            self._applied = applied
        return RunView(
            record=self._record,
            ranks=dict(sorted(self._ranks.items())),
            events=list(self._event_list),
            new_events=new_events,
            collector=self._collector,
            loaded=self._loaded,
            hang_found=self._hangs.hang,
            failure=failure_of(self._record, self._failed),
        )

    def _apply_metrics(self, records: list[Any]) -> None:
        # The per-record hot path (640 records a second on a 64-rank run). Lines are decoded by
        # the one rule of xl.figures (no finite t or int rank: skipped), inlined here: a finite
        # float, what nearly every figure is, is taken without a call to number().
        ranks = self._ranks
        for rec in records:
            if type(rec) is not dict and not isinstance(rec, dict):
                continue
            rank = rec.get("rank")
            t = rec.get("t")
            if (type(t) is not float and type(t) is not int) or t - t != 0 or type(rank) is not int:
                continue  # JSON's ints are exactly int (`true` is not rank 1); finite t only
            view = ranks.get(rank)
            if view is None:
                view = self._rank(rank)
            if view.last_seen is None or t > view.last_seen:
                view.last_seen = t
            if rec.get("kind") == "sys":
                self._apply_sys(view, t, rec)
                continue
            if "step" in rec:
                step = number(rec["step"])
                if step is not None:
                    view.step = step
                    steps = view._steps
                    if not steps or step > steps[-1][1]:
                        steps.append((t, step))
                    elif step < steps[-1][1]:  # a new run phase restarted the count
                        steps.clear()
                        steps.append((t, step))
            if "total_steps" in rec:
                total = number(rec["total_steps"])
                if total is not None:
                    view.total_steps = total
            if "eval_loss" in rec or "epoch" in rec:
                self._apply_eval(view, rec)
            if "loss" in rec and "eval_loss" not in rec:
                loss = number(rec["loss"])
                if loss is not None:
                    view.loss = loss
                    view.loss_history.append((t, loss))
                else:  # xl.log writes a nan / inf loss as null plus "nonfinite": shown as such
                    nonfinite = rec.get("nonfinite")
                    named = nonfinite.get("loss") if isinstance(nonfinite, dict) else None
                    view.loss = float(named) if named in _NONFINITE else None
            if "lr" in rec:
                view.lr = number(rec["lr"])
            if "learning_rate" in rec:
                view.lr = number(rec["learning_rate"])
            if "samples_per_s" in rec:
                samples = view.samples_per_s = number(rec["samples_per_s"])
                if samples is not None:
                    view.samples_history.append((t, samples))
            for key, attr in PLAIN_TRAIN:
                if key in rec:
                    setattr(view, attr, number(rec[key]))
            if "step_s" in rec:  # a timed step: its split comes with it (xl.figures.TIMED)
                for key in TIMED:
                    setattr(view, key, number(rec.get(key)))
                view._took(t, rec)

    @staticmethod
    def _apply_eval(view: RankView, rec: dict[str, Any]) -> None:
        for key in ("eval_loss", "epoch"):
            value = number(rec.get(key))
            if value is not None:  # finite figures only: a null leaves the last one shown
                setattr(view, key, float(value))

    @staticmethod
    def _apply_sys(view: RankView, t: float, rec: dict[str, Any]) -> None:
        for key, attr in PLAIN_SYS:
            if key in rec:
                setattr(view, attr, number(rec[key]))
        if "gpu" in rec:
            view.gpu = _gpu(rec["gpu"])
        if isinstance(rec.get("pid"), int) and view.pid is None:
            view.pid = rec["pid"]
        if view.gpu_util is not None and "gpu_util" in rec:
            view.gpu_util_history.append((t, view.gpu_util))

    def _apply_event(self, event: dict[str, Any]) -> None:
        self._hangs.see(event)
        if event.get("kind") == "failure":
            self._failed = event
        rank = event.get("rank")
        if not isinstance(rank, int):
            return
        kind = event.get("kind")
        view = self._rank(rank)
        if kind in ("stalled", "straggler"):
            # stalled outranks straggler: a hung rank is the bigger news. A rank that waits in a
            # collective for the culprit of a hang (``waiting_on``) is its victim: "waiting".
            flag = "waiting" if kind == "stalled" and event.get("waiting_on") else kind
            if kind == "stalled" or view._flag not in ("stalled", "waiting"):
                view._flag = flag
                view.diagnosis = str(event.get("message") or kind)
                phase = event.get("phase") if kind == "straggler" else None
                view.straggler_phase = phase if phase in ("data", "compute", "comm", "other") else None
        elif kind == "recovered" and (event.get("of") == view._flag or (view._flag == "waiting" and event.get("of") == "stalled")):
            view._flag = None
            view.diagnosis = None
            view.straggler_phase = None

    def _apply_run(self) -> None:
        stopped = self._record.status == RunStatus.STOPPED
        failure = self._record.failure
        culprit = failure.rank if failure is not None else None
        recorded: dict[int, object] = {}  # run.json's state of each rank
        for row in self._record.ranks:
            if row.rank is None:
                continue
            view = self._rank(row.rank)
            _take_row(view, row)
            recorded[view.rank] = row.state
        for view in self._ranks.values():
            said = recorded.get(view.rank)
            if view.exit_code is not None or stopped or (isinstance(said, str) and said in DONE_STATES):
                # Ended (or ended by the run's stop): the one rank-outcome rule. A rank the
                # supervisor ended because another one failed was stopped; only the root cause failed.
                blamed = not isinstance(culprit, int) or view.rank == culprit
                view.state = rank_outcome(view.exit_code, stopped=stopped, recorded=said, blamed=blamed).value
            else:
                # Alive: a diagnosis in force, else what run.json says ("starting" until the
                # supervisor learned its pid), else running.
                view.state = view._flag or ("starting" if said == "starting" else "running")

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


def _take_row(view: RankView, row: RankRow) -> None:
    """A rank's row of run.json onto its view: where it runs, its pid and how it ended."""
    if row.host is not None:
        view.host = row.host
    if row.node_rank is not None:
        view.node_rank = row.node_rank
    if row.gpu is not None:
        view.gpu = row.gpu
    if row.pid is not None:
        view.pid = row.pid
    view.exit_code = row.exit_code
