"""run_doctor: probes in parallel -> Facts -> checks -> Report. Never raises."""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any, TypeVar

from xl import envnames
from xl._version import __version__
from xl.doctor.checks import all_errored, run_checks
from xl.doctor.facts import CmdResult, Compiler, Facts, TorchInfo, parse_nvcc_version
from xl.doctor.probes import compilers, files, libraries, shm, system, toolkits
from xl.doctor.probes.commands import Job, Outcome, run_cmd
from xl.doctor.probes.compile import run_build
from xl.doctor.probes.pytorch import probe_torch
from xl.doctor.report import Report

T = TypeVar("T")

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


def _timed(facts: Facts, job: Job[T]) -> Outcome[T]:
    """A job's outcome, its time noted in the facts (the report's timings_ms)."""
    got = job.result()
    facts.timings_ms[job.name] = round(got.ms, 1)
    return got


def _cmd(facts: Facts, job: Job[CmdResult]) -> CmdResult:
    """A command job's result; a probe that raised or hung is a command that did not answer."""
    got = _timed(facts, job)
    if got.error is not None or got.value is None:
        return CmdResult(argv=[job.name], problem=got.error or "no answer")
    return got.value


def collect(python: str | None = None) -> Facts:
    """Run every probe (subprocesses and NVML on threads, file reads meanwhile) into Facts."""
    t0 = time.perf_counter()
    python = python or sys.executable
    env = system.env_snapshot()
    real_env = os.environ  # undecoded values (surrogate-escaped) still name real files
    facts = Facts(env=env, python=python)
    nvml_job = Job("nvml", system.probe_inventory)
    torch_job = Job("torch", lambda: probe_torch(python))

    path_value = real_env.get("PATH")
    facts.path_nvcc = files.which("nvcc", path_value)
    facts.cuda_home, facts.cuda_home_from = toolkits.resolve_cuda_home(real_env, facts.path_nvcc)
    running: dict[str, Job[CmdResult]] = {}  # realpath of an nvcc -> its job

    def run_nvcc(path: str, name: str) -> Job[CmdResult]:
        real = os.path.realpath(path)
        if real not in running:
            running[real] = Job(name, lambda: run_cmd([path, "--version"]))
        return running[real]

    path_job = run_nvcc(facts.path_nvcc, "nvcc:path") if facts.path_nvcc else None
    home_job = None
    if facts.cuda_home:
        home_nvcc = os.path.join(facts.cuda_home, "bin", "nvcc")
        if os.path.isfile(home_nvcc):
            home_job = run_nvcc(home_nvcc, "nvcc:home")
    comp_path, comp_src = compilers.pick_compiler(real_env)
    cc_jobs = None
    if comp_path:
        cc = comp_path
        cc_jobs = (
            Job("cc:version", lambda: run_cmd([cc, "--version"])),
            Job("cc:dump", lambda: run_cmd([cc, "-dumpfullversion"])),
        )
    facts.ninja = files.which("ninja", path_value)
    ninja_job = None
    if facts.ninja:
        ninja = facts.ninja
        ninja_job = Job("ninja", lambda: run_cmd([ninja, "--version"]))
    ldconfig = libraries.find_ldconfig(real_env)
    ldconfig_job = None
    if ldconfig:
        ldconfig_job = Job("ldconfig", lambda: run_cmd([ldconfig, "-p"]))

    # File-only probes on this thread while the subprocesses run.
    facts.toolkits = toolkits.discover_toolkits(real_env, facts.path_nvcc, facts.cuda_home)
    tk_jobs: dict[int, Job[CmdResult]] = {}
    for i, tk in enumerate(facts.toolkits):
        if tk.version is None and tk.nvcc and tk.problem is None:
            tk_jobs[i] = run_nvcc(tk.nvcc, f"nvcc:tk{i}")
    if facts.cuda_home:
        facts.cuda_home_dir = toolkits.inspect_toolkit(
            facts.cuda_home, facts.cuda_home_from or "CUDA_HOME"
        )
        if facts.cuda_home_dir.nvcc:
            facts.home_toolkit = toolkits.toolkit_root_of_nvcc(facts.cuda_home_dir.nvcc)
        elif facts.cuda_home_dir.problem is None:
            facts.home_toolkit = os.path.realpath(facts.cuda_home)
    if facts.path_nvcc:
        facts.path_toolkit = toolkits.toolkit_root_of_nvcc(facts.path_nvcc)
    facts.ld_entries = libraries.scan_ld_library_path(real_env.get("LD_LIBRARY_PATH"))
    # XL_DOCTOR_SHM: check another mount (containers that bind shared memory elsewhere; tests).
    facts.shm_path = real_env.get(envnames.DOCTOR_SHM) or "/dev/shm"
    facts.shm_total, facts.shm_free, facts.shm_problem = system.shm_size(facts.shm_path)
    facts.shm_segments = shm.segments(facts.shm_path)
    facts.other_compilers = compilers.other_compilers(path_value)
    net = system.net_interfaces()
    facts.net_ifaces = net or None
    facts.ib_devices = system.infiniband_devices()
    facts.container = system.container_kind()

    if path_job:
        facts.path_nvcc_run = _cmd(facts, path_job)
    if home_job:
        facts.cuda_home_nvcc_run = _cmd(facts, home_job)
    for i, job in tk_jobs.items():
        tk = facts.toolkits[i]
        tk.nvcc_run = _cmd(facts, job)
        if tk.nvcc_run.ok:
            short, full = parse_nvcc_version(tk.nvcc_run.stdout)
            if short:
                tk.version, tk.version_from = full or short, "nvcc"
    if comp_path and cc_jobs:
        comp = Compiler(path=comp_path, source=comp_src, missing=not files.is_file(comp_path))
        vr, dr = _cmd(facts, cc_jobs[0]), _cmd(facts, cc_jobs[1])
        facts.compiler = compilers.classify_compiler(comp, vr, dr)
    if ninja_job:
        facts.ninja_run = _cmd(facts, ninja_job)
    if ldconfig_job:
        run = _cmd(facts, ldconfig_job)
        if run.ok:
            facts.ldconfig = libraries.parse_ldconfig(run.stdout)
        else:
            facts.ldconfig_problem = run.problem

    torch = _timed(facts, torch_job)
    facts.torch = torch.value or TorchInfo(python=python, problem=str(torch.error))
    known = {t.real for t in facts.toolkits}
    for root, version in facts.torch.pip_toolkits:
        tk = toolkits.inspect_toolkit(root, "pip (nvidia-cuda-nvcc)")
        if tk.real in known:
            continue
        if tk.version is None:
            tk.version, tk.version_from = version, "pip"
        facts.toolkits.append(tk)
    if not facts.ninja and facts.torch.bin_dir:
        cand = os.path.join(facts.torch.bin_dir, "ninja")
        if os.path.isfile(cand):
            facts.ninja_in_bin = cand

    nvml = _timed(facts, nvml_job)
    if nvml.value is not None:
        inv, facts.health = nvml.value
        facts.driver = inv.driver
        facts.gpus = tuple(inv.gpus)
    else:
        facts.nvml_problem = nvml.error or "no answer"
    facts.timings_ms["total"] = round((time.perf_counter() - t0) * 1000, 1)
    return facts


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
        return Report(checks=all_errored(why, fix="please report this as an xl bug"))
