"""System: shared memory for NCCL and DataLoader workers, and NCCL_* settings known to hang,
slow down or break training."""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

from xl.doctor.checks.derived import python_of, torch_cuda, torch_label, working_gpus
from xl.doctor.checks.finding import Finding, fail, ok, skip, warn
from xl.doctor.checks.ldpath import ld_fix
from xl.doctor.checks.loaded import unknown_nccl_on_path
from xl.doctor.checks.ncclnet import ib_hca, net_plugin
from xl.doctor.checks.upgrade import driver_upgrade
from xl.doctor.facts import Facts, vtuple
from xl.doctor.report import Fix

MIB = 1024 * 1024
SHM_MIN = 512 * MIB

_DATACENTER = re.compile(r"\b(A100|H100|H200|B200|A800|H800|V100)\b")


def _size(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / MIB:.0f} MiB"


def grow_shm_fix(container: str | None, shm_path: str) -> Fix:
    """How to give shared memory more room: in a container (``container``: its kind), its start
    options; elsewhere a remount of the mount at ``shm_path``."""
    if container:
        return Fix(
            f"{'podman' if container == 'podman' else 'docker'} run --shm-size=16g ...",
            "the container started again with more shared memory (--ipc=host shares the "
            "host's; Kubernetes: an emptyDir with medium: Memory at /dev/shm)",
        )
    return Fix(f"sudo mount -o remount,size=16G {shm_path}")


def check_shm(f: Facts) -> Finding:
    if f.shm_total is None:
        return warn(
            f"can't read the shared memory mount: {f.shm_problem}",
            fix=Fix(
                "sudo mount -t tmpfs -o size=16G tmpfs /dev/shm",
                "in a container: docker run --shm-size=16g (or --ipc=host)",
            ),
        )
    stale = [s for s in f.shm_segments if s.stale]
    data: dict[str, Any] = {
        "total_bytes": f.shm_total,
        "free_bytes": f.shm_free,
        "stale": [{"path": s.path, "bytes": s.size} for s in stale],
    }
    detail = f"{f.shm_path}: {_size(f.shm_total)} (free {_size(f.shm_free or 0)})"
    if f.shm_total < SHM_MIN:
        return warn(
            f"{detail}: under 512 MiB, NCCL and DataLoader workers fail with bus errors",
            fix=grow_shm_fix(f.container, f.shm_path),
            data=data,
        )
    held = sum(s.size for s in stale)
    names = ", ".join(os.path.basename(s.path) for s in stale[:5]) + (
        f" and {len(stale) - 5} more" if len(stale) > 5 else ""
    )
    remove = "rm -f " + " ".join(shlex.quote(s.path) for s in stale)
    if (f.shm_free or 0) < SHM_MIN:
        left = (
            f" {len(stale)} stale NCCL/torch segment(s) of dead jobs hold {_size(held)} ({names})"
            if stale
            else ""
        )
        return warn(
            f'{detail}: under 512 MiB free, NCCL fails to set up ("unhandled system error", bus '
            f"errors);{left or ' no stale NCCL/torch segments to blame'}",
            fix=remove
            if stale and (f.shm_free or 0) + held >= SHM_MIN
            else grow_shm_fix(f.container, f.shm_path),
            data=data,
        )
    if stale:
        return warn(
            f"{detail}; {len(stale)} stale NCCL/torch segment(s) left by dead jobs hold "
            f"{_size(held)} of memory ({names})",
            fix=remove,
            data=data,
        )
    return ok(detail, data=data)


def _socket_ifname_trap(f: Facts) -> tuple[str, str] | None:
    """NCCL_SOCKET_IFNAME that selects no interface here (prefixes, `=` exact, `^` exclude)."""
    ifname = f.env.get("NCCL_SOCKET_IFNAME")
    if not ifname or f.net_ifaces is None:
        return None
    spec = ifname.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    names = [n for n in spec.lstrip("=").split(",") if n]
    hit = [i for i in f.net_ifaces if any((i == n) if exact else i.startswith(n) for n in names)]
    if exclude or hit:
        return None
    real = sorted(i for i in f.net_ifaces if i != "lo")
    return (
        f"NCCL_SOCKET_IFNAME={ifname} matches no interface here "
        f"({', '.join(sorted(f.net_ifaces))}): "
        'NCCL stops at init with "no socket interface found"',
        f"export NCCL_SOCKET_IFNAME={real[0]}" if real else "unset NCCL_SOCKET_IFNAME",
    )


def _fatal_nccl(f: Facts) -> list[tuple[str, str]]:
    """(what is wrong, its fix) for each NCCL setting with which NCCL cannot work at all."""
    out: list[tuple[str, str]] = []
    net = (f.env.get("NCCL_NET") or "").strip()
    if net.upper() == "IB" and f.ib_devices is not None and not f.ib_devices:
        out.append(
            (
                "NCCL_NET=IB but this machine has no InfiniBand device (/sys/class/infiniband is "
                "empty): "
                'NCCL stops at init ("Failed to initialize any NET plugin"); unset, NCCL takes '
                "InfiniBand when there is some, sockets otherwise",
                "unset NCCL_NET",
            )
        )
    ifname_trap = _socket_ifname_trap(f)
    if ifname_trap is not None:
        out.append(ifname_trap)
    wrong = _foreign_nccl_wheel(f)
    if wrong is not None:
        out.append(wrong)
    hca = ib_hca(f)
    if hca is not None and hca[2]:
        out.append((hca[0], hca[1]))
    return out


def _foreign_nccl_wheel(f: Facts) -> tuple[str, str] | None:
    """An nvidia-nccl wheel of another CUDA major than torch's: every nvidia-nccl-cuN wheel
    writes the same nvidia/nccl/lib/libnccl.so.2, so the last one installed is what torch loads."""
    t = f.torch
    major = vtuple(torch_cuda(f))[:1]
    if t is None or not major or not t.nccl_wheels:
        return None
    want = f"nvidia-nccl-cu{major[0]}"
    foreign = [(name, ver) for name, ver in t.nccl_wheels if name != want]
    if not foreign:
        return None
    pin = t.nccl_required[1] if t.nccl_required and t.nccl_required[0] == want else None
    pin = pin or next((ver for name, ver in t.nccl_wheels if name == want), None)
    py = python_of(f)
    names = " ".join(name for name, _ in foreign)
    spec = f"{want}=={pin}" if pin else want
    return (
        f"{', '.join(f'{n} {v}' for n, v in foreign)} is installed beside {torch_label(f)} (CUDA "
        f"{major[0]}): "
        f"it shares nvidia/nccl/lib/libnccl.so.2 with {want} and may have overwritten torch's NCCL "
        '(undefined symbols, "unhandled cuda error", hangs)',
        f"{py} -m pip uninstall -y {names} && {py} -m pip install --force-reinstall --no-deps "
        f"{spec}",
    )


def _nccl_traps(f: Facts) -> list[tuple[str, str]]:
    """(what is wrong, its fix) for each NCCL setting known to hang, slow or break training."""
    env = f.env
    gpus = working_gpus(f)
    traps: list[tuple[str, str]] = []
    consumer = [g for g in gpus if "RTX 40" in g.name]
    driver = f.driver.version if f.driver is not None and not f.driver.error else None
    datacenter = [g for g in gpus if _DATACENTER.search(g.name)]
    p2p_off = env.get("NCCL_P2P_DISABLE") == "1"
    if (
        len(consumer) > 1
        and driver
        and vtuple(driver) < (550, 40, 7)
        and not (p2p_off and env.get("NCCL_IB_DISABLE") == "1")
    ):
        traps.append(
            (
                f"{len(consumer)} RTX 40xx GPUs with driver {driver}: P2P/IB between them hangs or "
                "corrupts "
                f"(fixed from driver 550.40.07: {driver_upgrade(f, 550)})",
                "export NCCL_P2P_DISABLE=1 NCCL_IB_DISABLE=1",
            )
        )
    if p2p_off and len(datacenter) > 1:
        traps.append(
            (
                "NCCL_P2P_DISABLE=1 on NVLink-class GPUs: all GPU traffic goes through host memory",
                "unset NCCL_P2P_DISABLE",
            )
        )
    if env.get("NCCL_IB_DISABLE") == "1" and f.ib_devices:
        traps.append(
            (
                f"NCCL_IB_DISABLE=1 but InfiniBand is present ({', '.join(f.ib_devices[:2])}): "
                "multi-node traffic falls back to TCP",
                "unset NCCL_IB_DISABLE",
            )
        )
    hca = ib_hca(f)
    if hca is not None and not hca[2]:
        traps.append((hca[0], hca[1]))
    plugin = net_plugin(f)
    if plugin is not None:
        traps.append(plugin)
    if env.get("NCCL_SHM_DISABLE") == "1":
        traps.append(
            (
                "NCCL_SHM_DISABLE=1: intra-node traffic can't use shared memory",
                "unset NCCL_SHM_DISABLE",
            )
        )
    for old in ("NCCL_BLOCKING_WAIT", "NCCL_ASYNC_ERROR_HANDLING"):
        if old in env:
            traps.append(
                (
                    f"{old} is the old name; torch reads TORCH_{old} now",
                    f"export TORCH_{old}={env[old]}; unset {old}",
                )
            )
    if (env.get("NCCL_DEBUG") or "").upper() == "TRACE":
        traps.append(
            (
                "NCCL_DEBUG=TRACE logs every call and slows training (INFO while debugging)",
                "export NCCL_DEBUG=WARN",
            )
        )
    # An NCCL on LD_LIBRARY_PATH is the cuda_libraries check's: older than torch's pin fails
    # there; a newer one (the usual way to take an NCCL fix early) is fine. One whose file name
    # does not tell its version can't be compared: said, with the one LD_LIBRARY_PATH fix.
    unknown = unknown_nccl_on_path(f)
    if unknown and f.torch is not None:
        traps.append(
            (
                f"{unknown[0]}/libnccl.so.2 comes before torch's own NCCL {f.torch.nccl} and its "
                "file name does not "
                "tell its version (an older one: undefined-symbol errors, hangs)",
                ld_fix(f),
            )
        )
    return traps


def check_nccl(f: Facts) -> Finding:
    fatal = _fatal_nccl(f)
    traps = _nccl_traps(f)
    t = f.torch
    data: dict[str, Any] = {
        "version": t.nccl if t is not None else None,
        "variables": {k: v for k, v in f.env.items() if k.startswith("NCCL_")},
        "wheels": [list(w) for w in t.nccl_wheels] if t is not None else [],
    }
    if fatal:
        every = fatal + traps
        return fail("; ".join(d for d, _ in every), fix="; ".join(fx for _, fx in every), data=data)
    if traps:
        return warn("; ".join(d for d, _ in traps), fix="; ".join(fx for _, fx in traps), data=data)
    if not torch_cuda(f):
        return skip(
            "torch has no CUDA build, so no NCCL (ranks use gloo); no NCCL_* traps set", data=data
        )
    if t is not None and t.nccl:
        return ok(f"NCCL {t.nccl} ({t.nccl_from}); no NCCL_* traps set", data=data)
    return ok(
        "torch's NCCL is built in (no separate nvidia-nccl package); no NCCL_* traps set",
        data=data,
    )


def check_cgroup(f: Facts) -> Finding:
    """A run's cgroup (docs/launch.md, "A run's cgroup"): without one, a process a rank starts in
    a session of its own with a clean environment can outlive a run whose supervisor died."""
    if f.cgroup_parent is None:
        said = (
            f"runs get no cgroup here ({f.cgroup_reason}): xl follows their processes by process "
            "tree and environment, and --memory-limit cannot be used"
        )
        if "XL_CGROUP_ROOT" in (f.cgroup_reason or ""):
            return warn(said, fix="unset XL_CGROUP_ROOT")
        # Root, a delegated v2 subtree or a mounted cgroup filesystem is the machine's owner's to
        # give: no command of this user's makes one, and the warning says so instead of a fix.
        return warn(f"{said}; no command run here gives runs one", fix="")
    memory = (
        "with the memory controller (--memory-limit works)"
        if f.cgroup_memory
        else "without the memory controller (no --memory-limit)"
    )
    return ok(
        f"each run gets a cgroup of its own in {f.cgroup_parent}, {memory}",
        data={"parent": f.cgroup_parent, "memory": f.cgroup_memory},
    )
