"""`xl exporter`'s collector: every live run under XL_HOME as Prometheus metrics (docs/exporter.md).

A prometheus-client custom collector on its own registry: each scrape builds every metric family
afresh from the run directories, so a run that ended is gone from the very next scrape and
nothing is kept between scrapes but where each live run's files were last read to (a
``RunReader`` per live run: a scrape reads only what was appended since the previous one).

Names follow Prometheus's rules (base units, ``_total`` on counters, ratios 0-1); label names
follow dcgm-exporter's releases where they meet (``gpu``, ``UUID``, ``pci_bus_id``, ``device``,
``modelName``, ``Hostname``) so ``on(UUID)`` joins xl's series to the GPU's. No ``job``/
``instance``/``pod``/``namespace``/``container`` label: those are the scraper's to set.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector

from xl import figures, paths
from xl.launcher import runprocs
from xl.launcher.exporter.gpus import GPU, Buses, clock_families
from xl.launcher.exporter.nodes import PER_NODE_PAST, NodeSeries, per_node
from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.events import EventKind, EventLine
from xl.launcher.rundir.metrics import MetricKind, MetricsRow
from xl.launcher.rundir.outcome import Failure
from xl.launcher.rundir.runrecord import DeviceRow, RankRow, RunRecord, RunStatus
from xl.launcher.rundir.store import run_owner
from xl.launcher.view.reader import RankView, RunReader, RunView

R = ("run_id", "rank", "local_rank", "Hostname")
G = (*R, *GPU)
STATES = ("running", "waiting", "straggler", "stalled", "hung", "exited", "failed")
# A rank "reports" while its newest line (a train line, or the sampler's sys line that every
# live rank gets each second) is at most this old.
REPORTING_S = 10.0
MIB = 1 << 20
# A failed run's failure stays exported this long after its end, so that a scrape every minute
# or so (and an alert on it) sees it; then it is gone as every ended run is.
FAILED_KEPT_S = 900.0
# The straggler event's fields that label xl_rank_straggler (docs/exporter.md).
STRAGGLER_LABELS = ("phase", "gpu", "gpu_reason", "gpu_detail", "lasting")


class ExporterReader(RunReader):
    """A run's reader that also keeps what the exporter needs and the app does not: each rank's
    samples so far (``samples=`` is a count per call), when its step last moved, its GPU's
    clock-event reasons and the straggler event in force. The hang in force is the RunView's
    (its one rule, runview.HangRule)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.samples_total: dict[int, float] = {}
        self.last_step_t: dict[int, float] = {}
        self.clock_reasons: dict[int, tuple[int, int]] = {}  # rank -> (its GPU, the bitmask)
        # rank -> the labels of its straggler event in force
        self.straggling: dict[int, dict[str, str]] = {}

    def _apply_event(self, event: EventLine) -> None:
        super()._apply_event(event)
        rank = event.rank
        if rank is None:
            return
        if event.kind is EventKind.STRAGGLER:
            self.straggling[rank] = {k: _text(event.data.get(k)) for k in STRAGGLER_LABELS}
        elif event.kind is EventKind.RECOVERED and event.of is EventKind.STRAGGLER:
            self.straggling.pop(rank, None)

    def _apply_metrics(self, rows: list[MetricsRow]) -> None:
        for rank, t, kind, rec in rows:
            if kind is MetricKind.SYS:  # stamped only where they carry a GPU's reasons
                reasons, gpu = rec.get("clock_event_reasons"), rec.get("gpu")
                if type(reasons) is int and type(gpu) is int:
                    self.clock_reasons[rank] = (gpu, reasons)
                continue
            # train lines only (a third of a big run's lines are sys lines: not stamped at all)
            if kind is not MetricKind.TRAIN:
                continue
            samples = figures.number(rec.get("samples"))
            if samples is not None and samples >= 0:
                self.samples_total[rank] = self.samples_total.get(rank, 0.0) + samples
            if "step" in rec and t > self.last_step_t.get(rank, float("-inf")):
                self.last_step_t[rank] = float(t)
        if len(self.last_step_t) > PER_NODE_PAST:
            rows = latest_lines(rows)
        super()._apply_metrics(rows)


def latest_lines(rows: list[MetricsRow]) -> list[MetricsRow]:
    """Of each rank's lines of one kind and the same keys, the last, in the file's order: what a
    big run's figures are made of at a scrape (4,096 ranks: ~12,000 of 184,000 lines between two
    scrapes 15 s apart, the reader's work cut as much). Every key's last value is on the last line
    that has it, and that line is kept, so each figure the exporter shows is the one the whole
    read would give; what it does not show (histories, phase totals) is not kept whole."""
    last: dict[tuple[int, MetricKind | None, tuple[str, ...]], int] = {}
    for i, (rank, _t, kind, said) in enumerate(rows):
        last[(rank, kind, tuple(said))] = i
    return [rows[i] for i in sorted(last.values())]


@dataclass
class LiveRun:
    record: RunRecord
    view: RunView
    reader: ExporterReader
    user: str


def _live(rec: RunRecord) -> bool:
    """Running, and someone still runs it: its supervisor, or (the supervisor gone) its ranks."""
    if rec.status != RunStatus.RUNNING:
        return False
    if rec.supervisor_pid is None or runprocs.supervisor_alive(rec):
        return True
    return bool(runprocs.find_run_pids(rec.run_id))


def _state(view: RankView, hung: frozenset[int]) -> str:
    """The rank's state in the stateset: ``hung`` for a stalled culprit of the hang in force that
    has not moved since (``Hang.stuck``)."""
    if view.state == "stalled" and view.rank in hung:
        return "hung"
    if view.state == "stopped":  # ended by the supervisor, not by its own failure
        return "exited"
    return view.state if view.state in STATES else "running"


def _family(key: str) -> str:
    """The exporter family of a figure, as xl.figures names it."""
    family = figures.BY_KEY[key].family
    assert family is not None
    return family


def _text(value: object) -> str:
    return "" if value is None else str(value)


def failure_labels(rec: RunRecord, failure: Failure | None, host: str) -> dict[str, str] | None:
    """``xl_run_failure_info``'s labels for a run's root cause (None while nothing failed)."""
    if failure is None:
        return None
    cause = failure.cause
    return {
        "rank": _text(failure.rank),
        "Hostname": _text(failure.host or rec.host or host),
        "exit_code": _text(failure.exit_code),
        "kind": cause.kind.value if cause is not None else "",
        "summary": cause.summary if cause is not None else failure.message,
        "fix": _text(cause.fix if cause is not None else None),
    }


class RunsCollector(Collector):
    """Every live run under ``runs_root`` (default ``$XL_HOME/runs``), read on each ``collect``."""

    def __init__(
        self,
        runs_root: Path | None = None,
        *,
        gpus: bool = True,
        clock: Callable[[], float] = time.time,
        per_rank: bool = False,
    ) -> None:
        self.runs_root = runs_root
        self.gpus = gpus
        # every run's series per rank, also past exporter_nodes.PER_NODE_PAST ranks
        self.per_rank = per_rank
        self.clock = clock
        self._readers: dict[str, tuple[ExporterReader, str]] = {}
        # Runs found ended, by the run.json mtime they were found ended at: not read again
        # unless run.json changes.
        self._ended: dict[str, int] = {}
        self._lock = threading.Lock()  # scrapes may come on two server threads at once
        self._host = socket.gethostname()
        self._failed: dict[
            str, tuple[float, dict[str, str]]
        ] = {}  # run id -> (its end, its failure's labels)
        self._bus = Buses()

    def _ended_run(self, rec: RunRecord | None) -> None:
        """A run found ended: its failure is kept for FAILED_KEPT_S (``xl_run_failure_info``)."""
        if rec is None or rec.status != RunStatus.FAILED:
            return
        labels = failure_labels(rec, rec.failure, self._host)
        if labels is not None:
            self._failed[rec.run_id] = (rec.ended_at or self.clock(), labels)

    def live_runs(self) -> list[LiveRun]:
        root = self.runs_root if self.runs_root is not None else paths.runs_dir()
        try:
            entries = [e for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")]
        except OSError:  # no runs yet (or XL_HOME unreadable): nothing to export
            entries = []
        out: list[LiveRun] = []
        names = set()
        for entry in sorted(entries, key=lambda e: e.name):
            names.add(entry.name)
            run_dir = Path(entry.path)
            try:
                mtime = os.stat(record.run_file(run_dir)).st_mtime_ns
            except OSError:
                continue
            if self._ended.get(entry.name) == mtime:
                continue
            known = self._readers.get(entry.name)
            if known is None:
                rec = record.load(run_dir)
                if rec is None or not _live(rec):
                    self._ended[entry.name] = mtime
                    self._ended_run(rec)
                    continue
                known = self._readers[entry.name] = (ExporterReader(run_dir), run_owner(run_dir))
            reader, user = known
            view = reader.poll()
            rec = view.record
            if not _live(rec):
                self._ended[entry.name] = mtime
                self._ended_run(rec)
                del self._readers[entry.name]
                continue
            out.append(LiveRun(rec, view, reader, user))
        for gone in set(self._readers) - names:
            del self._readers[gone]
        return out

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            runs = self.live_runs()
        yield from self.families(runs, self.clock())

    def families(self, runs: list[LiveRun], now: float) -> list[Metric]:
        step = GaugeMetricFamily(
            "xl_train_step",
            "The rank's last step (its optimizer steps as xl counts them, or the step it logged).",
            labels=R,
        )
        loss = GaugeMetricFamily("xl_train_loss", "The rank's loss at its last step.", labels=R)
        samples = CounterMetricFamily(
            "xl_train_samples_total",
            "Samples the rank's steps took since the run started (its batches as xl counts "
            "them, or the samples it logged).",
            labels=R,
        )
        rate = GaugeMetricFamily(
            "xl_train_samples_per_second",
            "The rank's samples per second at its last step.",
            labels=R,
        )
        last = GaugeMetricFamily(
            "xl_train_last_step_timestamp_seconds",
            "Unix time of the rank's last step.",
            labels=R,
        )
        state = StateSetMetricFamily(
            "xl_rank_state", "The rank's state as xl diagnoses it.", labels=R
        )
        util = GaugeMetricFamily(
            "xl_gpu_utilization_ratio", "The rank's GPU utilization, 0-1.", labels=G
        )
        mem = GaugeMetricFamily(
            "xl_gpu_memory_used_bytes",
            "Memory the rank's own processes hold on its GPU (NVML's per-process figure; the "
            "GPU's total used is dcgm-exporter's DCGM_FI_DEV_FB_USED).",
            labels=G,
        )
        host_mem = GaugeMetricFamily(
            _family("mem_mib"),
            "The rank's host memory: its footprint (PSS) over its process and its children.",
            labels=R,
        )
        straggler = InfoMetricFamily(
            "xl_rank_straggler",
            "A rank named the straggler, while it is: where it loses its time (phase), why its "
            "GPU holds it back (gpu_reason, gpu_detail; empty: nothing on its GPU) and whether "
            "it is chronic or transient (lasting).",
            labels=R,
        )
        rank_info = InfoMetricFamily(
            "xl_rank", "A rank of a live run: its GPU and process.", labels=R
        )
        run_info = InfoMetricFamily("xl_run", "A live run.", labels=("run_id",))
        reporting = GaugeMetricFamily(
            "xl_ranks_reporting",
            f"Ranks of the run whose figures arrived in the last {REPORTING_S:.0f} s.",
            labels=("run_id",),
        )
        # Where the rank's steps' time goes (xl.figures names each; the latest line's per-step
        # means).
        step_s = GaugeMetricFamily(
            _family("step_s"),
            "The rank's step time, in seconds: its last logged step's (a mean over the steps its "
            "line stands for).",
            labels=R,
        )
        phase = GaugeMetricFamily(
            _family("data_s"),
            "Of the rank's step time, the seconds in each phase (data, compute, comm, other); "
            "they sum to xl_rank_step_seconds.",
            labels=(*R, "phase"),
        )
        peak = GaugeMetricFamily(
            _family("mem_peak_mib"),
            "CUDA: the rank's peak allocated memory during its last step.",
            labels=R,
        )
        failed = InfoMetricFamily(
            "xl_run_failure",
            f"A run's root cause: the rank that died first and why (kind); kept "
            f"{FAILED_KEPT_S / 60:.0f} min after the run ended.",
            labels=("run_id",),
        )
        nodes = NodeSeries(STATES)  # runs past PER_NODE_PAST ranks (docs/exporter.md)
        gpus: dict[tuple[str, int], tuple[list[str], int]] = {}  # (host, GPU) -> labels, bitmask
        for run_id, (ended, said) in sorted(self._failed.items()):
            if now - ended > FAILED_KEPT_S:
                del self._failed[run_id]
            elif all(run.record.run_id != run_id for run in runs):
                failed.add_metric([run_id], said)
        for run in runs:
            rec = run.record
            devices: dict[int | str | None, DeviceRow] = {d.index: d for d in rec.devices}
            by_rank = {r.rank: r for r in rec.ranks if r.rank is not None}
            host = rec.host or self._host
            slurm = rec.rank_env.get("SLURM_JOB_ID")
            run_info.add_metric([rec.run_id], {
                "name": _text(rec.name), "world_size": _text(rec.world_size or len(by_rank)),
                "nnodes": _text(rec.nnodes), "user": run.user, "slurm_job_id": _text(slurm),
            })
            fresh = 0
            # A culprit that was working on the CPU is `stalled`, as the app shows it, not `hung`.
            hang = run.view.hang
            hung = hang.stuck if hang is not None and hang.label == "hang" else frozenset()
            views = run.view.ranks
            big = per_node(len(views), self.per_rank)  # its nodes' series instead of its ranks'
            if big:
                nodes.add(
                    rec.run_id,
                    views,
                    {rank: _state(view, hung) for rank, view in views.items()},
                    run.reader.samples_total,
                    run.reader.last_step_t,
                    host,
                )
                fresh = sum(
                    1
                    for view in views.values()
                    if view.last_seen is not None and now - view.last_seen <= REPORTING_S
                )
            for rank, view in () if big else views.items():
                entry = by_rank.get(rank) or RankRow(rank)
                labels = [
                    rec.run_id,
                    str(rank),
                    _text(entry.local_rank),
                    _text(view.host or entry.host or host),
                ]
                device = devices.get(view.gpu if isinstance(view.gpu, int) else entry.gpu)
                gpu = _text(
                    device.index
                    if device is not None
                    else view.gpu
                    if isinstance(view.gpu, int)
                    else None
                )
                uuid = _text(entry.gpu_uuid or (device.uuid if device is not None else None))
                model = device.name if device is not None else None
                where = [gpu, uuid, self._bus(uuid), f"nvidia{gpu}" if gpu else "", _text(model)]
                rank_info.add_metric(
                    labels, {**dict(zip(GPU, where, strict=True)), "pid": _text(view.pid)}
                )
                named = run.reader.straggling.get(rank)
                if named is not None and view.state == "straggler":
                    straggler.add_metric(labels, named)
                if view.mem_mib is not None:
                    host_mem.add_metric(labels, view.mem_mib * MIB)
                seen = run.reader.clock_reasons.get(rank)
                if seen is not None and gpu and seen[0] == int(gpu):
                    gpus[(labels[3], seen[0])] = ([labels[3], *where], seen[1])
                state.add_metric(labels, {s: s == _state(view, hung) for s in STATES})
                if view.step is not None:
                    step.add_metric(labels, view.step)
                if view.loss is not None:
                    loss.add_metric(labels, view.loss)
                if rank in run.reader.samples_total:
                    samples.add_metric(labels, run.reader.samples_total[rank])
                if view.samples_per_s is not None:
                    rate.add_metric(labels, view.samples_per_s)
                if rank in run.reader.last_step_t:
                    last.add_metric(labels, run.reader.last_step_t[rank])
                if view.step_s is not None:
                    step_s.add_metric(labels, view.step_s)
                for name, seconds in (view.split or {}).items():
                    phase.add_metric([*labels, name.removesuffix("_s")], seconds)
                if view.mem_peak_mib is not None:
                    peak.add_metric(labels, view.mem_peak_mib * MIB)
                if view.last_seen is not None and now - view.last_seen <= REPORTING_S:
                    fresh += 1
                if self.gpus and gpu:
                    if view.gpu_util is not None:
                        util.add_metric([*labels, *where], view.gpu_util / 100.0)
                    if view.gpu_proc_mem_mib is not None:
                        mem.add_metric([*labels, *where], view.gpu_proc_mem_mib * MIB)
            reporting.add_metric([rec.run_id], fresh)
            why = failure_labels(rec, run.view.failure, self._host)
            if why is not None:
                failed.add_metric([rec.run_id], why)
        out: list[Metric] = [
            step,
            loss,
            samples,
            rate,
            last,
            step_s,
            phase,
            peak,
            host_mem,
            state,
            straggler,
            rank_info,
            run_info,
            reporting,
            failed,
        ]
        if self.gpus:
            out += [util, mem, *clock_families(gpus)]
        return out + (nodes.families() if nodes.nodes else [])
