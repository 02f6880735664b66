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

import math
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xl.launcher.rundir.events import EVENTS_FILE
from xl.launcher.rundir.jsonl import decode_lines
from xl.launcher.rundir.metrics import METRICS_FILE
from xl.launcher.rundir.record import RunRecord, RunStatus, read_object, run_file
from xl.launcher.rundir.tail import Tail

HISTORY = 600  # points kept per series and rank, spread over the whole run
# On first open of a huge metrics file, only its tail is read: the view needs recent values.
MAX_INITIAL_BYTES = 64 << 20
_MAX_EVENTS = 5000


class History:
    """A rank's (t, value) points over the whole run, at most ``cap`` of them.

    A deque of the last N points shows only the last few seconds of a rank that logs a hundred
    times a second. Here, whenever the kept points reach ``cap``, every other one goes and from
    then on only every 2nd (then 4th, ...) new point is kept: the points stay evenly spread from
    the first to the newest, which is always there (the view shows the latest value).
    """

    __slots__ = ("_cap", "_kept", "_latest", "_skip", "_stride")

    def __init__(self, cap: int = HISTORY) -> None:
        self._cap = max(2, cap)
        self._kept: list[tuple[float, float]] = []
        self._latest: tuple[float, float] | None = None  # newest point, when not kept
        self._stride = 1
        self._skip = 0

    def append(self, point: tuple[float, float]) -> None:
        self._skip += 1
        if self._skip < self._stride:
            self._latest = point
            return
        self._skip = 0
        self._latest = None
        self._kept.append(point)
        if len(self._kept) >= self._cap:
            del self._kept[1::2]
            if self._kept[-1] is not point:
                # It went with the others: it stays shown until a newer one comes, and the next
                # point kept is one new stride after the last one kept.
                self._latest = point
                self._skip = self._stride
            self._stride *= 2

    def _points(self) -> list[tuple[float, float]]:
        return self._kept if self._latest is None else [*self._kept, self._latest]

    def __len__(self) -> int:
        return len(self._kept) + (self._latest is not None)

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return iter(self._points())

    def __getitem__(self, index: int) -> tuple[float, float]:
        if index == -1 and self._latest is not None:
            return self._latest
        return self._points()[index]

    def __repr__(self) -> str:
        return f"History({self._points()!r})"


@dataclass
class RankView:
    rank: int
    node: str | None = None  # the host, as run.json names it
    node_rank: int | None = None  # xl's node rank: tells apart two nodes on one host
    gpu: Any = None
    pid: int | None = None
    state: str = "running"  # running|straggler|stalled|exited|failed|stopped
    step: float | None = None
    total_steps: float | None = None
    loss: float | None = None
    eval_loss: float | None = None  # the latest evaluation's, never a training loss (docs/frameworks.md)
    epoch: float | None = None
    lr: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    steps_per_s: float | None = None
    gpu_util: float | None = None
    gpu_mem_used_mib: float | None = None
    gpu_mem_total_mib: float | None = None
    rss_mib: float | None = None
    cpu_pct: float | None = None
    comm_wait_s: float | None = None
    cuda_alloc_mib: float | None = None  # torch's own counters, from ranks that use CUDA
    cuda_reserved_mib: float | None = None
    last_seen: float | None = None
    exit_code: int | None = None
    diagnosis: str | None = None  # the message of the stalled/straggler event in force
    loss_history: History = field(default_factory=History)
    samples_history: History = field(default_factory=History)
    gpu_util_history: History = field(default_factory=History)
    _steps: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=64), repr=False)
    _flag: str | None = field(default=None, repr=False)

    @property
    def progress(self) -> float | None:
        if self.step is None or not self.total_steps:
            return None
        return max(0.0, min(1.0, self.step / self.total_steps))

    @property
    def eta_s(self) -> float | None:
        """Seconds to total_steps at the recent step rate (None when unknown)."""
        if self.step is None or not self.total_steps or len(self._steps) < 2:
            return None
        (t0, s0), (t1, s1) = self._steps[0], self._steps[-1]
        if t1 <= t0 or s1 <= s0:
            return None
        rate = (s1 - s0) / (t1 - t0)
        return max(0.0, (self.total_steps - self.step) / rate)


@dataclass
class RunView:
    run: dict[str, Any]
    ranks: dict[int, RankView]
    events: list[dict[str, Any]]
    new_events: list[dict[str, Any]]
    collector: dict[str, Any] | None = None

    @property
    def record(self) -> RunRecord:
        """run.json as the typed record (an empty one, status "unknown", before it is read)."""
        return RunRecord.from_json(self.run)

    @property
    def status(self) -> str:
        return self.record.status

    @property
    def run_id(self) -> str | None:
        return self.record.run_id or None


def _num(value: Any) -> float | None:
    """``value`` when it is a finite int or float (not a bool), else None."""
    if type(value) is float or type(value) is int:  # what JSON numbers are: the fast path
        return value if math.isfinite(value) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


_NONFINITE = ("nan", "inf", "-inf")  # how xl.log names a non-finite figure
# The figures a sys line may carry, each copied to the RankView attribute of the same name.
_SYS_KEYS = (
    "gpu_util",
    "gpu_mem_used_mib",
    "gpu_mem_total_mib",
    "rss_mib",
    "cpu_pct",
    "cuda_alloc_mib",
    "cuda_reserved_mib",
    "comm_wait_s",
)


class RunReader:
    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self._metrics = Tail(self.run_dir / METRICS_FILE, MAX_INITIAL_BYTES)
        self._events = Tail(self.run_dir / EVENTS_FILE)
        self._run: dict[str, Any] = {}
        self._record = RunRecord.from_json({})
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
        run, self._run_mtime = self._read_json(run_file(self.run_dir), self._run_mtime)
        if run is not None:
            self._run = run
            self._record = RunRecord.from_json(run, self.run_dir.name)
        status, self._collector_mtime = self._read_json(
            self.run_dir / "collector.json", self._collector_mtime
        )
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
            run=self._run,
            ranks=dict(sorted(self._ranks.items())),
            events=list(self._event_list),
            new_events=new_events,
            collector=self._collector,
        )

    def _apply_metrics(self, records: list[Any]) -> None:
        # The per-record hot path (640 records a second on a 64-rank run): a finite float, what
        # nearly every figure is, is taken without a call to _num; anything else goes through it.
        ranks = self._ranks
        isfinite = math.isfinite
        for rec in records:
            if type(rec) is not dict and not isinstance(rec, dict):
                continue
            rank = rec.get("rank")
            t = rec.get("t")
            if type(t) is not float or not isfinite(t):
                t = _num(t)
                if t is None:
                    continue
            if type(rank) is not int:  # JSON's ints are exactly int; `true` is not rank 1
                continue
            view = ranks.get(rank)
            if view is None:
                view = self._rank(rank)
            if view.last_seen is None or t > view.last_seen:
                view.last_seen = t
            if rec.get("kind") == "sys":
                self._apply_sys(view, t, rec)
                continue
            if "step" in rec:
                step = rec["step"]
                if type(step) is not int and (type(step) is not float or not isfinite(step)):
                    step = _num(step)
                if step is not None:
                    view.step = step
                    steps = view._steps
                    if not steps or step > steps[-1][1]:
                        steps.append((t, step))
                    elif step < steps[-1][1]:  # a new run phase restarted the count
                        steps.clear()
                        steps.append((t, step))
            if "total_steps" in rec:
                total = _num(rec["total_steps"])
                if total is not None:
                    view.total_steps = total
            if "eval_loss" in rec or "epoch" in rec:
                self._apply_eval(view, rec)
            if "loss" in rec and "eval_loss" not in rec:
                loss = rec["loss"]
                if type(loss) is not float or not isfinite(loss):
                    loss = _num(loss)
                if loss is not None:
                    view.loss = loss
                    view.loss_history.append((t, loss))
                else:  # xl.log writes a nan / inf loss as null plus "nonfinite": shown as such
                    nonfinite = rec.get("nonfinite")
                    named = nonfinite.get("loss") if isinstance(nonfinite, dict) else None
                    view.loss = float(named) if named in _NONFINITE else None
            if "lr" in rec:
                view.lr = _num(rec["lr"])
            if "learning_rate" in rec:
                view.lr = _num(rec["learning_rate"])
            if "samples_per_s" in rec:
                samples = rec["samples_per_s"]
                if type(samples) is not float or not isfinite(samples):
                    samples = _num(samples)
                view.samples_per_s = samples
                if samples is not None:
                    view.samples_history.append((t, samples))
            if "tokens_per_s" in rec:
                view.tokens_per_s = _num(rec["tokens_per_s"])
            if "steps_per_s" in rec:
                view.steps_per_s = _num(rec["steps_per_s"])

    @staticmethod
    def _apply_eval(view: RankView, rec: dict[str, Any]) -> None:
        for key in ("eval_loss", "epoch"):
            value = _num(rec.get(key))
            if value is not None:  # finite figures only: a null leaves the last one shown
                setattr(view, key, float(value))

    @staticmethod
    def _apply_sys(view: RankView, t: float, rec: dict[str, Any]) -> None:
        for key in _SYS_KEYS:
            if key in rec:
                setattr(view, key, _num(rec[key]))
        if "gpu" in rec:
            view.gpu = rec["gpu"]
        if isinstance(rec.get("pid"), int) and view.pid is None:
            view.pid = rec["pid"]
        if view.gpu_util is not None and "gpu_util" in rec:
            view.gpu_util_history.append((t, view.gpu_util))

    def _apply_event(self, event: dict[str, Any]) -> None:
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
        elif kind == "recovered" and (event.get("of") == view._flag or (view._flag == "waiting" and event.get("of") == "stalled")):
            view._flag = None
            view.diagnosis = None

    def _apply_run(self) -> None:
        stopped = self._record.status == RunStatus.STOPPED
        culprit = (self._record.failure or {}).get("rank")
        ended: dict[int, str] = {}  # the supervisor's own verdict per rank, when it gave one
        for info in self._record.ranks:
            if not isinstance(info.get("rank"), int):
                continue
            view = self._rank(info["rank"])
            for key in ("node", "node_rank", "gpu", "pid"):
                if info.get(key) is not None:
                    setattr(view, key, info[key])
            code = info.get("exit_code")
            view.exit_code = code if isinstance(code, int) else None
            if info.get("state") in ("exited", "failed", "stopped"):
                ended[view.rank] = info["state"]
        for view in self._ranks.values():
            if view.exit_code is not None:
                if view.exit_code == 0:
                    view.state = "exited"
                elif view.rank in ended:
                    view.state = ended[view.rank]
                elif stopped or (isinstance(culprit, int) and view.rank != culprit):
                    # A rank the supervisor ended because another one failed was stopped;
                    # only the root cause failed.
                    view.state = "stopped"
                else:
                    view.state = "failed"
            elif stopped:
                view.state = "stopped"
            else:
                view.state = view._flag or "running"

    # -- logs -------------------------------------------------------------------------------

    def log_path(self, rank: int) -> Path:
        return self.run_dir / "logs" / f"rank-{rank}.log"

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
