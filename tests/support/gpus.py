"""GPU records for tests that judge GPUs without NVML (the doctor's checks, CUDA_VISIBLE_DEVICES,
the model wording): an idle, healthy A100 unless told otherwise."""

from __future__ import annotations

from xl.gpu.inventory import GPU


def idle_gpu(
    index: int,
    name: str = "NVIDIA A100-SXM4-80GB",
    cc: str = "8.0",
    *,
    uuid: str | None = None,
    bus: str | None = None,
) -> GPU:
    """GPU `index` with nothing running on it; its UUID and PCI bus id follow from the index
    unless given."""
    return GPU(
        index=index,
        uuid=f"GPU-{index:08d}" if uuid is None else uuid,
        name=name,
        pci_bus_id=f"00000000:{index + 7:02X}:00.0" if bus is None else bus,
        memory_total_mib=81920.0,
        memory_used_mib=0.0,
        memory_free_mib=81920.0,
        util_gpu=0,
        util_mem=0,
        temperature_c=30,
        power_w=60.0,
        power_limit_w=400.0,
        compute_capability=cc,
        mig_mode=False,
    )
