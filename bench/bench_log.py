"""Per-call cost of ``xl.log`` with 4 scalars, against what people use today, in one run.

    .venv/bin/python bench/bench_log.py [--calls 200000]

Anchors measured here, same loop shape: ``SummaryWriter.add_scalar`` x4
(torch.utils.tensorboard) and ``print`` of an HF-style log dict to a file. ``xl.log`` runs
inside a live run (a real collector in this process, its sender thread busy in the background)
and the records are checked to have been stored. Goals: <= 2 us median, >= 20x cheaper than
add_scalar x4.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xl.launcher.telemetry.service import Telemetry

BATCH = 200
PAUSE_S = 0.004  # ~50k calls/s: far above any training loop, below the sender's drain rate


def per_call_ns(fn: Callable[[int], None], calls: int) -> list[float]:
    """Median-friendly samples: time batches of BATCH calls, divide by BATCH."""
    samples = []
    perf = time.perf_counter_ns
    for b in range(calls // BATCH):
        base = b * BATCH
        t0 = perf()
        for i in range(base, base + BATCH):
            fn(i)
        samples.append((perf() - t0) / BATCH)
        time.sleep(PAUSE_S)
    return samples


def describe(name: str, samples: list[float]) -> dict[str, Any]:
    samples = sorted(samples)
    return {
        "name": name,
        "median_us": statistics.median(samples) / 1000,
        "p90_us": samples[int(len(samples) * 0.9)] / 1000,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200_000)
    args = ap.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="xl-bench-log-"))
    tel = Telemetry(run_dir, token="bench", inventory=False)
    env = tel.start()
    os.environ.update(env, XL_RUN_DIR=str(run_dir), RANK="0", XL_LOG_QUEUE="1000000")
    import xl  # noqa: PLC0415 - the client reads XL_COLLECTOR on import: only once the run's env is set
    from xl import client  # noqa: PLC0415 - as above: after the run's env is set

    results = []
    loss, lr, gnorm = 0.5, 1e-4, 1.25
    results.append(
        describe(
            "xl.log(step, loss, lr, grad_norm)",
            per_call_ns(lambda i: xl.log(step=i, loss=loss, lr=lr, grad_norm=gnorm), args.calls),
        )
    )
    xl.flush(30)
    results.append(
        describe(
            "xl.log outside a run (no-op)",
            per_call_ns(
                lambda i: client._noop_log(step=i, loss=loss, lr=lr, grad_norm=gnorm), args.calls
            ),
        )
    )
    import torch  # noqa: PLC0415 - only the tensor case needs it; the no-op figures come first

    t_loss = torch.tensor(0.5)
    results.append(
        describe(
            "xl.log with a 0-d tensor loss",
            per_call_ns(
                lambda i: xl.log(step=i, loss=t_loss, lr=lr, grad_norm=gnorm), args.calls // 4
            ),
        )
    )
    ok = xl.flush(30)
    dropped = client._sender.dropped if client._sender else -1
    tel.stop()
    stored = sum(
        1
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "train"
    )
    expected = args.calls // BATCH * BATCH + args.calls // 4 // BATCH * BATCH

    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - optional (bench extra)
    except Exception as exc:  # tensorboard is in the bench extra
        print(f"SummaryWriter unavailable ({exc}); install the bench extra", file=sys.stderr)
        SummaryWriter = None  # type: ignore[assignment,misc]
    if SummaryWriter is not None:
        writer = SummaryWriter(str(run_dir / "tb"))

        def tb(i: int) -> None:
            writer.add_scalar("loss", loss, i)
            writer.add_scalar("lr", lr, i)
            writer.add_scalar("grad_norm", gnorm, i)
            writer.add_scalar("step", i, i)

        results.append(describe("SummaryWriter.add_scalar x4", per_call_ns(tb, args.calls // 10)))
        writer.close()
    with open(run_dir / "print.log", "w") as fh:

        def hf_print(i: int) -> None:
            print(
                {"loss": loss, "grad_norm": gnorm, "learning_rate": lr, "epoch": i / 1000}, file=fh
            )

        results.append(
            describe("print(HF log dict) to a file", per_call_ns(hf_print, args.calls // 4))
        )

    base = results[0]["median_us"]
    print(f"{'':36} {'median':>10} {'p90':>10} {'vs xl.log':>10}")
    for r in results:
        print(
            f"{r['name']:36} {r['median_us']:8.3f}us {r['p90_us']:8.3f}us "
            f"{r['median_us'] / base:9.1f}x"
        )
    print(f"stored {stored} of {expected} records (flush ok: {ok}, dropped: {dropped})")
    goal_abs = base <= 2.0
    tb_ratio = next((r["median_us"] / base for r in results if "SummaryWriter" in r["name"]), None)
    print(f"goal <= 2 us median: {'met' if goal_abs else 'MISSED'} ({base:.3f} us)")
    if tb_ratio is not None:
        print(
            f"goal >= 20x cheaper than add_scalar x4: {'met' if tb_ratio >= 20 else 'MISSED'} "
            f"({tb_ratio:.0f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
