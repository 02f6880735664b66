"""run_doctor: probes in parallel (collect.py) -> Facts -> checks -> Report, with secrets
redacted. Never raises."""

from __future__ import annotations

import re
import time
from typing import Any

from xl._version import __version__
from xl.doctor.checks import REPORT_BUG, all_errored, run_checks
from xl.doctor.collect import collect
from xl.doctor.facts import Facts
from xl.doctor.probes.compile import run_build
from xl.doctor.report import Report

SECRET_NAME = re.compile(r"token|key|passw|secret|credential|auth", re.IGNORECASE)

# Variables worth showing in the report's facts (the rest of the environment is not ours to print).
_RELEVANT = re.compile(
    r"^(CUDA_\w+|NCCL_\w+|TORCH_\w+|NVCC_\w+|CUDAHOSTCXX|CC|CXX|CPATH|LD_LIBRARY_PATH|PATH|CONDA_PREFIX"
    r"|DS_\w+|PYTORCH_\w+|NVIDIA_\w+|MASTER_ADDR|MASTER_PORT|OMP_NUM_THREADS)$"
)


def redacted_env(env: dict[str, str]) -> dict[str, str]:
    return {
        k: ("<redacted>" if SECRET_NAME.search(k) else v)
        for k, v in sorted(env.items())
        if _RELEVANT.match(k)
    }


def _secret_values(env: dict[str, str]) -> list[str]:
    return sorted(
        # Short values ("1", "true") are flags, not secrets, and would garble every message.
        {v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= 6},
        key=len,
        reverse=True,
    )


def _scrub(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        for s in secrets:
            if s in value:
                value = value.replace(s, "<redacted>")
        return value
    if isinstance(value, dict):
        return {k: _scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, secrets) for v in value]
    return value


def _facts_json(f: Facts) -> dict[str, Any]:
    t = f.torch
    c = f.compiler
    return {
        "xl_version": __version__,
        "driver": f.driver.to_json() if f.driver is not None else {"error": f.nvml_problem},
        "python": t.python if t is not None else f.python,
        "torch": None
        if t is None
        else {
            "found": t.found,
            "version": t.version,
            "cuda": t.cuda,
            "hip": t.hip,
            "location": t.location,
            "nccl": t.nccl,
            "problem": t.problem,
        },
        "cuda_home": {"path": f.cuda_home, "from": f.cuda_home_from},
        "nvcc": {
            "path": f.path_nvcc,
            "output": f.path_nvcc_run.first_line() if f.path_nvcc_run else None,
        },
        "toolkits": [tk.to_json() for tk in f.toolkits],
        "compiler": None
        if c is None
        else {"path": c.path, "source": c.source, "kind": c.kind, "version": c.version},
        "env": redacted_env(f.env),
        "timings_ms": f.timings_ms,
    }


def build_report(f: Facts) -> Report:
    checks = run_checks(f)
    secrets = _secret_values(f.env)
    for c in checks:
        c.detail, c.fix, c.title = (
            _scrub(c.detail, secrets),
            _scrub(c.fix, secrets),
            _scrub(c.title, secrets),
        )
        c.data = _scrub(c.data, secrets)
        # A secret-looking variable's value never leaves the process, even inside data.
    gpus = [g.to_json() for g in f.gpus] if f.gpus else []
    return Report(checks=checks, gpus=gpus, facts=_scrub(_facts_json(f), secrets))


def run_doctor(python: str | None = None, build: bool = False) -> Report:
    """The whole diagnosis. Never raises: a probe bug becomes `error` checks, not a traceback.
    `build` adds the `build` check: a real compile, so it takes the compiler's time."""
    try:
        facts = collect(python)
        if build:
            t0 = time.perf_counter()
            facts.build = run_build(facts)
            facts.timings_ms["build"] = round((time.perf_counter() - t0) * 1000, 1)
        return build_report(facts)
    except Exception as exc:
        why = f"the doctor could not collect facts: {type(exc).__name__}: {exc}"
        return Report(checks=all_errored(why, fix=REPORT_BUG))
