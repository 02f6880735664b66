"""The machine around the toolkit: shared memory, network and InfiniBand devices, the
environment as text, and the NVML inventory."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from xl.doctor.probes.files import listdir
from xl.doctor.probes.kernel import at

if TYPE_CHECKING:
    from xl.gpu.health import Health
    from xl.gpu.nvml import Inventory


def shm_size(path: str = "/dev/shm") -> tuple[int | None, int | None, str | None]:
    """(total bytes, free bytes, problem) of the shared-memory mount NCCL and DataLoader use."""
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return None, None, f"{path}: {exc.strerror or exc}"
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, None


def container_kind() -> str | None:
    """docker | podman when this process runs in a container (the runtime's marker file)."""
    for marker, kind in (("/.dockerenv", "docker"), ("/run/.containerenv", "podman")):
        if os.path.exists(at(marker)):
            return kind
    return None


def net_interfaces() -> list[str]:
    """The network interfaces NCCL_SOCKET_IFNAME may name (empty when /sys can't be read)."""
    return listdir("/sys/class/net")


def infiniband_devices() -> list[str]:
    return listdir(at("/sys/class/infiniband"))


# nvmlGpuFabricState_t, as the `cuda_init` check names them.
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


def probe_inventory() -> tuple[Inventory, dict[int, Health], dict[int, tuple[str, str | None]]]:
    """The driver, its GPUs with the processes on them, each GPU's health (compute mode, ECC,
    row remapping, page retirement): what the `gpus` check judges; and each GPU's NVSwitch
    fabric state, what the `cuda_init` check judges."""
    from xl.gpu import health, nvml  # noqa: PLC0415 - loads on the NVML probe's thread, overlapping the subprocesses

    inv = nvml.inventory(processes=True)
    ok = [g.index for g in inv.gpus if not g.lost]
    if not ok or inv.driver.error:
        return inv, {}, {}
    return inv, health.health(ok), fabric(ok)


def _fabric_info(pynvml: Any, handle: Any) -> Any | None:
    """One GPU's fabric info from the first of NVML's calls that answers: the versioned
    nvmlDeviceGetGpuFabricInfoV (v3, then v2: a driver refuses a version it does not know) and
    the original nvmlDeviceGetGpuFabricInfo, which newer drivers may no longer answer; None when
    none does (NOT_SUPPORTED on a GPU with no NVSwitch fabric, or a driver without them)."""
    import ctypes  # noqa: PLC0415 - only with GPUs

    tries = [
        (getattr(pynvml, "nvmlDeviceGetGpuFabricInfoV", None), name)
        for name in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t")
    ]
    tries.append((getattr(pynvml, "nvmlDeviceGetGpuFabricInfo", None), "c_nvmlGpuFabricInfo_t"))
    for call, struct in tries:
        kind = getattr(pynvml, struct, None)
        if call is None or kind is None:
            continue
        try:
            info = kind()
            call(handle, ctypes.byref(info))
        except Exception:
            continue  # NOT_SUPPORTED, a version the driver refuses, FunctionNotFound
        return info
    return None


def fabric(indices: list[int]) -> dict[int, tuple[str, str | None]]:
    """{GPU: (fabric state, its status when not success)} for the GPUs on an NVSwitch fabric
    (HGX/DGX Hopper and later); others are left out (NVML says NOT_SUPPORTED, or the driver
    predates the calls)."""
    import pynvml  # noqa: PLC0415 - NVML is loaded already (the inventory); `import xl` stays free

    out: dict[int, tuple[str, str | None]] = {}
    for i in indices:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        except Exception:
            continue
        info = _fabric_info(pynvml, handle)
        if info is None:
            continue
        # nvml.h's nvmlGpuFabricState_t is one byte; the bindings read four, so the padding
        # after it (which NVML does not clear) is masked off.
        code = int(info.state) & 0xFF
        state = FABRIC_STATES.get(code, str(code))
        if state == "not_supported":
            continue
        status = None
        if state == "completed" and int(info.status) != 0:
            try:
                status = pynvml.nvmlErrorString(int(info.status))
            except Exception:
                status = f"NVML error {int(info.status)}"
            status = status.decode() if isinstance(status, bytes) else str(status)
        out[i] = (state, status)
    return out


# cuInit in a child: the CUresult it returns ("nolib" without a libcuda.so.1). Its own
# interpreter (-I -S: nothing of the user's site) keeps a hang or a crash of the driver's
# user-space library out of the doctor.
_CUINIT = (
    "import ctypes\n"
    "try:\n    lib = ctypes.CDLL('libcuda.so.1')\n"
    "except OSError:\n    print('nolib')\n"
    "else:\n    print(int(lib.cuInit(0)))\n"
)


def probe_cuinit(python: str) -> tuple[int | None, str | None]:
    """(CUresult of cuInit(0), None), or (None, why there is none), from a subprocess with a
    timeout: the CUDA driver's own verdict (802: system not ready, e.g. Fabric Manager not
    running; 803: libcuda and the kernel module disagree)."""
    from xl.doctor.probes.commands import run_cmd  # noqa: PLC0415 - only with GPUs

    run = run_cmd([python, "-I", "-S", "-c", _CUINIT], label="cuInit probe")
    out = run.stdout.strip()
    if not run.ok:
        return None, run.problem
    if out == "nolib":
        return None, "no libcuda.so.1 the loader finds"
    try:
        return int(out.splitlines()[-1]), None
    except (ValueError, IndexError):
        return None, f"the cuInit probe printed {run.first_line()!r}"


def env_snapshot() -> dict[str, str]:
    """The environment as text: bytes that aren't UTF-8 become U+FFFD instead of breaking output."""
    try:
        return {
            k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
            for k, v in os.environb.items()
        }
    except AttributeError:  # pragma: no cover - platforms without environb
        return dict(os.environ)
