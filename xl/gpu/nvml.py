"""GPU inventory over NVML (nvidia-ml-py), never raising.

Every NVML call goes through one choke point (``_Sweep.query``): a function the driver does not
have (FunctionNotFound, old drivers) or a value the GPU does not report (NotSupported) becomes
``None`` and the rest of the row still shows; GPU_IS_LOST marks the GPU lost; a failing nvmlInit
becomes ``Driver(error=..., error_kind=...)`` with a message a person can act on.

NVML stays initialised between calls (the TUI and the run sampler poll at 1 Hz) and the fields
that never change while the driver is loaded (name, UUID, PCI bus id, compute capability) are
cached per device. pynvml is imported lazily: ``import xl.gpu.nvml`` costs nothing.

The records live in ``xl.gpu.inventory`` (re-exported here, where callers have always found them);
who each process is, in ``xl.gpu.processes``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from xl.gpu.inventory import GPU, LOST_MESSAGE, MIB, Driver, GPUProcess, Inventory, empty_gpu
from xl.gpu.processes import identify

__all__ = [
    "GPU",
    "LOST_MESSAGE",
    "MIB",
    "Driver",
    "GPUProcess",
    "Inventory",
    "inventory",
    "per_gpu",
    "shutdown",
]

T = TypeVar("T")
R = TypeVar("R")

# nvmlReturn_t values (nvml.h); kept here so importing this module never imports pynvml.
_NO_PERMISSION = 4
_NOT_SUPPORTED = 3
_UNINITIALIZED = 1
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_LIB_RM_VERSION_MISMATCH = 18
_NO_DATA = 21
_ARGUMENT_VERSION_MISMATCH = 25
_NVML_MEMORY_V2 = 0x02000028

# "Not available" rather than a problem worth showing: the value simply is not there.
_NOT_AVAILABLE = frozenset(
    {_NOT_SUPPORTED, _FUNCTION_NOT_FOUND, _NO_DATA, _ARGUMENT_VERSION_MISMATCH}
)


# ---------------------------------------------------------------------------------------------
# The NVML session every caller in the process shares


@dataclass
class _Static:
    """What never changes while the driver stays loaded."""

    handle: Any
    uuid: str
    name: str
    pci_bus_id: str
    compute_capability: str | None


class _Session:
    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.static: dict[int, _Static] = {}
        # Features this driver lacks: learnt once, so later sweeps skip the failing call.
        self.memory_v2 = True
        self.procs_v3 = True
        self.count: int | None = None


_lock = threading.RLock()
_session: _Session | None = None


class _Lost(Exception):
    pass


class _Uninitialized(Exception):
    """Someone else in the process shut NVML down under us (pynvml refcounts globally)."""


def _nvml_code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


def _cuda_version_str(v: int | None) -> str | None:
    if not v:
        return None
    return f"{v // 1000}.{(v % 1000) // 10}"


def _init_failure(exc: BaseException) -> Driver:
    code = _nvml_code(exc)
    raw = str(exc)
    if code == _LIBRARY_NOT_FOUND:
        msg = (
            "no NVIDIA driver: libnvidia-ml.so.1 was not found, so this machine has no NVIDIA "
            "driver installed (CPU-only training still works)"
        )
        kind = "library_not_found"
    elif code == _DRIVER_NOT_LOADED:
        msg = (
            "the NVIDIA driver is installed but not loaded (NVML: Driver Not Loaded); "
            "load it with `sudo modprobe nvidia` or reboot"
        )
        kind = "driver_not_loaded"
    elif code == _LIB_RM_VERSION_MISMATCH:
        msg = (
            "NVIDIA driver/library version mismatch: the running kernel module is not the "
            "version of the installed libnvidia-ml (usually after a driver upgrade); reboot, "
            "or unload and reload the nvidia kernel modules"
        )
        kind = "version_mismatch"
    elif code == _NO_PERMISSION:
        msg = (
            "no permission to use the NVIDIA driver (NVML: Insufficient Permissions); check "
            "the permissions of /dev/nvidia* (your user may need to be in the video group)"
        )
        kind = "no_permission"
    else:
        msg = f"NVML could not be initialised: {raw}"
        kind = "other"
    return Driver(version=None, cuda_version=None, error=msg, error_kind=kind)


def _ensure_init() -> _Session | Driver:
    """The live session, or a Driver describing why NVML cannot be used. Lock held."""
    global _session
    if _session is not None:
        return _session
    if not _library_loads():
        return _init_failure(_LibraryNotFound())
    try:
        import pynvml  # noqa: PLC0415 - pynvml loads libnvidia-ml; `import xl.gpu.nvml` stays free
    except ImportError:
        return Driver(
            None,
            None,
            error="nvidia-ml-py is not installed: `pip install nvidia-ml-py` to read GPUs",
            error_kind="other",
        )
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return _init_failure(exc)
    except OSError as exc:  # a broken libnvidia-ml that dlopen rejects
        return Driver(None, None, error=f"cannot load libnvidia-ml: {exc}", error_kind="other")
    version = _plain(pynvml.nvmlSystemGetDriverVersion)
    cuda = _plain(pynvml.nvmlSystemGetCudaDriverVersion_v2)
    if cuda is None:
        cuda = _plain(pynvml.nvmlSystemGetCudaDriverVersion)
    _session = _Session(Driver(version=version, cuda_version=_cuda_version_str(cuda)))
    return _session


class _LibraryNotFound(Exception):
    """What pynvml would raise without a driver (NVML_ERROR_LIBRARY_NOT_FOUND), without pynvml."""

    value = _LIBRARY_NOT_FOUND


def _library_loads() -> bool:
    """Whether libnvidia-ml.so.1 loads, the way pynvml loads it on Linux. Without a driver the
    answer costs one failed dlopen instead of importing pynvml (~10-15 ms, a module of 5,000
    lines), on every `xl launch` of a machine without GPUs. Elsewhere pynvml decides."""
    if not sys.platform.startswith("linux"):
        return True
    loaded = sys.modules.get("pynvml")
    if loaded is not None and getattr(loaded, "nvmlLib", None) is not None:
        # pynvml has its library already (a simulated driver in tests loads one by path)
        return True
    import ctypes  # noqa: PLC0415 - only when NVML is first needed

    try:
        ctypes.CDLL("libnvidia-ml.so.1")  # stays loaded: pynvml's own dlopen then finds it
    except OSError:
        return False
    return True


def _plain(fn: Callable[..., T], *args: Any) -> T | None:
    """A call whose failure just means "not available" (used outside a GPU row)."""
    try:
        return fn(*args)
    except Exception:
        return None


def shutdown() -> None:
    """Release NVML and forget every cached value (tests; a driver reload)."""
    global _session
    with _lock:
        if _session is None:
            return
        _session = None
        try:
            import pynvml  # noqa: PLC0415 - pynvml loads libnvidia-ml; `import xl.gpu.nvml` stays free

            pynvml.nvmlShutdown()
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------
# One sweep over the GPUs


class _Sweep:
    def __init__(self, pynvml: Any) -> None:
        self.nv = pynvml
        self.errors: list[str] = []
        self.last_code = 0  # NVML code of the last failed query (0: it worked)

    def query(self, fn: Callable[..., T], *args: Any) -> T | None:
        """The choke point: a value, or None when the GPU/driver does not provide it."""
        nv = self.nv
        self.last_code = 0
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            code = self.last_code = _nvml_code(exc) or 0
            if code == _GPU_IS_LOST:
                raise _Lost from None
            if code == _UNINITIALIZED:
                raise _Uninitialized from None
            if code not in _NOT_AVAILABLE:
                self.errors.append(f"{getattr(fn, '__name__', 'nvml')}: {exc}")
            return None
        except nv.NVMLLibraryMismatchError:
            # pynvml's unversioned wrappers raise this when the driver lacks the new symbol.
            self.last_code = _FUNCTION_NOT_FOUND
            return None
        except Exception as exc:  # e.g. undecodable bytes: lose this value, not the row
            self.last_code = -1
            self.errors.append(f"{getattr(fn, '__name__', 'nvml')}: {type(exc).__name__}: {exc}")
            return None

    def gpu(self, session: _Session, index: int, *, processes: bool) -> GPU:
        nv = self.nv
        self.errors = []
        static = session.static.get(index)
        try:
            if static is None:
                handle = self.query(nv.nvmlDeviceGetHandleByIndex, index)
                if handle is None:
                    raise RuntimeError(self.errors[-1] if self.errors else "no handle")
                pci = self.query(nv.nvmlDeviceGetPciInfo, handle)
                cc = self.query(nv.nvmlDeviceGetCudaComputeCapability, handle)
                static = _Static(
                    handle=handle,
                    uuid=self.query(nv.nvmlDeviceGetUUID, handle) or "",
                    name=self.query(nv.nvmlDeviceGetName, handle) or "",
                    pci_bus_id=_decode(pci.busId) if pci is not None else "",
                    compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
                )
                # Cache only a complete read: a GPU that failed half-way is asked again.
                if static.uuid and static.name and static.pci_bus_id:
                    session.static[index] = static
            return self._dynamic(session, index, static, processes=processes)
        except _Lost:
            # Keep what was read before: a lost GPU is still named by its UUID in the table.
            return _lost_gpu(index, static)
        except RuntimeError as exc:
            return empty_gpu(index, error=f"cannot open GPU {index}: {exc}")

    def _dynamic(self, session: _Session, index: int, s: _Static, *, processes: bool) -> GPU:
        nv = self.nv
        h = s.handle
        total = used = free = reserved = None
        mem = None
        if session.memory_v2:
            # v2 reports the driver's reserved memory apart; v1 counts it as used.
            mem = self.query(nv.nvmlDeviceGetMemoryInfo, h, _NVML_MEMORY_V2)
            if mem is None and self.last_code == _FUNCTION_NOT_FOUND:
                session.memory_v2 = False  # an older driver: v1 from now on
            elif mem is not None:
                reserved = mem.reserved / MIB
        if mem is None:
            mem = self.query(nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            total, used, free = mem.total / MIB, mem.used / MIB, mem.free / MIB
        util = self.query(nv.nvmlDeviceGetUtilizationRates, h)
        temp = self.query(nv.nvmlDeviceGetTemperature, h, 0)  # 0 = NVML_TEMPERATURE_GPU
        if temp is None and self.last_code == _FUNCTION_NOT_FOUND:
            # nvmlDeviceGetTemperature is deprecated; drivers after CUDA 13 may drop it.
            temp = self.query(nv.nvmlDeviceGetTemperatureV, h, 0)
        power = self.query(nv.nvmlDeviceGetPowerUsage, h)
        limit = self.query(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        mig = self.query(nv.nvmlDeviceGetMigMode, h)
        procs = self._processes(session, h) if processes else ()
        return GPU(
            index=index,
            uuid=s.uuid,
            name=s.name,
            pci_bus_id=s.pci_bus_id,
            memory_total_mib=total,
            memory_used_mib=used,
            memory_free_mib=free,
            util_gpu=util.gpu if util is not None else None,
            util_mem=util.memory if util is not None else None,
            temperature_c=temp,
            power_w=power / 1000.0 if power is not None else None,
            power_limit_w=limit / 1000.0 if limit is not None else None,
            compute_capability=s.compute_capability,
            mig_mode=bool(mig[0]) if mig is not None else None,
            processes=procs,
            lost=False,
            error="; ".join(self.errors) or None,
            memory_reserved_mib=reserved,
        )

    def _processes(self, session: _Session, h: Any) -> tuple[GPUProcess, ...]:
        nv = self.nv
        compute = graphics = None
        if session.procs_v3:
            compute = self.query(nv.nvmlDeviceGetComputeRunningProcesses_v3, h)
            if compute is None and self.last_code == _FUNCTION_NOT_FOUND:
                session.procs_v3 = False  # drivers before 510 have only _v2
            else:
                graphics = self.query(nv.nvmlDeviceGetGraphicsRunningProcesses_v3, h)
        if not session.procs_v3:
            compute = self.query(nv.nvmlDeviceGetComputeRunningProcesses_v2, h)
            graphics = self.query(nv.nvmlDeviceGetGraphicsRunningProcesses_v2, h)
        # A process with CUDA and graphics contexts shows in both lists: one row per pid.
        used: dict[int, float | None] = {}
        for p in [*(compute or ()), *(graphics or ())]:
            mib = p.usedGpuMemory / MIB if p.usedGpuMemory is not None else None
            if p.pid not in used or (mib is not None and (used[p.pid] or 0) < mib):
                used[p.pid] = mib
        return identify(used)


def _decode(v: bytes | str) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def _lost_gpu(index: int, s: _Static | None) -> GPU:
    if s is None:
        return empty_gpu(index, error=LOST_MESSAGE, lost=True)
    return empty_gpu(
        index,
        error=LOST_MESSAGE,
        uuid=s.uuid,
        name=s.name,
        pci_bus_id=s.pci_bus_id,
        compute_capability=s.compute_capability,
        lost=True,
    )


# ---------------------------------------------------------------------------------------------
# Public entry point


def _unreadable(driver: Driver, why: str) -> Inventory:
    """No GPUs, and why: the driver as it answered when NVML started, with the reason its GPUs
    could not be read."""
    return Inventory(driver=replace(driver, error=why, error_kind="other"))


def inventory(*, processes: bool = True) -> Inventory:
    """Every GPU in nvidia-smi order with its current figures. Never raises; thread-safe."""
    global _session
    with _lock:
        for _attempt in range(2):
            got = _ensure_init()
            if isinstance(got, Driver):
                return Inventory(driver=got, gpus=())
            try:
                return _sweep(got, processes=processes)
            except _Uninitialized:
                _session = None  # initialise again, once
            except Exception as exc:  # a bug or a driver gone mad: say so, never crash a caller
                return _unreadable(
                    got.driver, f"reading the GPUs failed: {type(exc).__name__}: {exc}"
                )
        return Inventory(
            driver=Driver(None, None, error="NVML keeps shutting down", error_kind="other")
        )


class Query(Protocol):
    """NVML's choke point as a per-GPU reader gets it: ``query(fn, *args)`` is fn's value, or
    None when the GPU or the driver does not provide it."""

    def __call__(self, fn: Callable[..., R], *args: object) -> R | None: ...


def per_gpu(read: Callable[[Query, object, int], T], indices: Sequence[int]) -> dict[int, T]:
    """``read(query, handle, index)`` for each GPU index, under NVML's lock and through its choke
    point (``query(fn, *args)``: a value, or None when the GPU or driver does not provide it). A
    lost GPU, one that can't be opened, or NVML that can't start, is left out. Never raises."""
    out: dict[int, T] = {}
    with _lock:
        got = _ensure_init()
        if isinstance(got, Driver):
            return out
        import pynvml  # noqa: PLC0415 - pynvml loads libnvidia-ml; `import xl.gpu.nvml` stays free

        sweep = _Sweep(pynvml)
        for index in indices:
            try:
                static = got.static.get(index)
                handle = (
                    static.handle
                    if static
                    else sweep.query(pynvml.nvmlDeviceGetHandleByIndex, index)
                )
                if handle is not None:
                    out[index] = read(sweep.query, handle, index)
            except (_Lost, _Uninitialized):
                continue
            except Exception:  # a bug reading one GPU: that GPU's answer is lost, not the caller
                continue
    return out


def _sweep(session: _Session, *, processes: bool) -> Inventory:
    import pynvml  # noqa: PLC0415 - pynvml loads libnvidia-ml; `import xl.gpu.nvml` stays free

    sweep = _Sweep(pynvml)
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        if _nvml_code(exc) == _UNINITIALIZED:
            raise _Uninitialized from None
        return _unreadable(session.driver, f"cannot count the GPUs: {exc}")
    if session.count is not None and count != session.count:
        session.static.clear()  # GPUs came or went (driver reload, reconfigured): re-read all
    session.count = count
    gpus = tuple(sweep.gpu(session, i, processes=processes) for i in range(count))
    return Inventory(driver=session.driver, gpus=gpus)
