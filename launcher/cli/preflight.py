"""What `xl launch` checks about the chosen GPUs just before it starts, as `xl doctor` would:

- a torch without CUDA (a CPU or ROCm build) when --gpus asked for GPUs stops the launch with the
  doctor's fix (the `torch` check's), instead of training on the CPU without a word; a torch whose
  CUDA the driver does not run stops it with the `driver_cuda` check's (a warning under NVIDIA's
  minor-version compatibility). The torch of this interpreter is read in-process, ~1 ms;
  --python's, or one under --env PYTHONPATH, by the doctor's probe in that interpreter, ~50 ms;
  the doctor's other facts are collected only when one of these is wrong;
- GPUs that are busy or unhealthy (another process holds one, exclusive-process mode, pending
  ECC row remaps, ...; xl.gpu.health, the doctor's `gpus` check) are said before the run starts,
  as the app's GPU picker says them. The launch goes on: a person may mean to share a GPU; a GPU
  the doctor calls failed is said as an error line, so it is not missed.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from xl import envnames
from xl.errors import UsageError
from xl.launcher.plan import Plan
from xl.launcher.spec import LaunchSpec

if TYPE_CHECKING:
    from xl.gpu.nvml import Inventory


def check_launch(spec: LaunchSpec, plan: Plan, inv: Inventory, *, gpus_given: bool) -> None:
    """Stop (UsageError) on a torch without CUDA under --gpus; add what is wrong with the chosen
    GPUs to ``plan.warnings``."""
    if not plan.devices:
        return
    # GPUs of the simulated driver (tests, demos) are run by a CPU torch: nothing to ask.
    if gpus_given and os.environ.get(envnames.SIMULATED_GPUS) != "1":
        from xl.doctor import api  # noqa: PLC0415 - only a launch on GPUs pays for the doctor

        # --env PYTHONPATH=... changes what the ranks import: ask an interpreter that has it.
        python = spec.python or (sys.executable if "PYTHONPATH" in spec.env else None)
        d = inv.driver
        driver_cuda = d.cuda_version if d is not None and not d.error else None
        wrong = api.torch_for_gpus(python, {**os.environ, **spec.env}, driver_cuda)
        if wrong is not None:
            if wrong.status is api.Status.FAIL:
                said = f"{wrong.detail}; fix: {wrong.fix}" if wrong.fix else wrong.detail
                raise UsageError(f"--gpus {spec.gpus}: {said}")
            plan.warnings.append(_with_fix(wrong.detail, wrong.fix))
    from xl.gpu import health  # noqa: PLC0415 - only a launch on GPUs reads their health

    chosen = [g.index for g in plan.devices[: plan.nproc]]
    gpus = inv.gpus  # the launch's one inventory, taken with the processes that hold each GPU
    now = {g.index: g for g in gpus}
    verdicts = health.judge_all(gpus, health.health([g.index for g in gpus if not g.lost]))
    for index in chosen:
        g = now.get(index)
        if g is None:
            continue
        for p in verdicts.get(index, []):
            prefix = "xl doctor calls this a failure: " if p.status == "fail" else ""
            plan.warnings.append(_with_fix(prefix + p.detail, p.fix))
        busy = health.busy(g)
        if busy and not g.processes:
            plan.warnings.append(f"{busy}: ranks will share it")


def _with_fix(detail: str, fix: str) -> str:
    """A warning and its fix in brackets; a warning with no command is its own words alone."""
    return f"{detail} (fix: {fix})" if fix else detail
