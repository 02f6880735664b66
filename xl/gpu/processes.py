"""Who each process on a GPU is: its PID here, its name, and its rank and run (from /proc).

NVML names processes by PID, but by the PID the driver saw, which need not be this namespace's:
when the ranks run in a container (their own PID namespace) and xl looks from outside it, NVML
can report the container's PID, which here is another process or none at all. Such a PID is
looked up in every process's ``NSpid`` (its PID in each nested namespace), so the rank is still
labelled and the sampler still finds its GPU. The limit: from inside a container, host PIDs
cannot be mapped (its /proc shows no outer level); those stay as NVML gave them, unlabelled.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from xl import envnames
from xl.gpu.inventory import GPUProcess
from xl.procfs import PROC, has_open, nspid_index, read_comm, read_environ

# Every process with a CUDA context holds these open (/dev/nvidiactl, /dev/nvidia<N>, ...).
NVIDIA_DEVICES = "/dev/nvidia"


# proc root -> (the PIDs /proc listed, their nested-namespace index) as of the last scan.
_scanned: dict[str, tuple[frozenset[str], dict[int, list[int]]]] = {}


def _nested(proc: str) -> dict[int, list[int]]:
    """nspid_index(proc), scanned again only when the set of processes changed: a process's
    NSpid never changes, so the same processes give the same index. The GPUs screen and the
    sampler ask every second; one listdir is cheap, reading every status file is not."""
    try:
        names = frozenset(n for n in os.listdir(proc) if n.isdigit())
    except OSError:
        return {}
    last = _scanned.get(proc)
    if last is not None and last[0] == names:
        return last[1]
    index = nspid_index(proc)
    _scanned[proc] = (names, index)
    return index


def local_pids(pids: Iterable[int], proc: str = PROC) -> dict[int, int]:
    """NVML's PIDs -> the PIDs of those processes in this namespace.

    A PID that no process here has at an inner namespace level is taken as it is (the common
    case: no containers, or a host's view of them). One that some do: when it also exists here
    and is not known to be without a GPU (it has /dev/nvidia* open, or its descriptors are not
    ours to read), it stays; otherwise the process whose NSpid has it is taken, and when several
    containers have it, only one that holds a GPU device open; when that still leaves several or
    none, the PID stays as it is (better unlabelled than labelled wrong).
    """
    index = _nested(proc)
    out: dict[int, int] = {}
    for pid in pids:
        found = [p for p in index.get(pid, ()) if p != pid]
        if not found or (
            os.path.exists(f"{proc}/{pid}") and has_open(pid, NVIDIA_DEVICES, proc) is not False
        ):
            out[pid] = pid
            continue
        if len(found) > 1:
            found = [p for p in found if has_open(p, NVIDIA_DEVICES, proc)]
        out[pid] = found[0] if len(found) == 1 else pid
    return out


def _int_or_none(v: str | None) -> int | None:
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        return None


def identify(used: Mapping[int, float | None], proc: str = PROC) -> tuple[GPUProcess, ...]:
    """One row per process from NVML's ``{pid: used MiB}``, named and labelled from /proc."""
    if os.name != "posix":
        return tuple(GPUProcess(pid, mib, None, None, None, None) for pid, mib in used.items())
    here = local_pids(used, proc)
    rows: list[GPUProcess] = []
    for nvml_pid, mib in used.items():
        pid = here[nvml_pid]
        env = read_environ(pid, ("RANK", "LOCAL_RANK", envnames.RUN_ID), proc)
        rows.append(
            GPUProcess(
                pid=pid,
                used_mib=mib,
                name=read_comm(pid, proc),
                rank=_int_or_none(env.get("RANK")),
                local_rank=_int_or_none(env.get("LOCAL_RANK")),
                run_id=env.get(envnames.RUN_ID),
            )
        )
    return tuple(rows)
