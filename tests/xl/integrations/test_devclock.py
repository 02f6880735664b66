"""The step split on the device's clock, without a GPU: the step clock driven as torch's hooks
drive it, on a fake host clock, with a fake CUDA whose events complete when its stream gets to
them (tests/support/fakecudaevents.py). The figures are the stream's own; the training thread
never waits for the device; a step whose events are late is reported when they are done; a rank
whose losses are on the CPU is timed on the host exactly as before."""

from __future__ import annotations

import threading
import weakref
from dataclasses import replace
from typing import Any

import pytest
from fakecudaevents import FakeCuda

from xl.integrations.devclock import MAX_EVENTS, DeviceClock, fit
from xl.integrations.stepclock import StepClock
from xl.integrations.steplines import HOLD_S, LINE_EVERY_S, StepLines

SYNCS = ("synchronize", "event.synchronize")
READS = ("event.query", "event.elapsed_time")


class Fake:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Opt:
    pass


class Loss:
    ndim = 0

    def __init__(self, value: float, is_cuda: bool) -> None:
        self.value, self.is_cuda = value, is_cuda

    def detach(self) -> Loss:
        return self

    def item(self) -> float:
        return self.value


def _clocks(cuda: bool = True) -> tuple[StepClock, Fake, FakeCuda]:
    fake = Fake()
    steps = StepClock(clock=fake, wall=lambda: 1000.0 + fake.now)
    dev = FakeCuda(fake)
    if cuda:
        steps.cuda_clock = DeviceClock(dev)
    return steps, fake, dev


def _step(
    steps: StepClock,
    fake: Fake,
    dev: FakeCuda,
    opt: Any,
    *,
    on_cuda: bool = True,
    wait: float = 0.002,
    copy: float = 0.003,
    fwd: float = 0.040,
    bwd: float = 0.060,
    comm: float = 0.025,
    opt_s: float = 0.010,
    host: float = 0.001,
    after: float = 0.3,
) -> None:
    """One step as a GPU loop makes it: the host enqueues, the stream runs it later. Each host
    call takes ``host`` seconds; after the optimizer step the script does ``after`` seconds of
    its own (logging) before it asks for the next batch."""
    fake.now += wait
    steps.fetched(wait, 8)
    fake.now += host
    dev.launch(copy)  # x.to("cuda", non_blocking=True)
    start = steps.enter()  # forward
    dev.launch(fwd)
    fake.now += host
    steps.leave(start)
    steps.backward(Loss(0.5, on_cuda))
    start = steps.enter()  # backward
    dev.launch(bwd)
    fake.now += host
    steps.graph_done()
    dev.stream_wait(dev.queued_until + comm)  # DDP's last bucket: the stream waits for NCCL
    fake.now += host
    steps.backward_done()
    steps.leave(start)
    steps.opt_pre()
    dev.launch(opt_s)
    fake.now += host
    steps.opt_post(opt)
    fake.now += after


# Each clock's lines, made once as the sender's are.
_LINES: weakref.WeakKeyDictionary[StepClock, StepLines] = weakref.WeakKeyDictionary()


def _lines(steps: StepClock) -> StepLines:
    return _LINES.setdefault(steps, StepLines(steps))


def _on_sender(steps: StepClock, final: bool = False) -> tuple[float, dict[str, Any]] | None:
    """``collect`` on a thread named as the sender's is, as the sender calls it."""
    got: list[Any] = []
    lines = _lines(steps)
    thread = threading.Thread(target=lambda: got.append(lines.collect(final=final)), name="xl-log")
    thread.start()
    thread.join()
    return got[0]


def _next_grid(fake: Fake) -> None:
    """Move the host clock past the next grid point and its hold: the next line is due."""
    wall = 1000.0 + fake.now
    fake.now = ((wall // LINE_EVERY_S) + 1) * LINE_EVERY_S + HOLD_S * 1.5 - 1000.0


def _warm(steps: StepClock, fake: Fake, dev: FakeCuda, opt: Any) -> None:
    # The first CUDA loss turns the device clock on from the next step: this one is on the host.
    _step(steps, fake, dev, opt)
    _next_grid(fake)
    _t, line = _on_sender(steps)
    assert "clock" not in line


def test_the_split_comes_from_the_events_not_the_host() -> None:
    steps, fake, dev = _clocks()
    opt = Opt()
    _warm(steps, fake, dev, opt)
    _step(steps, fake, dev, opt)
    _next_grid(fake)
    _t, line = _on_sender(steps)
    assert line["clock"] == "cuda"
    # The stream's own times: the batch's 2 ms wait plus the 4 ms until it was on the device (the
    # host enqueued its 3 ms copy 1 ms after the handover), forward + backward + optimizer, and
    # the stream's wait for the last bucket; the host took 1 ms for each of those.
    assert (line["data_s"], line["compute_s"], line["comm_s"]) == (0.006, 0.11, 0.025)
    assert line["other_s"] == pytest.approx(line["step_s"] - 0.141, abs=2e-6)
    assert line["other_s"] > 0.29  # the script's logging between steps, on the host


def test_the_training_thread_never_waits_for_the_device() -> None:
    steps, fake, dev = _clocks()
    opt = Opt()
    _warm(steps, fake, dev, opt)
    for _ in range(20):
        _step(steps, fake, dev, opt, after=0.01)
        if steps.step % 5 == 0:
            fake.now += 0.5
            _on_sender(steps)
    main = threading.main_thread().name
    assert sum(dev.calls[(main, call)] for call in SYNCS + READS) == 0, dev.calls
    assert dev.calls[(main, "event.record")] >= 20 * 5  # it records, and nothing else
    assert sum(dev.calls[("xl-log", call)] for call in READS) > 0
    assert sum(dev.calls[("xl-log", call)] for call in SYNCS) == 0
    # Events are read back into the pool: a handful is made, not six a step.
    assert dev.made <= 40


def test_a_step_whose_events_are_late_is_reported_when_they_are_done() -> None:
    steps, fake, dev = _clocks()
    opt = Opt()
    _warm(steps, fake, dev, opt)
    _step(steps, fake, dev, opt, fwd=5.0)  # the device is 5 s behind the host
    _step(steps, fake, dev, opt)  # queued behind it
    _next_grid(fake)
    assert fake.now < dev.queued_until
    assert _on_sender(steps) is None  # not waited for: nothing yet
    assert len(steps.ended) == 2  # both kept, in order
    fake.now = dev.queued_until
    _next_grid(fake)
    _t, line = _on_sender(steps)
    assert line["step"] == 3 and line["steps"] == 2 and line["clock"] == "cuda"
    # The late step's 5 s of forward are its compute, held to its wall time (the host ended it
    # ~0.3 s after the previous one): the five parts still add up to step_s.
    parts = sum(line[k] for k in ("data_s", "compute_s", "comm_s", "other_s"))
    assert parts == pytest.approx(line["step_s"], abs=1e-5)


def test_a_flush_on_the_training_thread_sends_late_steps_on_the_hosts_clock() -> None:
    steps, fake, dev = _clocks()
    opt = Opt()
    _warm(steps, fake, dev, opt)
    _step(steps, fake, dev, opt, fwd=5.0)
    # xl.flush() or the rank's end, on the training thread
    _t, line = _lines(steps).collect(final=True)
    assert line["step"] == 2 and "clock" not in line
    assert line["compute_s"] < 0.01  # the host's figure: it never waited for the 5 s
    main = threading.main_thread().name
    assert sum(dev.calls[(main, call)] for call in SYNCS) == 0


def test_a_rank_whose_losses_are_on_the_cpu_is_timed_as_before() -> None:
    rows = []
    for cuda in (True, False):
        steps, fake, dev = _clocks(cuda)
        opt = Opt()
        for _ in range(4):
            _step(steps, fake, dev, opt, on_cuda=False)
        rows.append([replace(row, loss=row.loss.value, timed=None) for row in steps.ended])
        _t, line = _lines(steps).collect()
        assert "clock" not in line
        assert dev.made == 0 and not dev.calls.get((threading.main_thread().name, "Event"))
    assert rows[0] == rows[1]


def test_the_pool_has_a_bound_and_a_step_without_events_stays_on_the_host() -> None:
    steps, fake, dev = _clocks()
    opt = Opt()
    _warm(steps, fake, dev, opt)
    assert steps.cuda_clock is not None
    steps.cuda_clock.made = MAX_EVENTS  # every event is out, none read back yet
    _step(steps, fake, dev, opt)
    _next_grid(fake)
    _t, line = _on_sender(steps)
    assert "clock" not in line and line["step"] == 2


def test_device_time_is_held_to_the_steps_wall_time() -> None:
    assert fit(1.0, 0.1, 0.5, 0.2) == (0.1, 0.5, 0.2)  # fits: as it is
    data, compute, comm = fit(1.0, 0.1, 2.0, 0.2)  # compute gives way first
    assert (data, comm) == (0.1, 0.2) and compute == pytest.approx(0.7)
    data, compute, comm = fit(1.0, 0.6, 2.0, 0.9)  # then data and comm alike
    assert compute == 0.0 and data + comm == pytest.approx(1.0)
    assert data / comm == pytest.approx(0.6 / 0.9)


def test_real_torch_hooks_record_the_boundaries_on_the_current_stream() -> None:
    # Real torch on the CPU with the hooks in place and the fake device clock turned on: a
    # one-rank gloo DDP step records its start, the end of the batch's copy, backward's tail
    # (DDP's reducer) and an explicit Work.wait() as pairs, and its end; the sender reads them.
    torch = pytest.importorskip("torch")
    import torch.distributed as dist  # noqa: PLC0415 - only with torch
    from torch.utils.data import DataLoader, TensorDataset  # noqa: PLC0415 - as above

    from xl.integrations import torchsteps  # noqa: PLC0415 - as above

    fake = Fake()
    steps = StepClock()
    unhook = torchsteps.hook(torch, steps)
    dev = FakeCuda(lambda: fake.now)
    steps.cuda_clock = steps.device = DeviceClock(dev)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(16, 8)
        for xb, yb in DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            dist.all_reduce(loss.detach(), async_op=True).wait()
            opt.step()
            opt.zero_grad()
        main = threading.main_thread().name
        # start, the copy's end, backward's tail (2), the Work.wait (2), the end: 7 a step
        assert dev.calls[(main, "event.record")] == 4 * 7
        assert sum(dev.calls[(main, call)] for call in SYNCS + READS) == 0
        fake.now += 1.0
        _t, line = _on_sender(steps, final=True)
        assert line["clock"] == "cuda" and line["step"] == 4
    finally:
        dist.destroy_process_group()
        unhook()


def test_events_of_a_step_sent_on_the_hosts_clock_go_back_to_the_pool_once_done() -> None:
    # A script that calls xl.flush() while its device is behind: those steps go out on the
    # host's clock, and their events are reused once the device is past them.
    steps, fake, dev = _clocks()
    opt = Opt()
    _warm(steps, fake, dev, opt)
    for _ in range(30):
        _step(steps, fake, dev, opt, fwd=1.0, after=0.01)
        _lines(steps).collect(final=True)  # flushed on the training thread: the device is behind
    made = dev.made
    fake.now = dev.queued_until + 1.0
    for _ in range(30):
        _step(steps, fake, dev, opt, after=0.3)
        _next_grid(fake)
        _on_sender(steps)
    assert dev.made <= made + 12  # the flushed steps' events served the later steps


def test_events_cuda_cannot_compare_leave_the_step_on_the_hosts_clock() -> None:
    # elapsed_time between events of two devices raises: that step goes out with its host
    # figures, and the steps after it are not held up behind it.
    steps, fake, dev = _clocks()
    opt = Opt()
    _warm(steps, fake, dev, opt)
    _step(steps, fake, dev, opt)
    _step(steps, fake, dev, opt)
    broken = steps.ended[0].timed

    def elapsed(end: Any) -> float:
        raise RuntimeError("events recorded on different devices")

    broken.start.elapsed_time = elapsed
    _next_grid(fake)
    _t, line = _on_sender(steps)
    assert line["step"] == 3 and line["steps"] == 2
    assert "clock" not in line  # one of two steps on the device: the line is the host's
    assert not steps.ended
