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


def _torch_fix(python: str | None, env: dict[str, str], inv: Inventory) -> tuple[str, str, str] | None:
    """(status, what is wrong, the doctor's fix) when the ranks' torch cannot use the GPUs: a
    torch without CUDA (the `torch` check), or one whose CUDA the driver does not run fully
    (`driver_cuda`: fail, or warn under minor-version compatibility); None when it can."""
    from dataclasses import replace  # noqa: PLC0415 - only a launch on GPUs pays for the doctor

    from xl.doctor.checks import judge  # noqa: PLC0415 - as above
    from xl.doctor.collect import collect  # noqa: PLC0415 - as above
    from xl.doctor.facts import vtuple  # noqa: PLC0415 - as above
    from xl.doctor.probes.pytorch import probe_torch, probe_torch_here  # noqa: PLC0415 - as above

    if os.environ.get(envnames.SIMULATED_GPUS) == "1":
        return None  # GPUs of the simulated driver (tests, demos): a CPU torch is what runs them
    # The ranks' interpreter: this one, read in-process, unless --python names another.
    torch = probe_torch(python, env) if python else probe_torch_here()
    if not torch.found:
        return None  # no torch at all: the run's own error says it better than a guess
    check = "torch"
    if torch.cuda:
        d = inv.driver
        nvml = d.cuda_version if d is not None and not d.error else None
        if not nvml or vtuple(nvml)[:2] >= vtuple(torch.cuda)[:2]:
            return None  # the driver runs it (or there is none to ask): nothing to collect
        check = "driver_cuda"
    # The doctor's own facts (toolkits, libcuda, the distribution that installs a driver) and
    # its own fix, tried as `xl doctor` tries it: the same command from one place. Paid only by
    # a launch that is about to be refused or warned.
    facts = replace(collect(python), torch=torch)
    verdict = judge(facts, check)
    if verdict.status not in ("fail", "warn") or (check == "torch" and verdict.status != "fail"):
        return None
    return verdict.status, verdict.detail, verdict.fix


def check_launch(spec: LaunchSpec, plan: Plan, inv: Inventory, *, gpus_given: bool) -> None:
    """Stop (UsageError) on a torch without CUDA under --gpus; add what is wrong with the chosen
    GPUs to ``plan.warnings``."""
    if not plan.devices:
        return
    if gpus_given:
        # --env PYTHONPATH=... changes what the ranks import: ask an interpreter that has it.
        python = spec.python or (sys.executable if "PYTHONPATH" in spec.env else None)
        wrong = _torch_fix(python, {**os.environ, **spec.env}, inv)
        if wrong is not None:
            status, detail, fix = wrong
            if status == "fail":
                raise UsageError(f"--gpus {spec.gpus}: {detail}; fix: {fix}")
            plan.warnings.append(f"{detail} (fix: {fix})")
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
            plan.warnings.append(f"{prefix}{p.detail} (fix: {p.fix})")
        busy = health.busy(g)
        if busy and not g.processes:
            plan.warnings.append(f"{busy}: ranks will share it")
