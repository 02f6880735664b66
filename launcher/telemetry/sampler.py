"""The 1 Hz sampler: per rank, its GPU (NVML) and its process tree (/proc) -> ``sys`` lines.

Ranks that never call ``xl.log`` still get these. A rank's GPU is found from NVML's process
list first (the rank's pid or one of its children holds a context there); failing that, from
the GPU the launcher assigned (``RankInfo.gpu``), and failing that from the rank's own
LOCAL_RANK and CUDA_VISIBLE_DEVICES (read from /proc/<pid>/environ).

A rank's memory (docs/contracts.md, ``sys`` lines): ``mem_mib`` its footprint, PSS over its
process and its children without xl's relay; ``rss_mib`` its own process's RSS;
``gpu_proc_mem_mib`` what its processes hold on its GPU; ``gpu_mem_used_mib`` the whole GPU's.
Where the run has a cgroup with the memory controller (xl.cgroup), ``cgroup_mem_mib`` is what the
kernel counts for every process of the run on this node together, and ``cgroup_mem_limit_mib``
its ``--memory-limit``: the same on each of the node's ranks' lines.

What holds the rank's GPU back (docs/contracts.md, ``sys`` lines: ``clock_event_reasons``,
``sm_clock_mhz`` ... ``xid_t``) comes from xl.gpu.clocks, which reads each GPU at most once a
second however many ranks share it; a figure NVML does not give is left out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xl import cgroup as xl_cgroup
from xl.gpu import nvml
from xl.launcher.rank.relay import RELAY_NAME
from xl.launcher.telemetry.roster import RankInfo
from xl.procfs import cpu_rss, descendants, process_tree, pss, read_comm, read_environ

MIB = 1024 * 1024

# A process's last reading: (its start, which tells a reused PID; CPU seconds; monotonic time).
_Reading = tuple[int, float, float]

# PSS costs the kernel a walk of the process's page tables (~8 ms of CPU for 500 MiB resident,
# so seconds a second for eight ranks of 10 GiB): each process's is read again only once its
# last read's cost, times the processes sampled, is under _PSS_SHARE of the time since, and never
# more often than every _PSS_MIN_S. In between a process's PSS moves with its RSS (a page it
# gains or frees is its own, in both).
_PSS_SHARE = 0.02  # of one core, every process's reads together
_PSS_MIN_S = 1.0
_PSS_MAX_S = 60.0


@dataclass
class _Pss:
    start: int  # the process's start: a reused PID reads afresh
    pss: int
    rss: int  # its RSS when ``pss`` was read
    due: float  # monotonic: when to read again


@dataclass
class _Proc:
    pid: int
    last: _Reading | None = None
    children: dict[int, _Reading] = field(default_factory=dict)
    relays: set[int] = field(default_factory=set)
    env: dict[str, str] | None = None


def _read(pid: int, last: _Reading | None) -> tuple[_Reading, int, float] | None:
    """(this reading, resident bytes, CPU % since ``last``: 0.0 on the first), None when gone.
    The percent is of one core, as psutil's cpu_percent gives it (a process on 3 cores: 300)."""
    figures = cpu_rss(pid)
    if figures is None:
        return None
    start, cpu, rss = figures
    now = time.monotonic()
    pct = 0.0
    if last is not None and last[0] == start and now > last[2]:
        pct = max(0.0, (cpu - last[1]) / (now - last[2]) * 100)
    return (start, cpu, now), rss, pct


def _nvml_inventory() -> Any:
    # nvml loads the driver library on the first call, not on import: CPU runs pay nothing.
    return nvml.inventory(processes=True)


def _nvml_clocks() -> Callable[[Sequence[int]], Mapping[int, Any]]:
    from xl.gpu.clocks import ClockReader  # noqa: PLC0415 - GPU runs only: not every supervisor's start

    return ClockReader().read


def _read_environ(pid: int) -> dict[str, str]:
    return read_environ(pid)


class Sampler:
    def __init__(
        self,
        inventory: Callable[[], Any] | bool | None = True,
        clocks: Callable[[Sequence[int]], Mapping[int, Any]] | None = None,
        cgroup: str | None = None,
    ) -> None:
        """``inventory``: True for NVML's (its clocks too), a callable for a fake one (tests;
        ``clocks`` then gives each GPU index's xl.gpu.clocks.Clocks), None/False for none.
        ``cgroup``: the run's on this node (run.json's), for its memory."""
        self._clocks = clocks
        self._cgroup = cgroup
        self._real_nvml = inventory is True
        if inventory is True:
            self._inventory: Callable[[], Any] | None = _nvml_inventory
        else:
            self._inventory = inventory or None
        self._procs: dict[int, _Proc] = {}
        self._pss: dict[int, _Pss] = {}
        self._pss_seen: set[int] = set()  # the processes whose footprint this pass asked for
        self.nvml_error: str | None = None

    def _proc(self, pid: int) -> _Proc:
        entry = self._procs.get(pid)
        if entry is None:
            entry = self._procs[pid] = _Proc(pid)
        return entry

    def _process_figures(self, entry: _Proc, tree: dict[int, list[int]]) -> dict[str, Any] | None:
        """None when the rank's process is gone (or its PID now belongs to another process).

        ``rss_mib`` is the rank process's own resident memory; ``mem_mib`` its footprint: PSS
        summed over it and its children (DataLoader workers share the pages they were forked
        with: RSS would count those once per worker), xl's output relay left out. ``cpu_pct``
        and ``nproc`` count every process under the rank."""
        own = _read(entry.pid, entry.last)
        if own is None or (entry.last is not None and own[0][0] != entry.last[0]):
            return None
        entry.last, rss, cpu = own
        footprint = self._footprint(entry.pid, entry.last[0], rss)
        alive: dict[int, _Reading] = {}
        entry.relays = set()
        for pid in descendants(entry.pid, tree):
            child = _read(pid, entry.children.get(pid))
            if child is None:
                continue  # ended since the scan
            alive[pid], child_rss, child_cpu = child
            cpu += child_cpu
            if read_comm(pid) == RELAY_NAME:
                entry.relays.add(pid)  # xl's, not the rank's: its pages are not the rank's memory
                continue
            child_pss = self._footprint(pid, alive[pid][0], child_rss)
            if footprint is not None and child_pss is not None:
                footprint += child_pss
        entry.children = alive
        figures: dict[str, Any] = {
            "rss_mib": round(rss / MIB, 1),
            "cpu_pct": round(cpu, 1),
            "nproc": 1 + len(alive),
        }
        if footprint is not None:
            figures["mem_mib"] = round(footprint / MIB, 1)
        return figures

    def _footprint(self, pid: int, start: int, rss: int) -> int | None:
        """The process's PSS in bytes: read (see _PSS_SHARE), or the last read moved by its RSS
        since; None when it cannot be read."""
        self._pss_seen.add(pid)
        now = time.monotonic()
        last = self._pss.get(pid)
        if last is not None and last.start == start and now < last.due:
            return max(0, last.pss + rss - last.rss)
        began = time.thread_time()  # the read's CPU, the kernel's walk included
        value = pss(pid)
        cost = time.thread_time() - began
        if value is None:
            self._pss.pop(pid, None)
            return None
        wait = min(_PSS_MAX_S, max(_PSS_MIN_S, cost * max(1, len(self._pss)) / _PSS_SHARE))
        self._pss[pid] = _Pss(start, value, rss, now + wait)
        return value

    # edge: the sys lines it makes are metrics.jsonl's, written and sent as they are
    def sample(
        self, ranks: Sequence[RankInfo], cuda: Mapping[int, Mapping[str, float]] | None = None
    ) -> tuple[list[dict[str, Any]], list[int]]:
        """One pass: a ``sys`` record per rank with a live pid, and the ranks found dead."""
        now = time.time()
        gpus: tuple[Any, ...] = ()
        if self._inventory is not None and ranks:
            try:
                inv = self._inventory()
                gpus = tuple(getattr(inv, "gpus", ()) or ())
                self.nvml_error = getattr(getattr(inv, "driver", None), "error", None)
            except Exception as exc:  # an NVML error degrades to "no GPU figures"
                self.nvml_error = str(exc)
                gpus = ()
        by_pid: dict[int, list[tuple[Any, Any]]] = {}
        for gpu in gpus:
            for gp in getattr(gpu, "processes", ()) or ():
                by_pid.setdefault(gp.pid, []).append((gpu, gp))
        records: list[dict[str, Any]] = []
        dead: list[int] = []
        live_pids: set[int] = set()
        tree = process_tree() if ranks else {}  # one scan of /proc for every rank's children
        node = self._cgroup_figures() if ranks else {}
        for info in ranks:
            rank, pid = info.rank, info.pid
            if pid is None:
                continue
            entry = self._proc(pid)
            figures = self._process_figures(entry, tree)
            if figures is None:
                dead.append(rank)
                self._procs.pop(pid, None)
                continue
            live_pids.add(pid)
            rec: dict[str, Any] = {"t": round(now, 3), "rank": rank, "kind": "sys", "pid": pid}
            rec.update(figures)
            rec.update(node)
            if gpus:
                self._gpu_figures(rec, info, entry, gpus, by_pid)
            counters = (cuda or {}).get(rank)
            if counters:
                for key, value in counters.items():
                    if isinstance(value, (int, float)):
                        rec[key] = value
            records.append(rec)
        if gpus:
            self._clock_figures(records)
        for pid in list(self._procs):
            if pid not in live_pids:
                del self._procs[pid]
        for pid in set(self._pss) - self._pss_seen:
            del self._pss[pid]
        self._pss_seen = set()
        return records, dead

    def _cgroup_figures(self) -> dict[str, float]:
        """The run's cgroup's memory on this node: read once a pass, for every rank's line."""
        used = xl_cgroup.memory(self._cgroup) if self._cgroup else None
        out: dict[str, float] = {}
        for key, name in (("current", "cgroup_mem_mib"), ("limit", "cgroup_mem_limit_mib")):
            value = used.get(key) if used else None
            if value is not None:
                out[name] = round(value / MIB, 1)
        return out

    def _clock_figures(self, records: list[dict[str, Any]]) -> None:
        """Each record's GPU's clocks, power, ECC and XID: one read per GPU, not per rank."""
        if self._clocks is None and self._real_nvml:
            self._clocks = _nvml_clocks()
        indices = sorted({r["gpu"] for r in records if isinstance(r.get("gpu"), int)})
        if self._clocks is None or not indices:
            return
        try:
            read = self._clocks(indices)
        except Exception:  # an NVML error: the lines go out without these figures
            return
        for rec in records:
            got = read.get(rec.get("gpu"))  # type: ignore[arg-type]
            if got is not None:
                rec.update(got.to_fields())

    def _gpu_figures(
        self,
        rec: dict[str, Any],
        info: RankInfo,
        entry: _Proc,
        gpus: tuple[Any, ...],
        by_pid: Mapping[int, list[tuple[Any, Any]]],
    ) -> None:
        """The rank's GPU's figures (``gpu_mem_used_mib``: the whole GPU's, every process on it)
        and ``gpu_proc_mem_mib``: what the rank's own processes hold on that GPU, by NVML's
        per-process list (absent where the list names none of them, or gives no figure)."""
        mine = [pid for pid in (entry.pid, *entry.children) if pid not in entry.relays]
        held = [pair for pid in mine for pair in by_pid.get(pid, ())]
        gpu = held[0][0] if held else self._assigned_gpu(info, entry, gpus)
        if gpu is None:
            return
        rec["gpu"] = gpu.index
        rec["gpu_util"] = gpu.util_gpu
        rec["gpu_mem_used_mib"] = gpu.memory_used_mib
        rec["gpu_mem_total_mib"] = gpu.memory_total_mib
        figures = [
            gp.used_mib for g, gp in held if g is gpu and isinstance(gp.used_mib, (int, float))
        ]
        if figures:
            rec["gpu_proc_mem_mib"] = round(float(sum(figures)), 1)

    def _assigned_gpu(self, info: RankInfo, entry: _Proc, gpus: tuple[Any, ...]) -> Any:
        assigned = info.gpu
        for gpu in gpus:
            if assigned is not None and assigned in (gpu.index, gpu.uuid):
                return gpu
        if entry.env is None:
            entry.env = _read_environ(entry.pid)
        env = entry.env
        try:
            local = int(env.get("LOCAL_RANK", "" if info.local_rank is None else info.local_rank))
        except (TypeError, ValueError):
            return None
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return gpus[local] if 0 <= local < len(gpus) else None
        from xl.gpu.devices import resolve_visible_devices  # noqa: PLC0415 - GPU runs only: not every supervisor's start

        try:
            devices = resolve_visible_devices(gpus, env).devices
        except Exception:
            devices = ()
            for token in (t.strip() for t in visible.split(",") if t.strip()):
                match = next(
                    (g for g in gpus if str(g.index) == token or g.uuid.startswith(token)), None
                )
                if match is None:
                    break
                devices += (match,)
        return devices[local] if 0 <= local < len(devices) else None
