"""What the probes saw: plain records, so every check is a pure function of them."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xl.doctor.probes.compile import BuildResult
    from xl.doctor.status import Status
    from xl.gpu.health import Health
    from xl.gpu.inventory import GPU, Driver

_NVCC_RELEASE = re.compile(r"release (\d+)\.(\d+)")
_NVCC_FULL = re.compile(r"\bV(\d+\.\d+\.\d+)")


def vtuple(version: str | None) -> tuple[int, ...]:
    """'12.4.131' -> (12, 4, 131); anything unparsable -> ()."""
    if not version:
        return ()
    out = []
    for part in version.split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
    return tuple(out)


def major_minor(version: str | None) -> str | None:
    t = vtuple(version)
    return f"{t[0]}.{t[1]}" if len(t) >= 2 else None


@dataclass
class CmdResult:
    """One subprocess, already finished (or killed)."""

    argv: list[str]
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    problem: str | None = None  # why the output can't be trusted: not found, timed out, exit N

    @property
    def ok(self) -> bool:
        return self.problem is None

    def first_line(self) -> str:
        text = (self.stdout or self.stderr).strip()
        return text.splitlines()[0][:120] if text else ""


def parse_nvcc_version(text: str) -> tuple[str | None, str | None]:
    """nvcc --version -> ('13.0', '13.0.88'); (None, None) when it isn't nvcc's format."""
    m = _NVCC_RELEASE.search(text)
    if not m:
        return None, None
    full = _NVCC_FULL.search(text)
    return f"{m.group(1)}.{m.group(2)}", (full.group(1) if full else None)


@dataclass
class Toolkit:
    root: str  # as first found (may be a symlink such as /usr/local/cuda)
    real: str  # realpath: the identity of the install
    found_by: list[str] = field(default_factory=list)  # /usr/local/cuda*, CUDA_HOME, PATH, ...
    aliases: list[str] = field(default_factory=list)
    version: str | None = None  # full version, e.g. 12.4.1 or 13.0.88
    version_from: str | None = None  # version.json | version.txt | dist-info | pip | nvcc
    nvcc: str | None = None  # bin/nvcc when present
    nvcc_run: CmdResult | None = None
    host_config: str | None = None
    gcc_max: int | None = None  # from include/crt/host_config.h
    gcc_min: int | None = None
    clang_max: int | None = None
    clang_min: int | None = None
    has_headers: bool = False  # include/cuda_runtime.h
    # where cuda_runtime.h is when not in include/ (conda-forge: targets/x86_64-linux/include)
    target_include: str | None = None
    cudart: list[str] = field(default_factory=list)  # libcudart.so.N sonames it ships
    lib_dirs: list[str] = field(default_factory=list)  # realpaths of its library folders
    # a conda environment's toolkit (ROOT/conda-meta): the channel its cuda-nvcc came from, and
    # its targets/<arch> folder, where conda's CUDA packages put their headers
    conda_channel: str | None = None
    target_dir: str | None = None
    problem: str | None = None  # unreadable folder and the like

    @property
    def short(self) -> str | None:
        return major_minor(self.version)

    def to_json(self) -> dict[str, object]:
        return {
            "root": self.root,
            "real": self.real,
            "version": self.version,
            "version_from": self.version_from,
            "found_by": self.found_by,
            "nvcc": self.nvcc,
            "host_config": self.host_config,
            "gcc_max": self.gcc_max,
            "clang_max": self.clang_max,
            "cudart": self.cudart,
            "problem": self.problem,
        }


@dataclass
class Compiler:
    path: str  # what nvcc will run
    # NVCC_APPEND_FLAGS | CC | NVCC_PREPEND_FLAGS | NVCC_CCBIN | gcc (see probes.pick_compiler)
    source: str
    kind: str | None = None  # gcc | clang | None (unknown)
    version: str | None = None
    run: CmdResult | None = None
    problem: str | None = None
    missing: bool = False  # the variable names a compiler that does not exist

    @property
    def major(self) -> int | None:
        t = vtuple(self.version)
        return t[0] if t else None


@dataclass
class TorchInfo:
    python: str
    found: bool = False
    version: str | None = None
    cuda: str | None = None
    hip: str | None = None
    location: str | None = None
    nccl: str | None = None  # NCCL version available to torch
    nccl_from: str | None = None
    nccl_wheels: list[tuple[str, str]] = field(default_factory=list)  # (nvidia-nccl-cuN, version)
    nccl_required: tuple[str, str] | None = None  # the NCCL wheel torch's METADATA pins
    bin_dir: str | None = None  # the interpreter's scripts folder (where pip puts ninja)
    pip_toolkits: list[tuple[str, str]] = field(default_factory=list)  # (root, version)
    pip_ptxas: list[str] = field(default_factory=list)  # nvcc wheels with ptxas but no nvcc
    # CUDA libraries torch loads from its nvidia/ wheels: (soname, version, folder)
    pip_libs: list[tuple[str, str, str]] = field(default_factory=list)
    # nvidia-* wheels torch's METADATA pins (Requires-Dist: nvidia-cudnn-cu12==9.10.2.21), and
    # the nvidia-* distributions installed beside it: {distribution name: version}
    requires: dict[str, str] = field(default_factory=dict)
    nvidia_dists: dict[str, str] = field(default_factory=dict)
    problem: str | None = None  # the probe could not answer


@dataclass
class LdEntry:
    path: str
    real: str = ""
    exists: bool = True
    is_dir: bool = True
    problem: str | None = None  # unreadable
    why: str | None = None  # why a missing or non-folder entry is one (dangling symlink, ...)
    cudart: list[str] = field(default_factory=list)  # sonames, e.g. libcudart.so.12
    nccl: list[str] = field(default_factory=list)
    cudnn: list[str] = field(default_factory=list)
    cuda_libs: dict[str, str | None] = field(default_factory=dict)  # soname -> full version
    libcuda: str | None = None  # realpath of the libcuda.so.1 in this folder (cuda-compat's, say)


@dataclass
class Segment:
    """A shared-memory file NCCL or torch made (xl.doctor.probes.shm finds them)."""

    path: str
    size: int  # bytes it holds
    uid: int
    stale: bool | None  # None: can't tell (another user's processes are not ours to read)


@dataclass
class KernelModule:
    """The NVIDIA kernel module for the running kernel (read when the driver is not loaded)."""

    release: str  # uname -r
    loaded: bool = False  # in /proc/modules or /sys/module/nvidia
    built: str | None = None  # the nvidia.ko modprobe would load for this kernel
    other_kernels: list[str] = field(default_factory=list)  # installed kernels that have one
    distro: str | None = None  # /etc/os-release ID and ID_LIKE
    secure_boot: bool | None = None
    mok_key: str | None = None  # DKMS's signing key, to enroll
    dkms: list[str] | None = None  # `dkms status` lines naming nvidia; None: no dkms
    branch: str | None = None  # the driver's branch (570), from its libcuda or dkms

    def to_json(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class Facts:
    env: dict[str, str]
    python: str
    driver: Driver | None = None  # None when the inventory could not be taken at all
    gpus: tuple[GPU, ...] = ()
    nvml_problem: str | None = None  # the inventory itself could not be taken
    health: dict[int, Health] = field(default_factory=dict)  # by GPU index
    path_nvcc: str | None = None
    path_nvcc_run: CmdResult | None = None
    cuda_home: str | None = None  # as torch resolves it
    cuda_home_from: str | None = None  # CUDA_HOME | CUDA_PATH | nvcc on PATH | /usr/local/cuda
    cuda_home_nvcc_run: CmdResult | None = None
    cuda_home_dir: Toolkit | None = None  # the CUDA_HOME folder itself, as found (no dedup)
    home_toolkit: str | None = None  # real root of the toolkit CUDA_HOME's nvcc belongs to
    path_toolkit: str | None = None  # real root of the toolkit PATH's nvcc belongs to
    toolkits: list[Toolkit] = field(default_factory=list)
    compiler: Compiler | None = None
    other_compilers: list[tuple[str, str, int]] = field(default_factory=list)  # (path, kind, major)
    torch: TorchInfo | None = None
    ld_entries: list[LdEntry] = field(default_factory=list)
    ldconfig: dict[str, list[str]] = field(default_factory=dict)  # soname -> paths
    ldconfig_problem: str | None = None
    ldconfig_versions: dict[str, str] = field(default_factory=dict)  # soname -> its file's version
    preload: list[tuple[str, str, str | None]] = field(
        default_factory=list
    )  # LD_PRELOAD's CUDA libs
    shm_path: str = "/dev/shm"
    shm_total: int | None = None
    shm_free: int | None = None
    shm_problem: str | None = None
    shm_segments: list[Segment] = field(default_factory=list)
    ninja: str | None = None
    ninja_run: CmdResult | None = None
    ninja_in_bin: str | None = None  # ninja beside the --python interpreter when not on PATH
    container: str | None = None  # docker | podman when this runs in one (its marker file)
    # where a run's cgroup would be made (xl.cgroup.find_place), or why none can be
    cgroup_parent: str | None = None
    cgroup_reason: str | None = None
    cgroup_memory: bool = False  # its memory controller is there (`xl launch --memory-limit`)
    net_ifaces: list[str] | None = None
    ib_devices: list[str] | None = None
    ib_ports: dict[str, dict[str, str]] = field(default_factory=dict)  # device -> port -> state
    nccl_plugin: tuple[str, str | None] | None = None  # NCCL_NET_PLUGIN's library, where found
    kernel: KernelModule | None = None  # only when NVML says the driver is not loaded
    # cuInit's result in a subprocess (only when NVML reports GPUs): its CUresult, or None with
    # why in cuinit_problem (no libcuda, no answer in time)
    cuinit: int | None = None
    cuinit_problem: str | None = None
    fabric: dict[int, tuple[str, str | None]] = field(
        default_factory=dict
    )  # GPU -> (state, status)
    fabric_manager: bool = False  # its daemon or unit is installed
    fabric_manager_version: str | None = None  # the installed package's, from dpkg's status
    distro: str | None = None  # /etc/os-release ID and ID_LIKE ("ubuntu debian")
    # The distribution that installs the driver, as "<family> <major>" ("ubuntu 24", "debian 12",
    # "rhel 9", "fedora 42"): this one's, or in a container the host's (from its kernel release)
    driver_os: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    build: BuildResult | None = None  # with --build only
    # Set by the registry: every check's status (by id) for other facts, so a fix is tried before
    # it is printed (xl.doctor.checks.fixes.first_safe); what_if marks such hypothetical facts.
    recheck: Callable[[Facts], dict[str, Status]] | None = None
    what_if: bool = False

    def toolkit_at(self, path: str | None) -> Toolkit | None:
        """The toolkit whose real path, root or an alias is `path` (the probes resolved them)."""
        if not path:
            return None
        return next((t for t in self.toolkits if path in (t.real, t.root, *t.aliases)), None)
