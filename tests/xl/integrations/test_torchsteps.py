"""torch's own steps, in this process with real torch on the CPU: what a step is, the loss and
samples each step reports, and where its time went (xl.integrations.torchsteps / stepclock)."""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset  # noqa: E402

from xl.client.metricline import OwnTrain, drain  # noqa: E402
from xl.integrations import torchsteps  # noqa: E402
from xl.integrations.stepclock import Ended, StepClock  # noqa: E402
from xl.integrations.steplines import StepLines  # noqa: E402


@pytest.fixture
def steps() -> Iterator[StepClock]:
    torch.manual_seed(0)
    clock = StepClock()
    unhook = torchsteps.hook(torch, clock)
    try:
        yield clock
    finally:
        unhook()


def _rows(clock: StepClock) -> list[Ended]:
    return list(clock.ended)


def _adds_up(row: Ended) -> None:
    step_s, data, compute, comm = row.step_s, row.data_s, row.compute_s, row.comm_s
    assert min(step_s, data, compute, comm) >= 0
    assert data + compute + comm <= step_s + 1e-6


def _loader(n: int = 32, batch: int = 4) -> DataLoader:
    x = torch.randn(n, 8)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=batch)


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def test_a_plain_loop_reports_each_step_its_loss_and_samples(steps: StepClock) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    truth = []
    for x, y in _loader(n=30, batch=4):  # 8 steps, the last of 2 samples
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        truth.append(loss.item())
    rows = _rows(steps)
    assert [r.step for r in rows] == list(range(1, 9))
    assert [r.loss.item() for r in rows] == pytest.approx(truth)
    assert [r.samples for r in rows] == [4] * 7 + [2]
    for row in rows:
        _adds_up(row)
        assert row.compute_s > 0  # forward, backward and the optimizer are compute
    _t, line = StepLines(steps).collect()
    assert line["step"] == 8 and line["steps"] == 8 and line["samples"] == 30
    assert line["loss"] == pytest.approx(truth[-1])
    parts = line["data_s"] + line["compute_s"] + line["comm_s"] + line["other_s"]
    assert parts == pytest.approx(line["step_s"], abs=1e-5)
    assert line["samples_per_s"] == pytest.approx(30 / (line["step_s"] * 8), rel=1e-3)
    assert "mem_peak_mib" not in line  # no CUDA here
    assert StepLines(steps).collect() is None  # consumed


def test_gradient_accumulation_counts_optimizer_steps_and_sums_micro_batches(
    steps: StepClock,
) -> None:
    # nanoGPT's way: each micro-batch's loss / 3, and the step's loss the sum it prints.
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    printed, last, total = [], [], 0.0
    for i, (x, y) in enumerate(_loader(n=48, batch=4)):
        loss = nn.functional.mse_loss(model(x), y) / 3
        loss.backward()
        total += loss.item()
        if i % 3 == 2:
            opt.step()
            opt.zero_grad()
            printed.append(total)
            last.append(loss.item())
            total = 0.0
    rows = _rows(steps)
    assert [r.step for r in rows] == [1, 2, 3, 4]
    assert [r.samples for r in rows] == [12] * 4
    for row, want, wrong in zip(rows, printed, last, strict=True):
        steps.ended.clear()
        steps.ended.append(row)
        _t, line = StepLines(steps).collect()
        assert line["loss"] == pytest.approx(want, rel=1e-6)
        assert line["loss"] != pytest.approx(wrong, rel=1e-3)  # not the last micro-batch's


def test_no_dataloader_counts_the_models_batch(steps: StepClock) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(5):
        x = torch.randn(6, 8)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    rows = _rows(steps)
    assert [r.samples for r in rows] == [6] * 5
    assert all(r.data_s == 0 for r in rows)  # no DataLoader: no data time


def test_an_iterable_dataset_counts_its_batches(steps: StepClock) -> None:
    class Stream(IterableDataset):
        def __iter__(self) -> Iterator[dict[str, Any]]:
            for _ in range(20):
                yield {"x": torch.randn(8)}

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for batch in DataLoader(Stream(), batch_size=5):
        model(batch["x"]).mean().backward()
        opt.step()
    assert [r.samples for r in _rows(steps)] == [5, 5, 5, 5]


def test_several_optimizers_the_first_to_step_leads(steps: StepClock) -> None:
    gen, disc = nn.Linear(4, 8), nn.Linear(8, 1)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    d_losses = []
    for _ in range(6):
        fake = gen(torch.randn(3, 4))
        d_loss = disc(fake.detach()).mean()
        d_loss.backward()
        opt_d.step()
        opt_d.zero_grad()
        d_losses.append(d_loss.item())
        g_loss = -disc(fake).mean()
        g_loss.backward()
        opt_g.step()
        opt_g.zero_grad()
    rows = _rows(steps)
    assert [r.step for r in rows] == list(range(1, 7))  # the discriminator's steps, once each
    # The generator's step falls inside the next step, before the discriminator's backward:
    # each step's loss is the discriminator's.
    assert [r.loss.item() for r in rows] == pytest.approx(d_losses)


def test_an_optimizer_that_replaces_the_leader_takes_over(steps: StepClock) -> None:
    model = _model()
    first = torch.optim.SGD(model.parameters(), lr=0.01)
    second = torch.optim.SGD(model.parameters(), lr=0.001)
    for opt in [first] * 3 + [second] * 4:
        model(torch.randn(2, 8)).mean().backward()
        opt.step()
    # Its first step is not one (it might be the leader's partner); from its second on, it leads.
    assert [r.step for r in _rows(steps)] == [1, 2, 3, 4, 5, 6]


def test_lbfgs_with_a_closure_is_one_step_whose_loss_is_the_first_inside(steps: StepClock) -> None:
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    firsts: list[float] = []
    for x, y in _loader(n=48, batch=16):
        evaluations: list[float] = []

        def closure(
            x: torch.Tensor = x, y: torch.Tensor = y, seen: list[float] = evaluations
        ) -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            seen.append(loss.item())
            return loss

        opt.step(closure)
        assert len(evaluations) > 1  # LBFGS evaluated it several times in one step
        firsts.append(evaluations[0])
    rows = _rows(steps)
    assert [r.step for r in rows] == [1, 2, 3]
    assert [r.loss.item() for r in rows] == pytest.approx(firsts)
    assert [r.samples for r in rows] == [16, 16, 16]
    for row in rows:
        _adds_up(row)
        assert row.compute_s > 0  # the closure's forward and backward, inside step(): compute


def test_amp_gradscaler_reports_the_unscaled_loss_and_a_skipped_step_is_no_step(
    steps: StepClock,
) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    truth = []
    for i in range(5):
        x = torch.randn(4, 8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        if i == 2:
            loss = loss * float("inf")  # the scaler finds inf grads and skips this step
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if i != 2:
            truth.append(loss.item())
    rows = _rows(steps)
    assert [r.step for r in rows] == [1, 2, 3, 4]
    assert [r.loss.item() for r in rows] == pytest.approx(truth)  # not 1024x
    assert [r.samples for r in rows] == [4, 4, 8, 4]  # the skipped step's batch falls in the next


def test_an_eval_loop_between_steps_is_not_a_step_nor_samples_nor_data(steps: StepClock) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    val = _loader(n=400, batch=100)
    for i, (x, y) in enumerate(_loader(n=16, batch=4)):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if i == 1:
            model.eval()
            with torch.no_grad():
                for vx, _vy in val:
                    model(vx)
                    time.sleep(0.02)
            model.train()
    rows = _rows(steps)
    assert [r.step for r in rows] == [1, 2, 3, 4]
    assert [r.samples for r in rows] == [4, 4, 4, 4]
    evaluated = rows[2]  # the eval ran between steps 2 and 3: the script's own time
    other = evaluated.step_s - evaluated.data_s + evaluated.compute_s + evaluated.comm_s
    assert other >= 0.08 and evaluated.data_s < other
    assert steps.eval_batches == 4  # the val loader's 4 batches under no_grad: a sign of life


def test_two_losses_in_one_step_report_their_sum(steps: StepClock) -> None:
    # Two backward calls before one optimizer step: their gradients add up, so the step
    # optimized a + b.
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    a = model(x).mean()
    b = model(x).pow(2).mean()
    a.backward()
    b.backward()
    opt.step()
    (row,) = _rows(steps)
    _t, line = StepLines(steps).collect()
    assert line["loss"] == pytest.approx(a.item() + b.item(), rel=1e-6)
    assert row.samples == 8  # two forwards of the model on a batch of 4


def test_a_slow_dataset_is_data_time_and_a_slow_forward_is_compute(steps: StepClock) -> None:
    class Slow(Dataset):
        def __len__(self) -> int:
            return 12

        def __getitem__(self, i: int) -> torch.Tensor:
            time.sleep(0.05)
            return torch.randn(8)

    class SlowNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(0.2)
            return self.lin(x)

    fast, slow = _model(), SlowNet()
    for model, want in ((fast, "data"), (slow, "compute")):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x in DataLoader(
            Slow() if want == "data" else TensorDataset(torch.randn(12, 8)), batch_size=4
        ):
            x = x if want == "data" else x[0]
            model(x).mean().backward()
            opt.step()
        rows = [r for r in _rows(steps)][-3:]
        steps.ended.clear()
        for row in rows:
            _adds_up(row)
            data, compute = row.data_s, row.compute_s
            # The sleeps are lower bounds whatever the machine's load: the slow part is the
            # largest part of the step.
            if want == "data":
                assert data >= 0.2 and data > max(
                    compute, row.comm_s, row.step_s - data - compute - row.comm_s
                )
            else:
                assert compute >= 0.2 and compute > max(
                    data, row.comm_s, row.step_s - data - compute - row.comm_s
                )


def test_torch_compile_steps_are_counted(steps: StepClock) -> None:
    model = _model()
    try:
        compiled = torch.compile(model)
        compiled(torch.randn(2, 8)).sum().backward()  # compiles forward and backward: step 1
    except Exception as exc:  # no C compiler for inductor on this machine
        pytest.skip(f"torch.compile cannot run here: {exc}"[:200])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt.step()
    steps.ended.clear()
    truth = []
    for _ in range(4):
        loss = compiled(torch.randn(2, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        truth.append(loss.item())
    rows = _rows(steps)[-4:]
    assert [r.loss.item() for r in rows] == pytest.approx(truth)
    assert [r.samples for r in rows] == [2, 2, 2, 2]


def test_what_the_script_logs_itself_is_left_out_of_the_steps_line(steps: StepClock) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    queue: deque = deque()
    own = OwnTrain()
    rates: dict[str, float] = {}
    for step in range(1, 4):
        loss = model(torch.randn(4, 8)).mean()
        loss.backward()
        opt.step()
        queue.append((time.time(), {"step": step, "loss": loss.detach(), "lr": 0.01}))
    lines, dropped = drain(queue, 0, rates, own, StepLines(steps).collect)
    recs = [json.loads(line) for line in lines]
    assert dropped == 0 and own.keys == {"step", "loss"} and own.reports
    assert [r.get("step") for r in recs] == [1, 2, 3, None]
    ours = recs[-1]
    assert "loss" not in ours and ours["samples"] == 12 and ours["steps"] == 3
    assert {"step_s", "data_s", "compute_s", "comm_s", "other_s"} <= set(ours)
    assert math.isclose(
        sum(ours[k] for k in ("data_s", "compute_s", "comm_s", "other_s")),
        ours["step_s"],
        abs_tol=1e-5,
    )
    # A framework says so before its first step: nothing of its keys from the first line on.
    StepLines(steps).collect()
    own.announce(("samples",))
    model(torch.randn(4, 8)).mean().backward()
    opt.step()
    lines, _ = drain(deque(), 0, rates, own, StepLines(steps).collect)
    assert not {"step", "loss", "samples", "samples_per_s"} & set(json.loads(lines[0]))


def test_hooks_cost_nothing_outside_training_and_unhook_restores_torch() -> None:
    before = (
        torch.autograd.backward,
        nn.Module.__call__,
        torch.utils.data.dataloader._BaseDataLoaderIter.__next__,
    )
    clock = StepClock()
    unhook = torchsteps.hook(torch, clock)
    assert nn.Module.__call__ is not before[1]
    unhook()
    after = (
        torch.autograd.backward,
        nn.Module.__call__,
        torch.utils.data.dataloader._BaseDataLoaderIter.__next__,
    )
    assert after == before
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model(torch.randn(2, 8)).mean().backward()
    opt.step()
    assert not clock.ended  # unhooked: nothing counted


def test_what_the_script_does_between_epochs_is_other_not_the_next_steps_compute() -> None:
    # The epoch's last __next__ raises StopIteration: no step's work begins there, so an eval or
    # a checkpoint at the epoch's end is the next step's other. A fake clock: exact figures.
    now = [100.0]
    steps = StepClock(clock=lambda: now[0], wall=lambda: now[0])
    unhook = torchsteps.hook(torch, steps)
    try:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = _loader(n=8, batch=4)
        for _epoch in range(2):
            for x, y in loader:
                now[0] += 0.25  # a custom loss's math: compute
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                now[0] += 0.5  # logging: other
            now[0] += 4.0  # the eval and the checkpoint at the epoch's end: other
    finally:
        unhook()
    rows = _rows(steps)
    assert [r.step for r in rows] == [1, 2, 3, 4]
    first_of_epoch_2 = rows[2]
    step_s, data, compute, comm = (
        first_of_epoch_2.step_s,
        first_of_epoch_2.data_s,
        first_of_epoch_2.compute_s,
        first_of_epoch_2.comm_s,
    )
    assert step_s == pytest.approx(4.75) and compute == pytest.approx(0.25)
    assert step_s - data - compute - comm == pytest.approx(4.5)


def test_a_fast_ddp_loop_watches_one_backward_in_watch_every_s_and_a_slow_one_every_call(
    steps: StepClock,
) -> None:
    # Watching the wait after backward's graph costs the training thread a hook and a final
    # callback: on the host's clock a loop faster than WATCH_EVERY_S has it timed on some calls,
    # spaced so, and the others are counted; a loop slower than it is watched on every call.
    import torch.distributed as dist  # noqa: PLC0415 - only this test needs a process group

    from xl.integrations.stepclock import WATCH_EVERY_S  # noqa: PLC0415 - as above

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = nn.parallel.DistributedDataParallel(_model())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def loop(pause: float, n: int) -> list[Ended]:
            steps.ended.clear()
            for xb, yb in _loader(4 * n):
                loss = nn.functional.mse_loss(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                time.sleep(pause)
            return _rows(steps)

        start = time.perf_counter()
        fast = loop(0.0, 200)
        took = time.perf_counter() - start
        assert all(row.watched + row.unwatched == 1 for row in fast)
        watched = sum(row.watched for row in fast)
        # at least one call in each WATCH_EVERY_S, at most one more than those fit in the time
        assert 1 <= watched <= took / WATCH_EVERY_S + 2 and watched < len(fast), (watched, took)
        tails = sorted(row.tail_s for row in fast if row.watched)
        assert tails[-1] > 0
        # the line: the calls not watched carry at most the watched ones' median wait as comm,
        # taken from their compute
        _t, line = StepLines(steps).collect()
        n = len(fast)
        watched_only = sum(row.comm_s for row in fast) / n
        most = watched_only + tails[len(tails) // 2] * (n - watched) / n
        assert watched_only - 2e-6 <= line["comm_s"] <= most + 2e-6  # the line rounds to 1 us
        assert line["comm_s"] > watched_only + 1e-6
        parts = sum(line[k] for k in ("data_s", "compute_s", "comm_s", "other_s"))
        assert parts == pytest.approx(line["step_s"], abs=5e-6)
        time.sleep(WATCH_EVERY_S)
        slow = loop(WATCH_EVERY_S, 5)
        assert [row.watched for row in slow] == [1] * 5
    finally:
        dist.destroy_process_group()


def test_a_batch_s_size_is_its_first_tensor_s_leading_dimension_that_is_not_zero() -> None:
    from xl.integrations.report import batch_size  # noqa: PLC0415 - the function alone

    x, y = torch.zeros(8, 3), torch.zeros(8)
    assert batch_size([x, y]) == 8 and batch_size((x, y)) == 8
    assert batch_size({"input_ids": torch.zeros(4, 16), "labels": y}) == 4
    # a 0-d or empty first tensor is no size: the next one's is
    assert batch_size((torch.tensor(1.0), x)) == 8
    assert batch_size([torch.zeros(0, 3), torch.zeros(5, 3)]) == 5
    assert batch_size([[x, y], y]) == 8  # nested
    assert batch_size([]) == 0 and batch_size(["text", 3]) == 0 and batch_size(None) == 0
