"""collect: every probe into Facts, the slow ones side by side.

Subprocesses (each nvcc, the host compiler, ninja, ldconfig, the torch probe) and NVML run as
Jobs on threads (doctor/probes/commands.py), each typed by what it returns; the file-only probes
run on this thread meanwhile; then each job's outcome is read into the facts. A probe that raises
or hangs is a problem in the facts, never a traceback (docs/doctor.md, "Where each rule lives").
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from xl import envnames
from xl.cgroup import find_place
from xl.doctor.facts import CmdResult, Compiler, Facts, TorchInfo, parse_nvcc_version
from xl.doctor.probes import compilers, files, kernel, libraries, shm, system, toolkits
from xl.doctor.probes.commands import CMD_TIMEOUT, Job, Outcome, run_cmd
from xl.doctor.probes.pytorch import probe_torch

if TYPE_CHECKING:
    from xl.gpu.health import Health
    from xl.gpu.nvml import Inventory

T = TypeVar("T")
# NVML's answer, as probe_inventory gives it: the inventory, each GPU's health, its fabric state.
Probed = tuple["Inventory", "dict[int, Health]", "dict[int, tuple[str, str | None]]"]


@dataclass
class _Jobs:
    """The probes running on threads, each typed by what it returns."""

    nvml: Job[Probed]
    torch: Job[TorchInfo]
    path_nvcc: Job[CmdResult] | None = None
    home_nvcc: Job[CmdResult] | None = None
    compiler: tuple[str, str, Job[CmdResult], Job[CmdResult]] | None = None  # path, source, jobs
    ninja: Job[CmdResult] | None = None
    ldconfig: Job[CmdResult] | None = None
    toolkit_nvcc: dict[int, Job[CmdResult]] = field(default_factory=dict)  # by index in toolkits
    # realpath of an nvcc -> its job: one `nvcc --version` for each real nvcc
    nvcc_by_real: dict[str, Job[CmdResult]] = field(default_factory=dict)

    def nvcc(self, path: str, name: str) -> Job[CmdResult]:
        real = os.path.realpath(path)
        if real not in self.nvcc_by_real:
            self.nvcc_by_real[real] = Job(name, lambda: run_cmd([path, "--version"]))
        return self.nvcc_by_real[real]


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


def _start(facts: Facts, env: Mapping[str, str]) -> _Jobs:
    """Start the subprocesses and NVML, finding on the way what they run (nvcc, CUDA_HOME, the
    compiler, ninja, ldconfig)."""
    python = facts.python
    jobs = _Jobs(
        nvml=Job("nvml", system.probe_inventory), torch=Job("torch", lambda: probe_torch(python))
    )
    path_value = env.get("PATH")
    facts.path_nvcc = files.which("nvcc", path_value)
    facts.cuda_home, facts.cuda_home_from = toolkits.resolve_cuda_home(env, facts.path_nvcc)
    if facts.path_nvcc:
        jobs.path_nvcc = jobs.nvcc(facts.path_nvcc, "nvcc:path")
    if facts.cuda_home:
        home_nvcc = os.path.join(facts.cuda_home, "bin", "nvcc")
        if os.path.isfile(home_nvcc):
            jobs.home_nvcc = jobs.nvcc(home_nvcc, "nvcc:home")
    cc, source = compilers.pick_compiler(env)
    if cc:
        version = Job("cc:version", lambda: run_cmd([cc, "--version"]))
        jobs.compiler = (
            cc,
            source,
            version,
            Job("cc:dump", lambda: run_cmd([cc, "-dumpfullversion"])),
        )
    facts.ninja = files.which("ninja", path_value)
    if facts.ninja:
        ninja = facts.ninja
        jobs.ninja = Job("ninja", lambda: run_cmd([ninja, "--version"]))
    ldconfig = libraries.find_ldconfig(env)
    if ldconfig:
        jobs.ldconfig = Job("ldconfig", lambda: run_cmd([ldconfig, "-p"]))
    return jobs


def read_host(facts: Facts) -> None:
    """What the host says of itself from files, with no subprocess: the shared memory mount at
    ``facts.shm_path`` (its size and the stale segments in it), the network interfaces, the
    InfiniBand devices, the container this runs in, and where a run's cgroup would be made."""
    facts.shm_total, facts.shm_free, facts.shm_problem = system.shm_size(facts.shm_path)
    facts.shm_segments = shm.segments(facts.shm_path)
    facts.net_ifaces = system.net_interfaces() or None
    facts.ib_devices = system.infiniband_devices()
    facts.container = system.container_kind()
    place = find_place()
    facts.cgroup_parent, facts.cgroup_reason = place.parent, place.reason
    facts.cgroup_memory = place.memory


def put_inventory(facts: Facts, probed: Probed) -> None:
    """NVML's answer (xl.doctor.probes.system.probe_inventory) into the facts."""
    inv, facts.health, facts.fabric = probed
    facts.driver = inv.driver
    facts.gpus = tuple(inv.gpus)


def _read_files(facts: Facts, env: Mapping[str, str], jobs: _Jobs) -> None:
    """The file-only probes, on this thread while the subprocesses run (and an `nvcc --version`
    for each toolkit whose files don't say its version)."""
    facts.toolkits = toolkits.discover_toolkits(env, facts.path_nvcc, facts.cuda_home)
    for i, tk in enumerate(facts.toolkits):
        if tk.version is None and tk.nvcc and tk.problem is None:
            jobs.toolkit_nvcc[i] = jobs.nvcc(tk.nvcc, f"nvcc:tk{i}")
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
    facts.ld_entries = libraries.scan_ld_library_path(env.get("LD_LIBRARY_PATH"))
    facts.preload = libraries.scan_preload(env.get("LD_PRELOAD"), env.get("LD_LIBRARY_PATH"))
    # XL_DOCTOR_SHM: check another mount (containers that bind shared memory elsewhere; tests).
    facts.shm_path = env.get(envnames.DOCTOR_SHM) or "/dev/shm"
    read_host(facts)
    facts.other_compilers = compilers.other_compilers(env.get("PATH"))
    if facts.ib_devices:
        facts.ib_ports = kernel.infiniband_ports(facts.ib_devices)
    facts.fabric_manager = kernel.fabric_manager_installed()
    facts.fabric_manager_version = kernel.fabric_manager_version()
    facts.distro = kernel.distro()
    visible = (env.get("NVIDIA_VISIBLE_DEVICES") or "").strip() not in ("", "void", "none")
    facts.driver_os = kernel.driver_os(bool(facts.container) or visible)


def _read_commands(facts: Facts, jobs: _Jobs) -> None:
    """The subprocesses' answers: the nvcc versions, the host compiler, ninja, ldconfig's cache."""
    if jobs.path_nvcc:
        facts.path_nvcc_run = _cmd(facts, jobs.path_nvcc)
    if jobs.home_nvcc:
        facts.cuda_home_nvcc_run = _cmd(facts, jobs.home_nvcc)
    for i, job in jobs.toolkit_nvcc.items():
        tk = facts.toolkits[i]
        tk.nvcc_run = _cmd(facts, job)
        if tk.nvcc_run.ok:
            short, full = parse_nvcc_version(tk.nvcc_run.stdout)
            if short:
                tk.version, tk.version_from = full or short, "nvcc"
    if jobs.compiler:
        path, source, version, dump = jobs.compiler
        comp = Compiler(path=path, source=source, missing=not files.is_file(path))
        vr, dr = _cmd(facts, version), _cmd(facts, dump)
        facts.compiler = compilers.classify_compiler(comp, vr, dr)
    if jobs.ninja:
        facts.ninja_run = _cmd(facts, jobs.ninja)
    if jobs.ldconfig:
        run = _cmd(facts, jobs.ldconfig)
        if run.ok:
            facts.ldconfig = libraries.parse_ldconfig(run.stdout)
            facts.ldconfig_versions = libraries.cache_versions(facts.ldconfig)
        else:
            facts.ldconfig_problem = run.problem
    env = os.environ
    facts.nccl_plugin = libraries.find_net_plugin(
        env.get("NCCL_NET_PLUGIN"), env.get("LD_LIBRARY_PATH"), facts.ldconfig
    )


def _read_torch(facts: Facts, job: Job[TorchInfo]) -> None:
    """torch's facts, and what its interpreter brings: pip's CUDA toolkits, ninja beside it."""
    torch = _timed(facts, job)
    facts.torch = torch.value or TorchInfo(python=facts.python, problem=str(torch.error))
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


def _cuinit_after(
    nvml: Job[tuple[Inventory, dict[int, Health], dict[int, tuple[str, str | None]]]],
) -> tuple[int | None, str | None]:
    """cuInit's result when NVML reports working GPUs; (None, why not) otherwise."""
    got = nvml.result()
    inv = got.value[0] if got.value is not None else None
    if inv is None or inv.driver.error or not any(not g.lost for g in inv.gpus):
        return None, "NVML reports no GPUs"
    return system.probe_cuinit(sys.executable)


def collect(python: str | None = None) -> Facts:
    """Run every probe (subprocesses and NVML on threads, file reads meanwhile) into Facts."""
    t0 = time.perf_counter()
    facts = Facts(env=system.env_snapshot(), python=python or sys.executable)
    real_env = os.environ  # undecoded values (surrogate-escaped) still name real files
    jobs = _start(facts, real_env)
    # cuInit, only once NVML reports GPUs (on its own thread, as NVML answers).
    cuinit = Job("cuinit", lambda: _cuinit_after(jobs.nvml))
    _read_files(facts, real_env, jobs)
    _read_commands(facts, jobs)
    _read_torch(facts, jobs.torch)
    nvml = _timed(facts, jobs.nvml)
    if nvml.value is not None:
        put_inventory(facts, nvml.value)
    else:
        facts.nvml_problem = nvml.error or "no answer"
    # NVML's own time and then cuInit's: the wait covers both.
    got = cuinit.result(timeout=2 * CMD_TIMEOUT + 3)
    facts.timings_ms[cuinit.name] = round(got.ms, 1)
    if got.value is not None:
        facts.cuinit, facts.cuinit_problem = got.value
    else:
        facts.cuinit_problem = got.error
    if facts.driver is not None and facts.driver.error_kind == "driver_not_loaded":
        # Why it is not loaded: the module for this kernel, DKMS, Secure Boot (docs/doctor.md).
        cache = facts.ldconfig.get("libcuda.so.1") or [""]
        libcuda = os.path.basename(os.path.realpath(cache[0])) if cache[0] else ""
        facts.kernel = kernel.kernel_module(real_env, libcuda.partition("libcuda.so.")[2] or None)
    facts.timings_ms["total"] = round((time.perf_counter() - t0) * 1000, 1)
    return facts
