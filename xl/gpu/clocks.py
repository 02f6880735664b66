"""What holds a GPU back, from NVML: why its clocks are down, its SM clock against its top,
temperature, power against its limit, uncorrectable ECC errors and the last XID (docs/contracts.md,
``sys`` lines: ``clock_event_reasons`` ... ``xid_t``).

The run sampler asks every second, but a GPU is read again only once ``min_interval_s`` (1 s) has
passed since its last read: eight GPUs cost eight small reads a second at most, whatever calls.
A value the driver does not give (NotSupported, a driver without the function) is left out of the
GPU's fields; the rest still come.

XIDs come from NVML's event set (``nvmlDeviceRegisterEvents`` for XID critical errors, read with a
zero wait): the driver delivers only those that happen after the set was registered, so an XID
from before the first read is not seen; ``xid_t`` is when it was read, within a second of it
happening. A driver that offers no XID events leaves ``xid`` out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from xl.gpu.nvml import per_gpu

# nvmlClocksEventReasons (nvml.h): the reasons that slow a GPU's work, by the names the
# straggler event gives them, worst first. The others (GPU idle 0x1, applications clocks 0x2,
# sync boost 0x10, display clock 0x100) are a GPU doing as it was set to, not a problem.
SLOWING: tuple[tuple[int, str, str], ...] = (
    (0x80, "hw_power_brake", "power brake"),
    (0x40, "hw_thermal_slowdown", "thermal slowdown"),
    (0x08, "hw_slowdown", "hardware slowdown"),
    (0x20, "sw_thermal_slowdown", "thermal slowdown (driver)"),
    (0x04, "sw_power_cap", "power cap"),
)
GPU_IDLE = 0x01
_CLOCK_SM = 1  # nvmlClockType_t
_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_UNCORRECTED, _VOLATILE = 1, 0  # nvmlMemoryErrorType_t, nvmlEccCounterType_t
_TIMEOUT = 10  # NVML_ERROR_TIMEOUT: no event waiting
_DRAIN = 64  # events read at most per GPU per read: a storm never holds the sampler


@dataclass(frozen=True)
class Clocks:
    """One GPU's read; None where NVML did not answer. Field names are the ``sys`` line's."""

    clock_event_reasons: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    temp_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    ecc_volatile: int | None = None  # uncorrectable errors since the driver loaded
    xid: int | None = None  # the last XID seen
    xid_t: float | None = None  # unix time it was seen

    def to_fields(self) -> dict[str, int | float]:
        """The ``sys`` line's keys for this GPU, those NVML answered."""
        out: dict[str, int | float] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value
        return out


def slowing(reasons: int | None) -> list[tuple[str, str]]:
    """The reasons in ``reasons`` that slow the GPU's work, worst first: (name, words)."""
    if not reasons:
        return []
    return [(name, words) for bit, name, words in SLOWING if reasons & bit]


class _Xids:
    """One GPU's XID event set: made on the first read, drained on each."""

    def __init__(self) -> None:
        self.handle: Any = None
        self.unavailable = False
        self.last: tuple[int, float] | None = None

    def drain(self, nv: Any, query: Callable[..., Any], device: Any, now: float) -> None:
        if self.unavailable:
            return
        if self.handle is None:
            supported = query(nv.nvmlDeviceGetSupportedEventTypes, device)
            if not supported or not supported & _XID_EVENT:
                self.unavailable = True
                return
            handle = query(nv.nvmlEventSetCreate)
            if handle is None:
                self.unavailable = True
                return
            try:  # it returns None either way: only what it raises tells
                nv.nvmlDeviceRegisterEvents(device, _XID_EVENT, handle)
            except Exception:
                self.unavailable = True
                query(nv.nvmlEventSetFree, handle)
                return
            self.handle = handle
        for _ in range(_DRAIN):
            try:
                data = nv.nvmlEventSetWait_v2(self.handle, 0)
            except nv.NVMLError:
                return  # NVML_ERROR_TIMEOUT: nothing waiting (or the set is gone: next read)
            except Exception:
                return
            if data.eventType & _XID_EVENT:
                self.last = (int(data.eventData), now)


class ClockReader:
    """Each GPU's ``Clocks``, read at most once per ``min_interval_s``; thread-safe."""

    def __init__(
        self,
        *,
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._read: dict[int, tuple[float, Clocks]] = {}
        self._xids: dict[int, _Xids] = {}
        self.reads = 0  # GPU reads made (the cost the interval bounds)

    def read(self, indices: Sequence[int]) -> dict[int, Clocks]:
        """The GPUs' figures: the last read where it is younger than ``min_interval_s``."""
        with self._lock:
            now = self._clock()
            due = [i for i in indices if not self._fresh(i, now)]
            if due:
                for index, got in per_gpu(self._one, due).items():
                    self._read[index] = (now, got)
            return {i: self._read[i][1] for i in indices if i in self._read}

    def _fresh(self, index: int, now: float) -> bool:
        got = self._read.get(index)
        return got is not None and now - got[0] < self.min_interval_s

    def _one(self, query: Callable[..., Any], device: Any, index: int) -> Clocks:
        import pynvml  # noqa: PLC0415 - per_gpu has loaded it already; `import xl.gpu.clocks` stays free

        self.reads += 1
        reasons = query(pynvml.nvmlDeviceGetCurrentClocksEventReasons, device)
        if reasons is None:
            # drivers before 535 name it ...ThrottleReasons; later ones may drop that name
            reasons = query(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, device)
        power = query(pynvml.nvmlDeviceGetPowerUsage, device)
        limit = query(pynvml.nvmlDeviceGetEnforcedPowerLimit, device)
        temp = query(pynvml.nvmlDeviceGetTemperature, device, 0)  # 0: the GPU's own sensor
        if temp is None:  # deprecated: drivers after CUDA 13 may drop it for the V form
            temp = query(pynvml.nvmlDeviceGetTemperatureV, device, 0)
        xids = self._xids.setdefault(index, _Xids())
        xids.drain(pynvml, query, device, self._wall())
        last = xids.last
        return Clocks(
            clock_event_reasons=reasons,
            sm_clock_mhz=query(pynvml.nvmlDeviceGetClockInfo, device, _CLOCK_SM),
            sm_clock_max_mhz=query(pynvml.nvmlDeviceGetMaxClockInfo, device, _CLOCK_SM),
            temp_c=temp,
            power_w=round(power / 1000.0, 1) if power is not None else None,
            power_limit_w=round(limit / 1000.0, 1) if limit is not None else None,
            ecc_volatile=query(
                pynvml.nvmlDeviceGetTotalEccErrors, device, _UNCORRECTED, _VOLATILE
            ),
            xid=last[0] if last else None,
            xid_t=round(last[1], 3) if last else None,
        )
