"""The doctor's API for the launcher: what `xl launch` and a failed run's causes ask it.

The launcher imports nothing else of `xl.doctor` (tests/test_layout.py holds it to that), so what
the doctor knows (its facts, its checks, its fixes tried before they are printed) can move about
inside the doctor without the launcher noticing. Each question takes what its caller has:

- `torch_for_gpus`: the launch's preflight has an interpreter, an environment and the CUDA the
  driver runs (from the NVML inventory it took anyway); the doctor reads the rest only when the
  ranks' torch is wrong for the GPUs.
- `failure_facts`, `check`, `grow_shm`: a failed run's causes (docs/launch.md, "Why a rank
  died") read the facts a failure needs once, and ask the doctor's own checks on them.
- `gather_fingerprint`, `compare_fingerprints`: a multi-node launch's nodes, each its own
  fingerprint, node 0 comparing them before any rank starts (docs/multinode.md, "One
  environment across nodes").

Only the question asked loads the doctor's modules: callers import this module inside the function
that needs it, so a launch on CPUs never pays for the doctor.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace

from xl.doctor.checks import CHECKS, judge
from xl.doctor.checks.finding import Finding
from xl.doctor.checks.system import grow_shm_fix
from xl.doctor.collect import collect, put_inventory, read_host
from xl.doctor.facts import Facts, vtuple
from xl.doctor.fingerprint import Diff, Fingerprint, node_lines
from xl.doctor.fingerprint import compare as compare_fingerprints
from xl.doctor.fingerprint import gather as gather_fingerprint
from xl.doctor.probes import system
from xl.doctor.probes.pytorch import probe_torch, probe_torch_here
from xl.doctor.status import Status

__all__ = [
    "Diff",
    "Facts",
    "Finding",
    "Fingerprint",
    "Status",
    "check",
    "compare_fingerprints",
    "failure_facts",
    "gather_fingerprint",
    "grow_shm",
    "node_lines",
    "torch_for_gpus",
]


def torch_for_gpus(
    python: str | None, env: Mapping[str, str], driver_cuda: str | None
) -> Finding | None:
    """The `torch` check's failure when the ranks' torch has no CUDA (a CPU or ROCm build), or
    the `driver_cuda` check's fail or warn when the driver does not fully run its CUDA; None when
    the GPUs can be used (or there is no torch: the run's own error says it better than a guess).

    ``python`` is the ranks' interpreter (None: this one, read in-process, ~1 ms; another is read
    by the doctor's probe, ~50 ms), ``env`` what the ranks run with, ``driver_cuda`` the CUDA
    NVML says the driver runs (None: no driver to ask). The doctor's other facts are collected
    only when the torch is wrong, and the verdict is the one `xl doctor` prints, its fix tried
    as the report tries it: the launch and the doctor never give one finding two fixes."""
    torch = probe_torch(python, env) if python else probe_torch_here()
    if not torch.found:
        return None
    check_id = "torch"
    if torch.cuda:
        if not driver_cuda or vtuple(driver_cuda)[:2] >= vtuple(torch.cuda)[:2]:
            return None
        check_id = "driver_cuda"
    facts = replace(collect(python), torch=torch)
    verdict = judge(facts, check_id)
    if verdict.status is Status.FAIL or (
        check_id == "driver_cuda" and verdict.status is Status.WARN
    ):
        return verdict
    return None


def failure_facts(python: str, env: Mapping[str, str]) -> Facts:
    """What a failed run's causes ask about, read now: shared memory, the container, network
    interfaces, InfiniBand, NVML's driver, GPUs, health and fabric, and the ranks' torch
    (``python``: this interpreter is read in-process, another by the doctor's probe). The
    toolkits, compilers and libraries `xl doctor` also reads are left unread: no cause asks."""
    facts = Facts(env=dict(env), python=python)
    read_host(facts)
    try:
        put_inventory(facts, system.probe_inventory())
    except Exception as exc:  # NVML absent or broken: the GPU facts stay unknown
        facts.nvml_problem = str(exc)
    if python == sys.executable:
        facts.torch = probe_torch_here()
    else:
        facts.torch = probe_torch(python, env or None)
    return facts


def check(facts: Facts, check_id: str) -> Finding:
    """One of the doctor's checks (its id in docs/contracts.md: ``torch``, ``gpus``, ``shm``, ...)
    on these facts as they are: no fix is tried on what-if facts, because facts read for a
    failure lack what the other checks judge. An unknown id raises KeyError."""
    spec = next((s for s in CHECKS if s.id == check_id), None)
    if spec is None:
        raise KeyError(check_id)
    return spec.run(facts)


def grow_shm(facts: Facts) -> str:
    """How shared memory is made larger here (a container's --shm-size, or a remount): the
    `shm` check's own words, also when it finds the mount large enough."""
    return grow_shm_fix(facts.container, facts.shm_path)
