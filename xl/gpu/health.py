"""A GPU's own health, from NVML: its compute mode, uncorrectable ECC errors, rows waiting to be
remapped and pages waiting to be retired; and the one judgement of a GPU that `xl doctor` (the
`gpus` check) and `xl launch` (before it starts) both make from it and from the processes on it.

Read on demand, not in the 1 Hz sweep: these counters change only when something goes wrong.
A value the GPU does not report (GeForce cards have no ECC; row remapping is Ampere and later,
page retirement before it) is None and judged as nothing to say.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xl.gpu.inventory import GPU, GPUProcess
from xl.gpu.nvml import per_gpu

# nvmlComputeMode_t (nvml.h)
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
_UNCORRECTED, _VOLATILE, _AGGREGATE = 1, 0, 1  # nvmlMemoryErrorType_t, nvmlEccCounterType_t
_DOUBLE_BIT, _SINGLE_BIT = 1, 0  # nvmlPageRetirementCause_t

# A GPU this busy is flagged before a launch on it: the app's GPU picker uses the same figures.
BUSY_UTIL_PCT = 20
BUSY_MEM_FRACTION = 0.10


@dataclass(frozen=True)
class Health:
    index: int
    compute_mode: str | None = None  # default | exclusive_process | prohibited | exclusive_thread
    ecc_uncorrected: int | None = None  # since the driver loaded (volatile)
    ecc_uncorrected_total: int | None = None  # over the GPU's life (aggregate)
    remapped_rows: int | None = None  # rows remapped so far (correctable + uncorrectable)
    remap_pending: bool | None = None  # a remap waits for a GPU reset
    remap_failed: bool | None = None  # a remap failed: no spare rows left
    retired_pages: int | None = None  # pages retired so far (single + double bit)
    retired_pending: bool | None = None  # a retirement waits for a GPU reset

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


def _read(query: Callable[..., Any], handle: object, index: int) -> Health:
    import pynvml  # noqa: PLC0415 - per_gpu has loaded it already; `import xl.gpu.health` stays free

    mode = query(pynvml.nvmlDeviceGetComputeMode, handle)
    vol = query(pynvml.nvmlDeviceGetTotalEccErrors, handle, _UNCORRECTED, _VOLATILE)
    agg = query(pynvml.nvmlDeviceGetTotalEccErrors, handle, _UNCORRECTED, _AGGREGATE)
    rows = query(pynvml.nvmlDeviceGetRemappedRows, handle)
    sbe = query(pynvml.nvmlDeviceGetRetiredPages, handle, _SINGLE_BIT)
    dbe = query(pynvml.nvmlDeviceGetRetiredPages, handle, _DOUBLE_BIT)
    pending = query(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    return Health(
        index=index,
        compute_mode=COMPUTE_MODES.get(mode, str(mode)) if mode is not None else None,
        ecc_uncorrected=vol,
        ecc_uncorrected_total=agg,
        remapped_rows=rows[0] + rows[1] if rows is not None else None,
        remap_pending=bool(rows[2]) if rows is not None else None,
        remap_failed=bool(rows[3]) if rows is not None else None,
        retired_pages=len(sbe) + len(dbe) if sbe is not None and dbe is not None else None,
        retired_pending=bool(pending) if pending is not None else None,
    )


def health(indices: Sequence[int]) -> dict[int, Health]:
    """The health of these GPUs (nvidia-smi indices); a GPU NVML can't read is left out."""
    return per_gpu(_read, indices)


# --------------------------------------------------------------------------- the judgement


@dataclass(frozen=True)
class Problem:
    status: str  # fail: a run on it fails or corrupts; warn: it runs, shared or slower
    detail: str  # one clause, naming the GPU
    fix: str  # a command


def _who(p: GPUProcess) -> str:
    name = f" ({p.name})" if p.name else " (not visible from here)"
    mib = f", {p.used_mib / 1024:.1f} GiB" if p.used_mib else ""
    run = f", xl run {p.run_id}" if p.run_id else ""
    return f"pid {p.pid}{name}{mib}{run}"


def _theirs(pid: int) -> bool:
    """Whether the process belongs to another user (or can't be seen): `kill` needs sudo."""
    try:
        return os.stat(f"/proc/{pid}").st_uid != os.getuid()
    except OSError:
        return True


def _free_them(procs: Sequence[GPUProcess]) -> str:
    """The command that frees a GPU of these processes: `xl stop` for xl's own runs, `kill`
    for the rest (`sudo kill` for another user's, or one not visible from here)."""
    runs = sorted({p.run_id for p in procs if p.run_id})
    pids = [p.pid for p in procs if not p.run_id]
    sudo = "sudo " if any(_theirs(pid) for pid in pids) else ""
    parts = [f"xl stop {r}" for r in runs] + (
        [f"{sudo}kill {' '.join(map(str, pids))}"] if pids else []
    )
    return " && ".join(parts)


def judge(g: GPU, h: Health | None, others: Sequence[int] = ()) -> list[Problem]:
    """What stands between this GPU and a training run, worst first. `others` are the indices a
    run could use instead (for "leave it out" fixes)."""
    i = g.index
    rest = ",".join(str(o) for o in others if o != i)
    leave_out = f"leave GPU {i} out: xl launch --gpus {rest} ..." if rest else ""
    procs = [p for p in g.processes or ()]
    out: list[Problem] = []
    mode = h.compute_mode if h is not None else None
    if mode == "prohibited":
        out.append(
            Problem(
                "fail",
                f"GPU {i} is in compute mode Prohibited: no CUDA context can be made on it",
                f"sudo nvidia-smi -i {i} -c DEFAULT",
            )
        )
    if mode in ("exclusive_process", "exclusive_thread") and procs:
        out.append(
            Problem(
                "fail",
                f"GPU {i} is in exclusive-process mode and held by "
                f"{', '.join(_who(p) for p in procs)}: "
                'a rank on it fails with "CUDA-capable device(s) is/are busy or unavailable"'
                + (f" (or {leave_out})" if leave_out else ""),
                _free_them(procs),
            )
        )
    if h is not None:
        reset = f"sudo nvidia-smi -r -i {i}"
        if procs:
            reset = f"{_free_them(procs)} && {reset}"  # a reset needs the GPU idle
        if h.ecc_uncorrected:
            out.append(
                Problem(
                    "fail",
                    f"GPU {i} has {h.ecc_uncorrected} uncorrectable ECC error(s) since the driver "
                    "loaded: its memory can't be trusted until a reset (or a reboot)",
                    reset,
                )
            )
        if h.remap_failed:
            out.append(
                Problem(
                    "fail",
                    f"GPU {i} failed to remap a memory row (no spare rows left): it needs "
                    "replacing; "
                    + (
                        "until then, leave it out"
                        if rest
                        else "until then, with no other GPU here, train on the CPU"
                    ),
                    f"xl launch --gpus {rest} ..." if rest else "export CUDA_VISIBLE_DEVICES=",
                )
            )
        elif h.remap_pending:
            out.append(
                Problem(
                    "fail",
                    f"GPU {i} has a memory row remap pending: until a reset (or a reboot), the "
                    "bad row is still in use",
                    reset,
                )
            )
        if h.retired_pending:
            out.append(
                Problem(
                    "fail",
                    f"GPU {i} has a page retirement pending: until a reset (or a reboot), the "
                    "bad page is still in use",
                    reset,
                )
            )
    if procs and mode not in ("exclusive_process", "exclusive_thread"):
        out.append(
            Problem(
                "warn",
                f"GPU {i} is in use by {', '.join(_who(p) for p in procs)}: ranks will share its "
                "memory and time" + (f" (or {leave_out})" if leave_out else ""),
                _free_them(procs),
            )
        )
    return out


def healthy(gpus: Sequence[GPU], by_gpu: dict[int, Health]) -> list[int]:
    """The GPUs with nothing to say against them."""
    return [g.index for g in gpus if not g.lost and not judge(g, by_gpu.get(g.index))]


def judge_all(
    gpus: Sequence[GPU], by_gpu: dict[int, Health], among: Sequence[int] | None = None
) -> dict[int, list[Problem]]:
    """Every GPU's problems; a "leave it out" fix names only GPUs with none (of `among`, when
    given: the one model a run should keep to, say)."""
    usable = [g for g in gpus if not g.lost]
    good = [i for i in healthy(usable, by_gpu) if among is None or i in among]
    return {g.index: judge(g, by_gpu.get(g.index), good) for g in usable}


def busy(g: GPU) -> str | None:
    """Why a launch should think twice about this GPU (utilization or memory taken), or None."""
    used, total = g.memory_used_mib or 0.0, g.memory_total_mib or 0.0
    what = []
    if (g.util_gpu or 0) >= BUSY_UTIL_PCT:
        what.append(f"{g.util_gpu}% busy")
    if total > 0 and used / total >= BUSY_MEM_FRACTION:
        what.append(f"{used / 1024:.1f} GiB of its memory used")
    return f"GPU {g.index} is {' and '.join(what)}" if what else None
