"""The step clock's accounting on a fake clock: exact figures, no torch, no timing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from xl.integrations.stepclock import EVAL_EVERY_S, HOLD_S, LINE_EVERY_S, StepClock
from xl.integrations.torchsteps import _cuda_peak


class Fake:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _clock() -> tuple[StepClock, Fake]:
    fake = Fake()
    return StepClock(clock=fake, wall=lambda: 1000.0 + fake.now), fake


class Opt:
    pass


def _step(steps: StepClock, fake: Fake, opt: Any, seconds: float = 0.001) -> None:
    steps.opt_pre()
    fake.now += seconds
    steps.opt_post(opt)


def test_waits_inside_a_region_are_not_compute_and_the_parts_add_up() -> None:
    steps, fake = _clock()
    opt = Opt()
    steps.fetched(0.0, 8)  # the first step starts here
    fake.now += 0.2  # the script's own code: other
    start = steps.enter()  # forward
    fake.now += 0.1
    steps.leave(start)
    start = steps.enter()  # backward: 0.3 s, of which the last 0.25 s wait for DDP's buckets
    fake.now += 0.05
    steps.graph_done()
    fake.now += 0.25
    steps.backward_done()
    steps.leave(start)
    _step(steps, fake, opt, 0.05)
    _t, line = steps.collect()
    assert line["step"] == 1 and line["samples"] == 8
    assert line["step_s"] == 0.65
    assert (line["data_s"], line["compute_s"], line["comm_s"], line["other_s"]) == (
        0.0,
        0.2,
        0.25,
        0.2,
    )


def test_a_wait_in_a_later_final_callback_counts_once() -> None:
    # FSDP2: its final callback waits on the reduce-scatter (Work.wait, counted as it happens)
    # inside the tail that follows the graph: the tail counts only what is not counted yet.
    steps, fake = _clock()
    start = steps.enter()
    fake.now += 0.1
    steps.graph_done()
    fake.now += 0.05
    steps.waited(0.3, data=False)
    fake.now += 0.3
    steps.backward_done()
    steps.leave(start)
    _step(steps, fake, Opt(), 0.0)
    _t, line = steps.collect()
    assert line["comm_s"] == 0.35 and line["compute_s"] == 0.1 and line["other_s"] == 0.0


def test_a_step_that_raised_does_not_leave_its_region_open() -> None:
    steps, fake = _clock()
    opt = Opt()
    _step(steps, fake, opt)
    steps.opt_pre()  # optimizer.step raised: its post hook never ran
    fake.now += 1.0
    _step(steps, fake, opt, 0.5)
    assert steps.depth == 0
    start = steps.enter()
    assert start >= 0  # a forward at the top is timed again
    steps.leave(start)


def test_the_leader_and_the_takeover() -> None:
    steps, fake = _clock()
    d, g, new = Opt(), Opt(), Opt()
    for _ in range(3):
        _step(steps, fake, d)
        _step(steps, fake, g)  # alternating 1:1: never takes the lead
    assert steps.step == 3
    for _ in range(3):
        _step(steps, fake, new)  # the leader is gone: the second step of another takes over
    assert steps.step == 5


def test_a_step_just_ended_waits_for_the_next_call_unless_final() -> None:
    steps, fake = _clock()
    _step(steps, fake, Opt())
    assert steps.collect(final=False) is None  # younger than HOLD_S
    fake.now += HOLD_S * 2
    assert steps.collect(final=False) is not None
    _step(steps, fake, Opt())
    assert steps.collect(final=True) is not None


def test_one_line_at_most_every_line_every_s_and_no_step_lost() -> None:
    # The sender asks up to ten times a second: the steps wait for the next line, and that line
    # carries all of them (how many, the last step and its loss, the per-step mean).
    steps, fake = _clock()
    opt = Opt()
    _step(steps, fake, opt, seconds=0.01)
    fake.now += HOLD_S * 2
    sent_at = fake.now
    _t, first = steps.collect(final=False)
    assert first["step"] == 1 and "steps" not in first
    for _ in range(3):
        steps.loss = SimpleNamespace(ndim=0)
        _step(steps, fake, opt, seconds=0.01)
    fake.now += HOLD_S * 1.5  # old enough, but within LINE_EVERY_S of the last line
    assert fake.now - sent_at < LINE_EVERY_S
    assert steps.collect(final=False) is None
    fake.now += LINE_EVERY_S
    _t, line = steps.collect(final=False)
    assert line["step"] == 4 and line["steps"] == 3
    # A mean over its own three steps (from step 1's end to step 4's), not the time between lines.
    assert abs(line["step_s"] - (HOLD_S * 2 + 0.03) / 3) < 1e-6
    # The rank's end (or xl.flush) sends the last steps at once, however recent the last line.
    _step(steps, fake, opt)
    _t, last = steps.collect(final=True)
    assert last["step"] == 5
    assert steps.collect(final=True) is None  # nothing ended since: nothing to say


def test_keys_the_rank_gives_itself_are_left_out() -> None:
    steps, fake = _clock()
    steps.loss = SimpleNamespace(ndim=0)
    steps.samples, steps.batches = 4, 1
    _step(steps, fake, Opt())
    _t, line = steps.collect({"step", "loss", "samples"})
    assert not {"step", "loss", "samples", "samples_per_s"} & set(line)
    assert {"step_s", "data_s", "compute_s", "comm_s", "other_s"} <= set(line)


def test_cuda_peak_is_the_allocators_counter_reset_each_step() -> None:
    calls: list[str] = []
    peaks = iter([3 * 2**30, 2**30])

    def max_memory_allocated() -> int:
        calls.append("max")
        return next(peaks)

    cuda = SimpleNamespace(
        is_initialized=lambda: True,
        max_memory_allocated=max_memory_allocated,
        reset_peak_memory_stats=lambda: calls.append("reset"),
        synchronize=lambda: calls.append("sync"),
    )
    steps, fake = _clock()
    steps.memory = _cuda_peak(SimpleNamespace(cuda=cuda))
    _step(steps, fake, Opt())
    _step(steps, fake, Opt())
    _t, line = steps.collect()
    assert line["mem_peak_mib"] == 3072.0  # the line's steps' highest peak
    assert calls == ["max", "reset", "max", "reset"]  # host-side counters, never a sync
    idle = _cuda_peak(SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: False)))
    assert idle() is None  # a rank that never used CUDA: no key


def test_a_script_that_times_its_own_steps_is_not_timed_twice() -> None:
    # A script whose xl.log gives step, loss, samples and its own step_s split: the hooks' lines
    # would only repeat its steps (the digest counted each step twice), so none is sent.
    steps, fake = _clock()
    opt = Opt()
    steps.fetched(0.0, 4)
    _step(steps, fake, opt)
    fake.now += 1.0
    assert steps.collect({"step", "loss", "samples", "step_s"}) is None
    # With only step given, the split still comes (the time split is added to the script's keys).
    steps.fetched(0.0, 4)
    _step(steps, fake, opt)
    fake.now += 1.0
    _t, line = steps.collect({"step"})
    assert "step" not in line and line["step_s"] > 0


def test_an_eval_between_steps_says_the_rank_is_alive_at_most_once_a_second_and_never_a_step() -> (
    None
):
    steps, fake = _clock()
    opt = Opt()
    steps.eval_batches = 5  # an eval before training: the rank is not training yet
    assert steps.collect() is None
    steps.fetched(0.0, 8)
    _step(steps, fake, opt)
    _t, line = steps.collect()
    assert line["step"] == 1
    assert steps.collect() is None  # no step, no eval batch since: nothing to say
    steps.eval_batches += 3
    t, line = steps.collect()
    assert line == {"eval_batches": 8} and t == 1000.0 + fake.now
    steps.eval_batches += 3
    assert steps.collect() is None  # within EVAL_EVERY_S of the last such line
    fake.now += EVAL_EVERY_S
    _t, line = steps.collect()
    assert line == {"eval_batches": 11}
    fake.now += EVAL_EVERY_S
    assert steps.collect() is None  # the eval ended: no batch since
    steps.fetched(0.0, 8)
    _step(steps, fake, opt)
    _t, line = steps.collect()
    assert line["step"] == 2 and "eval_batches" not in line
