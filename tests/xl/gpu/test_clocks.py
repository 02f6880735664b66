"""xl.gpu.clocks against the simulated driver, through the real nvidia-ml-py: why a GPU's clocks
are down, its SM clock, temperature, power, ECC and XIDs, read at most once a second."""

from __future__ import annotations

from simnvml import NOT_SUPPORTED, SimGPU

from xl.gpu.clocks import ClockReader, slowing


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_throttled_gpu_and_a_healthy_one_read_as_the_driver_says(simnvml) -> None:
    sim = simnvml(
        gpus=[
            SimGPU(
                model="H100",
                clock_event_reasons=0x40,
                sm_clock_mhz=1290,
                temperature_c=87,
                power_w=512.5,
                ecc_unc_volatile=2,
            ),
            SimGPU(model="H100", clock_event_reasons=0x1),  # idle: clocks down, nothing wrong
        ]
    )
    with sim.in_process():
        got = ClockReader().read([0, 1])
    hot, idle = got[0].to_fields(), got[1].to_fields()
    assert hot == {
        "clock_event_reasons": 0x40,
        "sm_clock_mhz": 1290,
        "sm_clock_max_mhz": 1980,
        "temp_c": 87,
        "power_w": 512.5,
        "power_limit_w": 700.0,
        "ecc_volatile": 2,
    }
    assert slowing(hot["clock_event_reasons"]) == [("hw_thermal_slowdown", "thermal slowdown")]
    assert idle["clock_event_reasons"] == 0x1 and idle["sm_clock_mhz"] == 1980
    assert slowing(idle["clock_event_reasons"]) == []  # idle and applications clocks: no problem
    assert slowing(0x2 | 0x10 | 0x100) == []
    assert [n for n, _ in slowing(0x84)] == ["hw_power_brake", "sw_power_cap"]


def test_an_xid_is_reported_once_seen_and_one_from_before_the_watch_is_not(simnvml) -> None:
    sim = simnvml(gpus=[SimGPU(xids=(13,)), SimGPU()])
    clock = Clock()
    with sim.in_process():
        reader = ClockReader(clock=clock, wall=lambda: 1_800_000_000.0)
        first = reader.read([0, 1])
        assert "xid" not in first[0].to_fields()  # before the event set existed: not delivered
        sim.update(0, xids=(13, 79))
        clock.now += 1.0
        second = reader.read([0, 1])
        clock.now += 1.0
        third = reader.read([0, 1])
    assert (second[0].xid, second[0].xid_t) == (79, 1_800_000_000.0)
    assert third[0].xid == 79  # the last XID stays the last until another comes
    assert second[1].xid is None and third[1].xid is None  # the other GPU had none


def test_what_the_driver_cannot_say_is_left_out(simnvml) -> None:
    """NotSupported and a driver without events leave their keys out; the rest still come. A
    driver older than the EventReasons name answers through the ThrottleReasons one."""
    sim = simnvml(
        gpus=[
            SimGPU(
                errors={
                    "nvmlDeviceGetCurrentClocksEventReasons": NOT_SUPPORTED,
                    "nvmlDeviceGetCurrentClocksThrottleReasons": NOT_SUPPORTED,
                    "nvmlDeviceGetTotalEccErrors": NOT_SUPPORTED,
                },
                event_types=0,
                xids=(),
            )
        ]
    )
    with sim.in_process():
        reader = ClockReader(min_interval_s=0)
        reader.read([0])
        sim.update(0, xids=(31,))
        fields = reader.read([0])[0].to_fields()
    assert set(fields) == {"sm_clock_mhz", "sm_clock_max_mhz", "temp_c", "power_w", "power_limit_w"}

    old = simnvml(
        gpus=[SimGPU(clock_event_reasons=0x4)], missing=("nvmlDeviceGetCurrentClocksEventReasons",)
    )
    with old.in_process():
        assert ClockReader().read([0])[0].clock_event_reasons == 0x4


def test_each_gpu_is_read_at_most_once_a_second(simnvml) -> None:
    sim = simnvml(gpus=4)
    clock = Clock()
    with sim.in_process():
        reader = ClockReader(clock=clock)
        for _ in range(10):  # ten callers within the same second
            assert set(reader.read([0, 1, 2, 3])) == {0, 1, 2, 3}
            clock.now += 0.09
        assert reader.reads == 4
        clock.now += 0.2
        reader.read([0, 1, 2, 3])
        assert reader.reads == 8
