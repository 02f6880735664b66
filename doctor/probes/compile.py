"""`xl doctor --build`: compile a tiny CUDA extension the way torch's extension builder would,
as the proof behind the static verdicts.

The commands follow torch.utils.cpp_extension (2.13, its ninja path; DeepSpeed's op builder
goes through the same code): nvcc is $CUDA_HOME/bin/nvcc; `-ccbin $CC` comes first when CC is
set (nvcc itself adds NVCC_PREPEND_FLAGS / NVCC_APPEND_FLAGS from the environment, which is
passed on untouched); -I$CUDA_HOME/include (unless it is /usr/include) and $CUDA_INC_PATH; the
COMMON_NVCC_FLAGS; the -gencode flags of _get_cuda_arch_flags (xl.doctor.archs);
`--compiler-options -fPIC`; torch's -std. The .cpp half of an extension is compiled by $CXX
(default c++) with the same include folders, and the pieces are linked by it against
-L$CUDA_HOME/lib64 (lib when there is no lib64) -lcudart. When torch has CUDA, one more .cu
includes torch's own CUDA headers with its include folders and defines.

Everything happens in a temporary folder that is removed afterwards; every step has a timeout.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass, field

from xl.doctor.archs import ArchList, parse_arch_list
from xl.doctor.facts import CmdResult, Facts, vtuple
from xl.doctor.probes.commands import run_cmd
from xl.doctor.probes.files import is_dir, is_file, read_text, which
from xl.doctor.wheels import newest_sm

STEP_TIMEOUT = 120.0  # seconds per compiler run; a cold nvcc with torch headers takes ~20 s

COMMON_NVCC_FLAGS = [
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
]

CUDA_SOURCE = """#include <cuda_runtime.h>
__global__ void xl_probe_kernel(float* x) { x[threadIdx.x] *= 2.0f; }
extern "C" int xl_probe_launch(float* x) {
    xl_probe_kernel<<<1, 1>>>(x);
    return (int)cudaGetLastError();
}
"""
CPP_SOURCE = """#include <cuda_runtime_api.h>
extern "C" int xl_probe_launch(float* x);
extern "C" int xl_probe_device_count() { int n = 0; cudaGetDeviceCount(&n); return n; }
"""
TORCH_SOURCE = """#include <c10/cuda/CUDAException.h>
__global__ void xl_probe_torch_kernel(float* x) { x[threadIdx.x] += 1.0f; }
void xl_probe_torch(float* x) {
    xl_probe_torch_kernel<<<1, 1>>>(x);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

_ERROR_LINE = re.compile(r"error|fatal|No such file|not found|undefined reference", re.IGNORECASE)


@dataclass
class Step:
    name: str  # what the step builds, in words
    argv: list[str]
    run: CmdResult | None = None

    @property
    def ok(self) -> bool:
        return self.run is not None and self.run.ok

    def first_error(self, tmp: str) -> str:
        """The compiler's first error line (the temp folder's path left out)."""
        run = self.run
        if run is None:
            return "did not run"
        text = (run.stderr + "\n" + run.stdout).replace(tmp + os.sep, "")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        hit = next((ln for ln in lines if _ERROR_LINE.search(ln)), None)
        return (hit or (lines[0] if lines else run.problem or "failed"))[:300]


@dataclass
class BuildResult:
    steps: list[Step] = field(default_factory=list)
    seconds: float = 0.0
    tmp: str = ""
    archs: ArchList | None = None
    nvcc: str | None = None
    cannot: str | None = None  # why nothing could be compiled (no nvcc at CUDA_HOME, ...)

    @property
    def failed(self) -> Step | None:
        return next((s for s in self.steps if not s.ok), None)


def torch_std(torch_dir: str | None) -> str:
    """The -std torch's builder passes (c++20 since torch 2.10's cpp_extension, c++17 before)."""
    if torch_dir:
        text = read_text(os.path.join(torch_dir, "utils", "cpp_extension.py"), 1 << 22) or ""
        if "'-std=c++20'" in text:
            return "-std=c++20"
    return "-std=c++17"


def _arch_list(f: Facts) -> ArchList:
    caps = [g.compute_capability for g in f.gpus if not g.lost]
    return parse_arch_list(
        f.env.get("TORCH_CUDA_ARCH_LIST"),
        [c for c in caps if c],
        newest_sm(f.torch.cuda, f.torch.version) if f.torch is not None else None,
        vtuple(f.torch.version) if f.torch is not None else None,
    )


def plan(f: Facts, tmp: str) -> BuildResult:
    """The commands a torch extension build would run here, not yet run."""
    res = BuildResult(tmp=tmp)
    home = f.cuda_home
    nvcc = os.path.join(home, "bin", "nvcc") if home else None
    if not home or nvcc is None or not is_file(nvcc):
        res.cannot = f"no nvcc at CUDA_HOME ({home or 'unresolved'}/bin/nvcc)"
        return res
    res.nvcc = nvcc
    env = os.environ
    t = f.torch
    torch_dir = t.location if t is not None and t.found else None
    std = torch_std(torch_dir)
    includes = [] if os.path.join(home, "include") == "/usr/include" else [f"-I{home}/include"]
    inc_path = env.get("CUDA_INC_PATH")
    if inc_path and inc_path != "/usr/include":
        includes.append(f"-I{inc_path}")
    res.archs = _arch_list(f)
    arch_flags = res.archs.flags() if res.archs.bad is None else []
    cc = env.get("CC")
    ccbin = ["-ccbin", cc] if cc is not None else []
    nvcc_flags = [*COMMON_NVCC_FLAGS, *arch_flags, "--compiler-options", "-fPIC", std]
    cxx = env.get("CXX") or "c++"
    cxx = which(cxx, env.get("PATH")) or cxx
    lib = os.path.join(home, "lib64")
    if not is_dir(lib) and is_dir(os.path.join(home, "lib")):
        lib = os.path.join(home, "lib")
    j = os.path.join
    res.steps = [
        Step(
            "the CUDA kernel (nvcc)",
            [
                nvcc,
                *ccbin,
                *includes,
                *nvcc_flags,
                "-c",
                j(tmp, "probe.cu"),
                "-o",
                j(tmp, "probe.cuda.o"),
            ],
        ),
        Step(
            "the C++ side (c++ with CUDA headers)",
            [cxx, *includes, "-fPIC", std, "-c", j(tmp, "probe.cpp"), "-o", j(tmp, "probe.o")],
        ),
        Step(
            "the shared library (link with -lcudart)",
            [
                cxx,
                "-shared",
                j(tmp, "probe.o"),
                j(tmp, "probe.cuda.o"),
                f"-L{lib}",
                "-lcudart",
                "-o",
                j(tmp, "probe.so"),
            ],
        ),
    ]
    if t is not None and t.cuda and torch_dir and is_dir(j(torch_dir, "include")):
        tinc = [f"-I{torch_dir}/include", f"-I{torch_dir}/include/torch/csrc/api/include"]
        defines = ["-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=xl_probe"]
        argv = [nvcc, *ccbin, *tinc, *includes, *defines, *nvcc_flags]
        res.steps.append(
            Step(
                "a torch extension (torch's CUDA headers)",
                [*argv, "-c", j(tmp, "torch_probe.cu"), "-o", j(tmp, "torch_probe.o")],
            )
        )
    return res


def run_build(f: Facts, timeout: float = STEP_TIMEOUT) -> BuildResult:
    """Plan and run the build in a temporary folder; stops at the first step that fails."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="xl-doctor-build-") as tmp:
        res = plan(f, tmp)
        for name, text in (
            ("probe.cu", CUDA_SOURCE),
            ("probe.cpp", CPP_SOURCE),
            ("torch_probe.cu", TORCH_SOURCE),
        ):
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as fh:
                fh.write(text)
        for step in res.steps:
            step.run = run_cmd(step.argv, timeout=timeout, label=os.path.basename(step.argv[0]))
            if not step.run.ok:
                break
    res.seconds = time.perf_counter() - t0
    return res
