"""What `xl launch` checks about the chosen GPUs just before it starts, as `xl doctor` would:

- a torch without CUDA (a CPU or ROCm build) when --gpus asked for GPUs stops the launch with the
  doctor's fix (the `torch` check's), instead of training on the CPU without a word (the torch of
  this interpreter is read in-process, ~1 ms; --python's, or one under --env PYTHONPATH, by the
  doctor's probe in that interpreter, ~50 ms);
- GPUs that are busy or unhealthy (another process holds one, exclusive-process mode, pending
  ECC row remaps, ...; xl.gpu.health, the doctor's `gpus` check) are said before the run starts,
  as the app's GPU picker says them. The launch goes on: a person may mean to share a GPU; a GPU
  the doctor calls failed is said as an error line, so it is not missed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from xl import envnames
from xl.errors import UsageError
from xl.launcher.plan import Plan
from xl.launcher.spec import LaunchSpec


def _torch_fix(python: str | None, env: dict[str, str], inv: Any) -> tuple[str, str] | None:
    """(what is wrong, the doctor's fix) when the ranks' torch has no CUDA; None when it has."""
    from xl.doctor.checks import judge  # noqa: PLC0415 - only a launch on GPUs pays for the doctor
    from xl.doctor.facts import Facts  # noqa: PLC0415 - as above
    from xl.doctor.probes.pytorch import probe_torch, probe_torch_here  # noqa: PLC0415 - as above

    if os.environ.get(envnames.SIMULATED_GPUS) == "1":
        return None  # GPUs of the simulated driver (tests, demos): a CPU torch is what runs them
    # The ranks' interpreter: this one, read in-process, unless --python names another.
    torch = probe_torch(python, env) if python else probe_torch_here()
    if not torch.found or torch.cuda:
        return None  # no torch at all: the run's own error says it better than a guess
    py = torch.python
    facts = Facts(env={}, python=py, driver=inv.driver, gpus=tuple(inv.gpus), torch=torch)
    verdict = judge(facts, "torch")  # the doctor's own fix, tried as `xl doctor` tries it
    if verdict.status != "fail":
        return None
    return verdict.detail, verdict.fix


def check_launch(spec: LaunchSpec, plan: Plan, inv: Any, *, gpus_given: bool) -> None:
    """Stop (UsageError) on a torch without CUDA under --gpus; add what is wrong with the chosen
    GPUs to ``plan.warnings``."""
    if not plan.devices:
        return
    if gpus_given:
        # --env PYTHONPATH=... changes what the ranks import: ask an interpreter that has it.
        python = spec.python or (sys.executable if "PYTHONPATH" in spec.env else None)
        wrong = _torch_fix(python, {**os.environ, **spec.env}, inv)
        if wrong is not None:
            detail, fix = wrong
            raise UsageError(f"--gpus {spec.gpus}: {detail}; fix: {fix}")
    from xl.gpu import health, nvml  # noqa: PLC0415 - only a launch on GPUs reads their health

    chosen = [g.index for g in plan.devices[: plan.nproc]]
    gpus = nvml.inventory(processes=True).gpus
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
