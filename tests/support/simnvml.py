"""Simulated NVIDIA driver for tests and demos: builds simnvml.c and writes its configuration.

The real nvidia-ml-py loads the built ``libnvidia-ml.so.1`` through ``LD_LIBRARY_PATH``, so every
layer above it (pynvml, xl.gpu.nvml, nvitop) runs its real code paths against GPUs that do not
exist.

In tests use the ``simnvml`` fixture (tests/conftest.py)::

    sim = simnvml(gpus=8)                         # 8 x A100 80GB
    sim = simnvml(gpus=[SimGPU(model="H100"), SimGPU(model="A100")],
                  init_error="driver_not_loaded")
    subprocess.run([...], env={**os.environ, **sim.env}, timeout=30)
    sim.update(0, util_gpu=90)                    # live: processes see it at their next call
    sim.add_process(0, pid, used_mib=1024)
    with sim.in_process():                        # pynvml in this interpreter uses it
        inv = xl.gpu.nvml.inventory()

By hand (the README shows this)::

    python tests/support/simnvml.py --gpus 8 --dir /tmp/xl-sim      # prints `export ...` lines
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).with_name("simnvml.c")
LIBNAME = "libnvidia-ml.so.1"
CONFIG_ENV = "XL_SIMNVML_CONFIG"
SIMULATED_ENV = "XL_SIMULATED_GPUS"  # tells `xl launch` a CPU torch is what runs these GPUs
MIB = 1024 * 1024

# NVML return codes (nvml.h) by the names tests use.
INIT_ERRORS: dict[str, int] = {
    "no_permission": 4,
    "driver_not_loaded": 9,
    # what pynvml raises itself when dlopen fails; here: the driver says so
    "library_not_found": 12,
    "gpu_is_lost": 15,
    "version_mismatch": 18,  # NVML_ERROR_LIB_RM_VERSION_MISMATCH
    "unknown": 999,
}
NOT_SUPPORTED = 3
NO_PERMISSION = 4
GPU_IS_LOST = 15

# name, pci device id, compute capability, memory MiB, power limit W
MODELS: dict[str, tuple[str, int, str, int, int]] = {
    "A100": ("NVIDIA A100-SXM4-80GB", 0x20B210DE, "8.0", 81920, 400),
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", 0x20B010DE, "8.0", 40960, 400),
    "H100": ("NVIDIA H100 80GB HBM3", 0x233010DE, "9.0", 81559, 700),
    "H200": ("NVIDIA H200", 0x233510DE, "9.0", 143771, 700),
    "L4": ("NVIDIA L4", 0x27B810DE, "8.9", 23034, 72),
    "RTX4090": ("NVIDIA GeForce RTX 4090", 0x268410DE, "8.9", 24564, 450),
    "V100": ("Tesla V100-SXM2-32GB", 0x1DB510DE, "7.0", 32768, 300),
    "T4": ("Tesla T4", 0x1EB810DE, "7.5", 15360, 70),
}

# Each model's top SM clock (MHz): what nvmlDeviceGetMaxClockInfo(SM) answers.
MAX_SM_CLOCK_MHZ: dict[str, int] = {
    "A100": 1410,
    "A100-40GB": 1410,
    "H100": 1980,
    "H200": 1980,
    "L4": 2040,
    "RTX4090": 2520,
    "V100": 1530,
    "T4": 1590,
}

# A DGX-like PCI layout: nvidia-smi order is PCI bus order.
_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)


def default_uuid(index: int) -> str:
    h = hashlib.sha1(f"xl-simgpu-{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def default_pci(index: int) -> str:
    bus = _BUSES[index] if index < len(_BUSES) else 0xC0 + index
    return f"00000000:{bus:02X}:00.0"


@dataclass
class SimProcess:
    pid: int
    used_mib: float = 0.0
    graphics: bool = False


@dataclass
class SimGPU:
    """One simulated GPU. ``None`` fields are filled from ``model`` and the GPU's index."""

    model: str = "A100"
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    pci_device_id: int | None = None
    memory_total_mib: float | None = None
    memory_used_mib: float = 0.0
    memory_reserved_mib: float = 0.0
    util_gpu: int = 0
    util_mem: int = 0
    # GPU utilization cycling through these values, one step every util_seq_ms (0: every query)
    util_seq: tuple[int, ...] = ()
    util_seq_ms: int = 0
    temperature_c: int = 33
    fan_pct: int = 0
    power_w: float = 60.0
    power_limit_w: float | None = None
    compute_capability: str | None = None
    mig: int = 0  # 0 off, 1 on, -1 not supported by this GPU
    mig_pending: int | None = None
    lost: int = 0  # 1: queries fail with GPU_IS_LOST; 2: getting the handle fails too
    compute_mode: int = 0  # 0 default, 2 prohibited, 3 exclusive-process
    ecc_unc_volatile: int = 0  # uncorrected ECC errors since the driver loaded
    ecc_unc_aggregate: int = 0  # ... over the GPU's life
    remap_corr: int = 0  # rows remapped for correctable errors
    remap_unc: int = 0  # ... for uncorrectable ones
    remap_pending: int = 0  # 1: a remap waits for a GPU reset
    remap_failure: int = 0  # 1: a remap failed (the GPU is out of spare rows)
    retired_sbe: int = 0  # pages retired (pre-Ampere ECC), single-bit
    retired_dbe: int = 0  # ... double-bit
    retired_pending: int = 0  # 1: a retirement waits for a reboot/reset
    # NVSwitch fabric (nvmlDeviceGetGpuFabricInfo): -1 NOT_SUPPORTED (no fabric), else the
    # state: 1 not started (Fabric Manager not running), 2 in progress, 3 completed
    fabric_state: int = -1
    fabric_status: int = 0  # an nvmlReturn_t: the fabric's own result once completed
    # Why the clocks are held down (nvmlDeviceGetCurrentClocksEventReasons' bitmask, e.g. 0x40
    # HW thermal slowdown, 0x4 SW power cap; 0x1 idle) and the SM clock against its maximum
    # (None: the model's top clock, MAX_SM_CLOCK_MHZ)
    clock_event_reasons: int = 0
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    # Every XID the GPU has had since the driver loaded, oldest first: a process watching XIDs
    # (an NVML event set) gets those added after it began to watch
    xids: tuple[int, ...] = ()
    event_types: int = 0x1F  # nvmlDeviceGetSupportedEventTypes (0x8: XIDs; 0: no events here)
    # NVML function name -> nvmlReturn_t it returns for this GPU (e.g. NOT_SUPPORTED)
    errors: dict[str, int] = field(default_factory=dict)
    processes: list[SimProcess] = field(default_factory=list)

    def resolved(self, index: int) -> SimGPU:
        try:
            name, devid, cc, mem, limit = MODELS[self.model]
        except KeyError:
            raise ValueError(f"unknown model {self.model!r}; known: {', '.join(MODELS)}") from None
        top = self.sm_clock_max_mhz or MAX_SM_CLOCK_MHZ[self.model]
        return dataclasses.replace(
            self,
            name=self.name or name,
            uuid=self.uuid or default_uuid(index),
            pci_bus_id=self.pci_bus_id or default_pci(index),
            pci_device_id=self.pci_device_id if self.pci_device_id is not None else devid,
            memory_total_mib=self.memory_total_mib if self.memory_total_mib is not None else mem,
            power_limit_w=self.power_limit_w if self.power_limit_w is not None else limit,
            compute_capability=self.compute_capability or cc,
            sm_clock_max_mhz=top,
            sm_clock_mhz=self.sm_clock_mhz if self.sm_clock_mhz is not None else top,
            mig_pending=self.mig_pending if self.mig_pending is not None else self.mig,
            errors=dict(self.errors),
            processes=[dataclasses.replace(p) for p in self.processes],
        )


# What the real Hopper drivers answered NOT_SUPPORTED (no fan reading on passively cooled
# data-centre GPUs; row remapping replaced page retirement since Ampere).
HOPPER_NOT_SUPPORTED = {
    "nvmlDeviceGetFanSpeed": NOT_SUPPORTED,
    "nvmlDeviceGetRetiredPages": NOT_SUPPORTED,
    "nvmlDeviceGetRetiredPagesPendingStatus": NOT_SUPPORTED,
}


def seen_h200() -> SimGPU:
    """The H200 as its real driver (580.159.04, CUDA 13.0) answered, idle, on 2026-11-26 (the GPU
    acceptance run, bench/README.md): the driver holds 615 MiB for itself (memory v1 counts it as
    used, v2 apart, with used 0), and like the other passively cooled data-centre GPUs since
    Ampere it has no fan reading and no page retirement (row remapping replaced it): those three
    calls answer NOT_SUPPORTED. Run it with driver_version="580.159.04", cuda_version=13000."""
    return SimGPU(
        model="H200",
        uuid="GPU-6091723c-1489-8531-612c-d2c983e2ea71",
        pci_bus_id="00000000:00:06.0",
        memory_reserved_mib=644939776 / MIB,
        temperature_c=37,
        power_w=76.744,
        errors=dict(HOPPER_NOT_SUPPORTED),
    )


def seen_h100() -> SimGPU:
    """The H100 as its real driver (580.159.04, CUDA 13.0) answered, idle, on 2026-11-27 (the second
    GPU acceptance run, bench/README.md): the driver holds 480 MiB for itself, fan and page
    retirement answer NOT_SUPPORTED as on the H200, and this GPU has had one uncorrectable ECC
    error in its life (the aggregate counter; none since the driver loaded) whose row was remapped
    (remapped rows: 0 correctable, 1 uncorrectable, none pending, no failure): a healthy GPU that
    has used one of its spare rows. Run it with driver_version="580.159.04", cuda_version=13000."""
    return SimGPU(
        model="H100",
        uuid="GPU-b1173ee3-17e1-e199-e2a2-b3741a8888ad",
        pci_bus_id="00000000:00:06.0",
        memory_reserved_mib=503316480 / MIB,
        temperature_c=58,
        power_w=80.45,
        ecc_unc_aggregate=1,
        remap_unc=1,
        errors=dict(HOPPER_NOT_SUPPORTED),
    )


# ---------------------------------------------------------------------------------------------
# Building


def have_gcc() -> bool:
    return shutil.which(os.environ.get("CC", "gcc")) is not None


def _guarded_symbols() -> set[str]:
    return set(re.findall(r"#ifndef SIM_NO_(\w+)", SOURCE.read_text()))


def build(out_dir: str | os.PathLike[str], *, missing: Sequence[str] = ()) -> Path:
    """Compile the simulated library into ``out_dir/libnvidia-ml.so.1``; return that directory.

    ``missing`` names NVML functions to leave out, as an older driver would.
    """
    known = _guarded_symbols()
    unknown = sorted(set(missing) - known)
    if unknown:
        raise ValueError(f"cannot leave out {unknown}: simnvml.c has no SIM_NO_ guard for them")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / LIBNAME
    cc = os.environ.get("CC", "gcc")
    # Build under a temporary name and rename, so a concurrent loader never sees half a file.
    tmp = out / f".{LIBNAME}.{os.getpid()}.tmp"
    argv = [cc, "-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-Wall", "-o", str(tmp)]
    argv += [f"-DSIM_NO_{name}" for name in sorted(set(missing))]
    argv += [str(SOURCE), "-lpthread"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"building the simulated NVML failed:\n{proc.stderr}")
    os.replace(tmp, target)
    return out


# ---------------------------------------------------------------------------------------------
# Configuration


def render_config(
    gpus: Sequence[SimGPU],
    *,
    init_error: int = 0,
    driver_version: str = "550.54.15",
    cuda_version: int = 12040,
) -> str:
    lines = [
        f"driver_version {driver_version}",
        f"nvml_version 12.{driver_version}",
        f"cuda_version {cuda_version}",
        f"init_error {init_error}",
        f"count {len(gpus)}",
    ]
    for i, raw in enumerate(gpus):
        g = raw.resolved(i)
        assert g.memory_total_mib is not None and g.power_limit_w is not None
        p = f"gpu.{i}."
        seq = ",".join(str(int(v)) for v in g.util_seq)
        lines += [
            f"{p}name {g.name}",
            f"{p}uuid {g.uuid}",
            f"{p}pci {g.pci_bus_id}",
            f"{p}pci_device_id {g.pci_device_id:#010x}",
            f"{p}mem_total {int(g.memory_total_mib * MIB)}",
            f"{p}mem_used {int(g.memory_used_mib * MIB)}",
            f"{p}mem_reserved {int(g.memory_reserved_mib * MIB)}",
            f"{p}util_gpu {int(g.util_gpu)}",
            f"{p}util_mem {int(g.util_mem)}",
            f"{p}util_seq {seq}",
            f"{p}util_seq_ms {int(g.util_seq_ms)}",
            f"{p}temp {int(g.temperature_c)}",
            f"{p}fan {int(g.fan_pct)}",
            f"{p}power_mw {int(g.power_w * 1000)}",
            f"{p}power_limit_mw {int(g.power_limit_w * 1000)}",
            f"{p}power_default_limit_mw {int(g.power_limit_w * 1000)}",
            f"{p}cc {g.compute_capability}",
            f"{p}mig {int(g.mig)}",
            f"{p}mig_pending {int(g.mig_pending or 0)}",
            f"{p}lost {int(g.lost)}",
            f"{p}compute_mode {int(g.compute_mode)}",
            f"{p}ecc_unc_volatile {int(g.ecc_unc_volatile)}",
            f"{p}ecc_unc_aggregate {int(g.ecc_unc_aggregate)}",
            f"{p}remap_corr {int(g.remap_corr)}",
            f"{p}remap_unc {int(g.remap_unc)}",
            f"{p}remap_pending {int(g.remap_pending)}",
            f"{p}remap_failure {int(g.remap_failure)}",
            f"{p}retired_sbe {int(g.retired_sbe)}",
            f"{p}retired_dbe {int(g.retired_dbe)}",
            f"{p}retired_pending {int(g.retired_pending)}",
            f"{p}fabric_state {int(g.fabric_state)}",
            f"{p}fabric_status {int(g.fabric_status)}",
            f"{p}clock_reasons {int(g.clock_event_reasons):#x}",
            f"{p}sm_clock {int(g.sm_clock_mhz or 0)}",
            f"{p}sm_clock_max {int(g.sm_clock_max_mhz or 0)}",
            f"{p}xids {','.join(str(int(x)) for x in g.xids)}",
            f"{p}event_types {int(g.event_types):#x}",
            f"{p}errors {','.join(f'{k}={v}' for k, v in g.errors.items())}",
            f"{p}procs {_procs(g, graphics=False)}",
            f"{p}gprocs {_procs(g, graphics=True)}",
        ]
    return "\n".join(lines) + "\n"


def _procs(g: SimGPU, *, graphics: bool) -> str:
    return ",".join(
        f"{p.pid}:{int(p.used_mib * MIB)}" for p in g.processes if p.graphics == graphics
    )


def _init_error_code(init_error: str | int | None) -> int:
    if init_error is None:
        return 0
    if isinstance(init_error, int):
        return init_error
    try:
        return INIT_ERRORS[init_error]
    except KeyError:
        raise ValueError(
            f"unknown init_error {init_error!r}; known: {', '.join(INIT_ERRORS)} or an int"
        ) from None


def _as_gpus(gpus: int | Sequence[SimGPU]) -> list[SimGPU]:
    if isinstance(gpus, int):
        return [SimGPU() for _ in range(gpus)]
    return [dataclasses.replace(g) for g in gpus]


class SimNVML:
    """One simulated driver: a built library directory plus this instance's config file."""

    def __init__(
        self,
        library_dir: Path,
        config_path: Path,
        gpus: int | Sequence[SimGPU] = 1,
        *,
        init_error: str | int | None = None,
        driver_version: str = "550.54.15",
        cuda_version: int = 12040,
    ) -> None:
        self.library_dir = Path(library_dir)
        self.config_path = Path(config_path)
        self.gpus: list[SimGPU] = _as_gpus(gpus)
        self.init_error = _init_error_code(init_error)
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.write()

    @property
    def library_path(self) -> Path:
        return self.library_dir / LIBNAME

    @property
    def env(self) -> dict[str, str]:
        """Variables to merge into a subprocess environment so its pynvml finds this driver."""
        ld = os.environ.get("LD_LIBRARY_PATH", "")
        return {
            "LD_LIBRARY_PATH": f"{self.library_dir}{os.pathsep + ld if ld else ''}",
            CONFIG_ENV: str(self.config_path),
            # No CUDA behind these GPUs: `xl launch --gpus` runs them with a CPU torch.
            SIMULATED_ENV: "1",
        }

    def exports(self) -> str:
        """Shell lines that select this driver in an interactive shell."""
        return (
            f"export LD_LIBRARY_PATH={self.library_dir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n"
            f"export {CONFIG_ENV}={self.config_path} {SIMULATED_ENV}=1"
        )

    def write(self) -> None:
        text = render_config(
            self.gpus,
            init_error=self.init_error,
            driver_version=self.driver_version,
            cuda_version=self.cuda_version,
        )
        # Atomic replace: the library re-reads when mtime/inode change and never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=self.config_path.parent, prefix=".simnvml-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, self.config_path)

    # -- live changes ------------------------------------------------------------------------

    def update(
        self,
        index: int | None = None,
        /,
        *,
        gpus: int | Sequence[SimGPU] | None = None,
        init_error: str | int | bool | None = False,
        driver_version: str | None = None,
        cuda_version: int | None = None,
        **gpu_fields: object,
    ) -> None:
        """Change the simulated driver; running processes see it at their next NVML call.

        ``sim.update(2, util_gpu=95, temperature_c=80)`` changes GPU 2;
        ``sim.update(gpus=4)`` replaces the GPU list; ``sim.update(init_error=None)`` clears it.
        """
        if gpus is not None:
            self.gpus = _as_gpus(gpus)
        if init_error is not False:
            self.init_error = _init_error_code(init_error)  # type: ignore[arg-type]
        if driver_version is not None:
            self.driver_version = driver_version
        if cuda_version is not None:
            self.cuda_version = cuda_version
        if gpu_fields:
            if index is None:
                raise TypeError("update(index, **fields): say which GPU the fields are for")
            self.gpus[index] = dataclasses.replace(self.gpus[index], **gpu_fields)  # type: ignore[arg-type]
        self.write()

    def add_process(
        self, index: int, pid: int, used_mib: float = 0.0, *, graphics: bool = False
    ) -> None:
        procs = [*self.gpus[index].processes, SimProcess(pid, used_mib, graphics)]
        self.update(index, processes=procs)

    def remove_process(self, pid: int) -> None:
        for i, g in enumerate(self.gpus):
            self.gpus[i] = dataclasses.replace(
                g, processes=[p for p in g.processes if p.pid != pid]
            )
        self.write()

    # -- in-process use ------------------------------------------------------------------------

    @contextlib.contextmanager
    def in_process(self) -> Iterator[None]:
        """Point this interpreter's pynvml (and xl.gpu.nvml) at this simulated driver for a
        while."""
        import pynvml  # noqa: PLC0415 - tests that build only the library never load it

        from xl.gpu import nvml  # noqa: PLC0415 - as above

        old_env = os.environ.get(CONFIG_ENV)
        old_lib = pynvml.nvmlLib
        nvml.shutdown()
        os.environ[CONFIG_ENV] = str(self.config_path)
        with pynvml.libLoadLock:
            pynvml.nvmlLib = ctypes.CDLL(str(self.library_path))
            # pynvml caches function pointers by name: the old library's must not leak in.
            pynvml._nvmlGetFunctionPointer_cache.clear()
            pynvml._nvmlLib_refcount = 0
        try:
            yield
        finally:
            nvml.shutdown()
            with pynvml.libLoadLock:
                pynvml.nvmlLib = old_lib
                pynvml._nvmlGetFunctionPointer_cache.clear()
                pynvml._nvmlLib_refcount = 0
            if old_env is None:
                os.environ.pop(CONFIG_ENV, None)
            else:
                os.environ[CONFIG_ENV] = old_env


# ---------------------------------------------------------------------------------------------
# Command line: set up a simulated driver by hand


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="simnvml.py",
        description="Build the simulated NVML driver and print the `export` lines that select it.",
    )
    ap.add_argument("--gpus", type=int, default=8, help="number of GPUs (default 8)")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "xl-sim"))
    ap.add_argument(
        "--model",
        action="append",
        choices=sorted(MODELS),
        help="GPU model; repeat to mix models (cycled over the GPUs). Default A100",
    )
    ap.add_argument("--busy", action="store_true", help="utilization and memory that change")
    ap.add_argument("--init-error", choices=sorted(INIT_ERRORS), help="make nvmlInit fail")
    args = ap.parse_args(argv)
    if not have_gcc():
        print(
            "simnvml.py: gcc not found; install gcc to build the simulated driver", file=sys.stderr
        )
        return 2
    models = args.model or ["A100"]
    gpus = []
    for i in range(args.gpus):
        g = SimGPU(model=models[i % len(models)])
        if args.busy:
            base = 20 + 9 * i
            g = dataclasses.replace(
                g,
                util_seq=tuple((base + 13 * k) % 100 for k in range(8)),
                util_seq_ms=1000,
                util_mem=base // 2,
                memory_used_mib=4096.0 * (i + 1),
                temperature_c=40 + i,
                power_w=120.0 + 20 * i,
            )
        gpus.append(g)
    out = build(args.dir)
    sim = SimNVML(out, out / "simnvml.conf", gpus, init_error=args.init_error)
    print(sim.exports())
    print(f"# edit {sim.config_path} to change values live", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
