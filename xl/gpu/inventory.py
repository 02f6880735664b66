"""What an inventory holds: plain, frozen records (the UI renders these, never live NVML handles).

``to_json`` is the `xl gpus --json` contract (docs/contracts.md lists every key), so the
field names here are kept exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIB = 1024 * 1024

LOST_MESSAGE = (
    "GPU is lost (NVML_ERROR_GPU_IS_LOST): it stopped answering the driver; "
    "check `dmesg` for Xid errors, then reset the GPU (nvidia-smi -r) or reboot"
)


def whole_mib(value: float | None) -> int | None:
    """Memory for `xl gpus --json`: whole MiB, as nvidia-smi prints them (floored)."""
    return None if value is None else int(value)


@dataclass(frozen=True)
class GPUProcess:
    pid: int  # as this PID namespace numbers it (mapped through NSpid when NVML's is another's)
    used_mib: float | None
    name: str | None
    rank: int | None
    local_rank: int | None
    run_id: str | None  # XL_RUN_ID of the run the process belongs to, when readable

    def to_json(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "used_mib": whole_mib(self.used_mib),
            "name": self.name,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "run_id": self.run_id,
        }


@dataclass(frozen=True)
class GPU:
    index: int  # NVML / nvidia-smi index (PCI bus order)
    uuid: str  # "GPU-..."; "" when the GPU is lost before it could be read
    name: str
    pci_bus_id: str  # "00000000:07:00.0" as nvidia-smi prints it
    memory_total_mib: float | None
    memory_used_mib: float | None
    memory_free_mib: float | None
    util_gpu: int | None
    util_mem: int | None
    temperature_c: int | None
    power_w: float | None
    power_limit_w: float | None
    compute_capability: str | None  # "8.0"
    mig_mode: bool | None
    processes: tuple[GPUProcess, ...] = ()
    lost: bool = False
    error: str | None = None  # why values are missing, beyond "not supported here"
    memory_reserved_mib: float | None = None  # the driver's own share (v2 memory struct only)

    def to_json(self) -> dict[str, object]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "pci_bus_id": self.pci_bus_id,
            "memory": {
                "total_mib": whole_mib(self.memory_total_mib),
                "used_mib": whole_mib(self.memory_used_mib),
                "free_mib": whole_mib(self.memory_free_mib),
                "reserved_mib": whole_mib(self.memory_reserved_mib),
            },
            "utilization": {"gpu": self.util_gpu, "memory": self.util_mem},
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
            "power_limit_w": self.power_limit_w,
            "compute_capability": self.compute_capability,
            "mig_mode": self.mig_mode,
            "processes": [p.to_json() for p in self.processes],
            "lost": self.lost,
            "error": self.error,
        }


@dataclass(frozen=True)
class Driver:
    version: str | None  # "550.54.15"
    cuda_version: str | None  # the highest CUDA the driver supports, "12.4"
    error: str | None = None  # why NVML cannot be used, for a person
    error_kind: str | None = (
        None  # library_not_found|driver_not_loaded|version_mismatch|no_permission|other
    )

    def to_json(self) -> dict[str, object]:
        return {
            "version": self.version,
            "cuda_version": self.cuda_version,
            "error": self.error,
            "error_kind": self.error_kind,
        }


@dataclass(frozen=True)
class Inventory:
    driver: Driver
    gpus: tuple[GPU, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, object]:
        return {"driver": self.driver.to_json(), "gpus": [g.to_json() for g in self.gpus]}


def empty_gpu(
    index: int,
    *,
    error: str,
    uuid: str = "",
    name: str = "",
    pci_bus_id: str = "",
    compute_capability: str | None = None,
    lost: bool = False,
) -> GPU:
    """A row with identity only (what was known) and every figure unknown: a GPU that could not
    be opened, or one lost mid-way, still shows in the table under its UUID."""
    return GPU(
        index=index,
        uuid=uuid,
        name=name,
        pci_bus_id=pci_bus_id,
        memory_total_mib=None,
        memory_used_mib=None,
        memory_free_mib=None,
        util_gpu=None,
        util_mem=None,
        temperature_c=None,
        power_w=None,
        power_limit_w=None,
        compute_capability=compute_capability,
        mig_mode=None,
        processes=(),
        lost=lost,
        error=error,
    )
