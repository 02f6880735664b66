"""The step clock's accounting on a fake clock, and the lines the sender makes of it: exact
figures, no torch, no timing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from xl.integrations.stepclock import StepClock
from xl.integrations.steplines import EVAL_EVERY_S, HOLD_S, LINE_EVERY_S, StepLines
from xl.integrations.torchsteps import _cuda_peak


class Fake:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _clock() -> tuple[StepClock, Fake, StepLines]:
    fake = Fake()
    steps = StepClock(clock=fake, wall=lambda: 1000.0 + fake.now)
    return steps, fake, StepLines(steps)


class Opt:
    pass


def _step(steps: StepClock, fake: Fake, opt: Any, seconds: float = 0.001) -> None:
    steps.opt_pre()
    fake.now += seconds
    steps.opt_post(opt)


def test_compute_runs_from_the_batch_to_the_optimizer_less_the_waits_and_other_is_after() -> None:
    steps, fake, lines = _clock()
    opt = Opt()
    steps.fetched(0.0, 8)  # the first step starts here
    _step(steps, fake, opt, 0.01)
    fake.now += 0.3  # the script logs after its optimizer step: other
    steps.waited(0.05, data=False)  # its own all_reduce of the loss for the log: comm, not other
    fake.now += 0.05
    fake.now += 0.1  # the next batch takes 0.1 s to come: asked for at the end of the logging
    steps.fetched(0.1, 8)
    fake.now += 0.2  # a custom loss's tensor math, outside any module: compute
    start = steps.enter()  # forward
    fake.now += 0.1
    steps.leave(start)
    fake.now += 0.15  # a metric between forward and backward: compute
    start = steps.enter()  # backward: 0.3 s, of which the last 0.25 s wait for DDP's buckets
    fake.now += 0.05
    steps.graph_done()
    fake.now += 0.25
    steps.backward_done()
    steps.leave(start)
    _step(steps, fake, opt, 0.05)
    rows = list(steps.ended)
    step_s, data, compute, comm = (
        rows[1].step_s,
        rows[1].data_s,
        rows[1].compute_s,
        rows[1].comm_s,
    )
    assert round(step_s, 9) == 1.25
    assert (round(data, 9), round(compute, 9), round(comm, 9)) == (0.1, 0.55, 0.3)
    lines.collect()  # the first line: step 1
    steps.ended.extend(rows[1:])
    _t, line = lines.collect()
    assert line["step"] == 2
    assert (line["data_s"], line["compute_s"], line["comm_s"], line["other_s"]) == (
        0.1,
        0.55,
        0.3,
        0.3,
    )


def test_a_step_without_a_dataloader_starts_its_compute_at_its_first_forward() -> None:
    steps, fake, lines = _clock()
    opt = Opt()
    _step(steps, fake, opt, 0.01)
    fake.now += 0.4  # logging, a checkpoint, and the next batch made in the loop: other
    start = steps.enter()
    fake.now += 0.1
    steps.leave(start)
    fake.now += 0.2  # the loss computed outside the model: compute
    _step(steps, fake, opt, 0.05)
    _t, line = lines.collect()
    assert line["steps"] == 2
    row = steps.ended  # consumed
    assert not row
    assert round(line["other_s"] * 2, 9) == 0.4
    assert round(line["compute_s"] * 2, 9) == round(0.01 + 0.1 + 0.2 + 0.05, 9)


def test_the_loss_is_the_sum_of_the_micro_batches_since_the_last_optimizer_step() -> None:
    steps, fake, lines = _clock()
    opt = Opt()
    for value in (0.25, 0.5, 0.125, 0.0625):  # four micro-batches, each loss / 4
        steps.backward(SimpleNamespace(ndim=0, detach=lambda v=value: Value(v)))
    _step(steps, fake, opt)
    steps.backward(SimpleNamespace(ndim=0, detach=lambda: Value(2.0)))  # one backward: as it is
    _step(steps, fake, opt)
    rows = list(steps.ended)
    _t, line = lines.collect()
    assert line["loss"] == 2.0  # one backward: its value, read by the sender
    steps.ended.extend(rows[:1])
    _t, line = lines.collect()
    assert line["loss"] == 0.9375


def test_another_optimizers_step_starts_the_sum_again() -> None:
    # A GAN: the discriminator leads; the generator's loss belongs to the generator's step.
    steps, fake, lines = _clock()
    d, g = Opt(), Opt()
    for _ in range(2):
        steps.backward(SimpleNamespace(ndim=0, detach=lambda: Value(1.0)))  # errD_real
        steps.backward(SimpleNamespace(ndim=0, detach=lambda: Value(0.5)))  # errD_fake
        _step(steps, fake, d)
        steps.backward(SimpleNamespace(ndim=0, detach=lambda: Value(7.0)))  # errG
        _step(steps, fake, g)
    _t, line = lines.collect()
    assert line["step"] == 2 and line["loss"] == 1.5  # errD, as the DCGAN tutorial prints it


class Value:
    """A detached 0-d tensor's stand-in: ``item()`` and ``+`` (the fold)."""

    ndim = 0

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value

    def __add__(self, other: Value) -> Value:
        return Value(self.value + other.value)


def test_a_loop_that_never_steps_keeps_its_losses_bounded() -> None:
    from xl.integrations.stepclock import FOLD_LOSSES  # noqa: PLC0415 - beside its test

    steps, fake, lines = _clock()
    for _ in range(FOLD_LOSSES * 3 + 1):
        steps.backward(SimpleNamespace(ndim=0, detach=lambda: Value(1.0)))
    assert len(steps.loss) <= FOLD_LOSSES
    _step(steps, fake, Opt())
    _t, line = lines.collect()
    assert line["loss"] == FOLD_LOSSES * 3 + 1


def test_a_wait_in_a_later_final_callback_counts_once() -> None:
    # FSDP2: its final callback waits on the reduce-scatter (Work.wait, counted as it happens)
    # inside the tail that follows the graph: the tail counts only what is not counted yet.
    steps, fake, lines = _clock()
    start = steps.enter()
    fake.now += 0.1
    steps.graph_done()
    fake.now += 0.05
    steps.waited(0.3, data=False)
    fake.now += 0.3
    steps.backward_done()
    steps.leave(start)
    _step(steps, fake, Opt(), 0.0)
    _t, line = lines.collect()
    assert line["comm_s"] == 0.35 and line["compute_s"] == 0.1 and line["other_s"] == 0.0


def test_a_step_that_raised_does_not_leave_its_region_open() -> None:
    steps, fake, _ = _clock()
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
    steps, fake, _ = _clock()
    d, g, new = Opt(), Opt(), Opt()
    for _ in range(3):
        _step(steps, fake, d)
        _step(steps, fake, g)  # alternating 1:1: never takes the lead
    assert steps.step == 3
    for _ in range(3):
        _step(steps, fake, new)  # the leader is gone: the second step of another takes over
    assert steps.step == 5


def test_a_step_just_ended_waits_for_the_next_grid_point_unless_final() -> None:
    steps, fake, lines = _clock()  # wall 1100.0: a grid point
    fake.now += LINE_EVERY_S - HOLD_S / 2
    _step(steps, fake, Opt())  # ends just before the next grid point
    fake.now = 100.0 + LINE_EVERY_S + HOLD_S / 2
    assert lines.collect(final=False) is None  # that point is not HOLD_S old yet
    fake.now += HOLD_S
    assert lines.collect(final=False) is not None
    _step(steps, fake, Opt())
    assert lines.collect(final=True) is not None


def test_lines_are_cut_on_the_wall_clock_grid_and_no_step_is_lost() -> None:
    # Ranks that step together end each step within a moment of each other: whenever their
    # senders ask, their lines are cut after the same step and carry the same steps' rates.
    cut: list[list[tuple[int, int]]] = []
    for phase in (0.0, 0.07, 0.19):  # when the rank's sender first asks, in its wake cycle
        steps, fake, lines = _clock()
        opt = Opt()
        got: list[tuple[int, int]] = []
        asked = 1100.0 + phase
        for _ in range(100):  # a 10 ms step; the sender asks every 0.1 s from its phase on
            steps.fetched(0.0, 4)
            _step(steps, fake, opt, seconds=0.01)
            if 1000.0 + fake.now >= asked:
                asked += 0.1
                out = lines.collect(final=False)
                if out is not None:
                    got.append((out[1]["step"], out[1].get("steps", 1)))
        cut.append(got)
    assert cut[0] == cut[1] == cut[2], cut
    # One line per grid point, each holding the steps of its slot: 25 steps of 10 ms.
    assert [n for _, n in cut[0][1:]] == [25] * (len(cut[0]) - 1)


def test_the_sender_wakes_just_after_each_line_is_due() -> None:
    from xl.client.sender import Sender  # noqa: PLC0415 - the client's side of the grid

    sender = Sender.__new__(Sender)
    sender.step_source, sender.logged = (lambda given, final: None), False
    sender.step_grid = (LINE_EVERY_S, HOLD_S)
    import time  # noqa: PLC0415 - the wall clock the grid is on

    wait = sender.interval()
    due = time.time() + wait - HOLD_S  # the grid point the wake-up is for
    assert 0 < wait <= LINE_EVERY_S + 0.001
    assert abs(due / LINE_EVERY_S - round(due / LINE_EVERY_S)) < 0.1


def test_keys_the_rank_gives_itself_are_left_out() -> None:
    steps, fake, lines = _clock()
    steps.loss = SimpleNamespace(ndim=0)
    steps.samples, steps.batches = 4, 1
    _step(steps, fake, Opt())
    _t, line = lines.collect({"step", "loss", "samples"})
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
    steps, fake, lines = _clock()
    steps.memory = _cuda_peak(SimpleNamespace(cuda=cuda))
    _step(steps, fake, Opt())
    _step(steps, fake, Opt())
    _t, line = lines.collect()
    assert line["mem_peak_mib"] == 3072.0  # the line's steps' highest peak
    assert calls == ["max", "reset", "max", "reset"]  # host-side counters, never a sync
    idle = _cuda_peak(SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: False)))
    assert idle() is None  # a rank that never used CUDA: no key
    # A torch built without CUDA (or ROCm) has no allocator peak to read: nothing is called
    # on its steps, and a line has no key.
    cpu_build = SimpleNamespace(version=SimpleNamespace(cuda=None, hip=None), cuda=cuda)
    assert _cuda_peak(cpu_build) is None
    rocm = SimpleNamespace(version=SimpleNamespace(cuda=None, hip="6.2"), cuda=cuda)
    assert _cuda_peak(rocm) is not None


def test_a_script_that_times_its_own_steps_is_not_timed_twice() -> None:
    # A script whose xl.log gives step, loss, samples and its own step_s split: the hooks' lines
    # would only repeat its steps (the digest counted each step twice), so none is sent.
    steps, fake, lines = _clock()
    opt = Opt()
    steps.fetched(0.0, 4)
    _step(steps, fake, opt)
    fake.now += 1.0
    assert lines.collect({"step", "loss", "samples", "step_s"}) is None
    # With only step given, the split still comes (the time split is added to the script's keys).
    steps.fetched(0.0, 4)
    _step(steps, fake, opt)
    fake.now += 1.0
    _t, line = lines.collect({"step"})
    assert "step" not in line and line["step_s"] > 0


def test_an_eval_between_steps_says_the_rank_is_alive_at_most_once_a_second_and_never_a_step() -> (
    None
):
    steps, fake, lines = _clock()
    opt = Opt()
    steps.eval_batches = 5  # an eval before training: the rank is not training yet
    assert lines.collect() is None
    steps.fetched(0.0, 8)
    _step(steps, fake, opt)
    _t, line = lines.collect()
    assert line["step"] == 1
    assert lines.collect() is None  # no step, no eval batch since: nothing to say
    steps.eval_batches += 3
    t, line = lines.collect()
    assert line == {"eval_batches": 8} and t == 1000.0 + fake.now
    steps.eval_batches += 3
    assert lines.collect() is None  # within EVAL_EVERY_S of the last such line
    fake.now += EVAL_EVERY_S
    _t, line = lines.collect()
    assert line == {"eval_batches": 11}
    fake.now += EVAL_EVERY_S
    assert lines.collect() is None  # the eval ended: no batch since
    steps.fetched(0.0, 8)
    _step(steps, fake, opt)
    _t, line = lines.collect()
    assert line["step"] == 2 and "eval_batches" not in line


def test_backward_calls_not_watched_get_the_watched_ones_mean_wait_as_comm() -> None:
    # A fast DDP loop: only one backward call in WATCH_EVERY_S is watched for the wait after
    # its graph; the others' tails count as compute on the training thread and are moved to
    # comm on the sender, at the watched calls' mean. The five figures still add up.
    steps, fake, lines = _clock()
    opt = Opt()

    def step(watched: bool, tail: float) -> None:
        start = steps.enter()
        fake.now += 0.004  # the graph
        if watched:
            steps.graph_done()
        else:
            steps.unwatched += 1
        fake.now += tail  # DDP's buckets
        if watched:
            steps.backward_done()
        steps.leave(start)
        _step(steps, fake, opt, 0.001)

    steps.fetched(0.0, 8)
    step(True, 0.003)
    step(False, 0.005)
    step(False, 0.005)
    step(True, 0.001)
    _t, line = lines.collect()
    # two watched waits, 0.004 s in all: the two others are given 0.002 s each
    assert line["comm_s"] == pytest.approx((0.004 + 2 * 0.002) / 4)
    assert line["compute_s"] == pytest.approx((0.005 + 0.010 + 0.010 + 0.005 - 2 * 0.002) / 4)
    parts = sum(line[k] for k in ("data_s", "compute_s", "comm_s", "other_s"))
    assert parts == pytest.approx(line["step_s"])
    # A line with no watched call (steps slower than the line) keeps the last mean.
    step(False, 0.005)
    _t, line = lines.collect()
    assert line["comm_s"] == pytest.approx(0.002)


def test_one_watched_call_preempted_does_not_make_its_line_s_other_calls_wait_as_long() -> None:
    # On a busy machine one watched call's tail held 50 ms (the rank lost its core): the calls
    # not watched get the watched calls' median, 1 ms, not their mean.
    steps, fake, lines = _clock()
    steps.fetched(0.0, 8)
    for i in range(25):
        start = steps.enter()
        fake.now += 0.004
        if i % 5 == 0:
            steps.graph_done()
            fake.now += 0.05 if i == 10 else 0.001
            steps.backward_done()
        else:
            steps.unwatched += 1
            fake.now += 0.001
        steps.leave(start)
        _step(steps, fake, Opt(), 0.001)
    _t, line = lines.collect()
    assert line["comm_s"] == pytest.approx((4 * 0.001 + 0.05 + 20 * 0.001) / 25)


def test_a_line_whose_calls_were_all_watched_moves_nothing() -> None:
    steps, fake, lines = _clock()
    steps.fetched(0.0, 8)
    for _ in range(3):
        start = steps.enter()
        fake.now += 0.01
        steps.graph_done()
        fake.now += 0.02
        steps.backward_done()
        steps.leave(start)
        _step(steps, fake, Opt(), 0.001)
    _t, line = lines.collect()
    assert line["comm_s"] == pytest.approx(0.02) and line["compute_s"] == pytest.approx(0.011)
