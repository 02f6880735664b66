"""The exporter's per-GPU series and where each GPU is (docs/exporter.md): each GPU of a run
exported per rank gets one series set, however many ranks share it, labelled as dcgm-exporter's
releases label the same GPU (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``,
``Hostname``), so the two join.
"""

from __future__ import annotations

import time

from prometheus_client.core import GaugeMetricFamily, Metric

from xl import figures

GPU = ("gpu", "UUID", "pci_bus_id", "device", "modelName")  # a GPU, as dcgm-exporter names one
GPUS = ("Hostname", *GPU)  # a GPU's own series (one per GPU, however many ranks share it)

# NVML's clock-event reasons as dcgm-exporter names them (its ``clock_event`` label).
CLOCK_EVENTS = (
    (0x1, "gpu_idle"),
    (0x2, "clocks_setting"),
    (0x4, "power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
)


class Buses:
    """Each GPU's PCI bus id on this machine (dcgm-exporter's ``pci_bus_id``), by UUID: NVML asked
    when a GPU it has not told of comes, at most once a minute."""

    def __init__(self) -> None:
        self._buses: dict[str, str] = {}
        self._read = float("-inf")  # monotonic

    def __call__(self, uuid: str) -> str:
        """The GPU's bus id, empty where NVML here does not know it (a run on another node, no
        driver on this one)."""
        if not uuid or uuid in self._buses or time.monotonic() - self._read < 60:
            return self._buses.get(uuid, "")
        self._read = time.monotonic()
        from xl.gpu import nvml  # noqa: PLC0415 - only a scrape of a run on GPUs asks NVML

        for gpu in nvml.inventory(processes=False).gpus:
            if gpu.uuid:
                self._buses[gpu.uuid] = gpu.pci_bus_id
        return self._buses.get(uuid, "")


def clock_families(gpus: dict[tuple[str, int], tuple[list[str], int]]) -> list[Metric]:
    """Each GPU's clock-event reasons (``gpus``: (host, index) -> its labels and the bitmask):
    the bitmask, and each reason 0 or 1 under dcgm-exporter's name for it."""
    reasons = GaugeMetricFamily(
        figures.BY_KEY["clock_event_reasons"].family or "xl_gpu_clock_event_reasons",
        "Why the GPU's clocks are down: NVML's clock-event reasons bitmask (0x4 power cap, "
        "0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal, 0x80 power brake slow its "
        "work; 0x1 idle, 0x2 applications clocks are as set).",
        labels=GPUS,
    )
    active = GaugeMetricFamily(
        "xl_gpu_clock_event_active",
        "1 while the clock-event reason clock_event (dcgm-exporter's names) holds the GPU's "
        "clocks down, else 0.",
        labels=(*GPUS, "clock_event"),
    )
    for key in sorted(gpus):
        labels, mask = gpus[key]
        reasons.add_metric(labels, mask)
        for bit, name in CLOCK_EVENTS:
            active.add_metric([*labels, name], 1 if mask & bit else 0)
    return [reasons, active]
