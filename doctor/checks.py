"""Checks: pure functions from Facts to one Check each (status, one-line detail, concrete fix)."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from xl.doctor.facts import Facts, Toolkit, major_minor, parse_nvcc_version, vtuple
from xl.doctor.report import Check
from xl.doctor.tables import (
    ARCH_NAMES,
    DRIVER_FOR_CUDA,
    NVCC_ARCH_RANGE,
    compiler_max_from_table,
    deepspeed_verdict,
    torch_install_fix,
    wheel_tag_for,
)

MIB = 1024 * 1024
SHM_MIN = 512 * MIB

A_GPU = "Driver & GPUs"
A_CUDA = "CUDA toolkit"
A_TORCH = "PyTorch"
A_DEV = "Devices"
A_SYS = "System"


# ---------------------------------------------------------------------------------------------
# shared views over the facts


def _gpus(f: Facts) -> list[Any]:
    return [g for g in f.gpus if not getattr(g, "lost", False)]


def _torch_cuda(f: Facts) -> str | None:
    t = f.torch
    return t.cuda if t is not None and t.found and t.cuda else None


def _torch_label(f: Facts) -> str:
    t = f.torch
    return f"torch {t.version}" if t is not None and t.version else "torch"


def _nvcc_versions(f: Facts, which: str) -> tuple[str | None, str | None]:
    run = f.path_nvcc_run if which == "path" else f.cuda_home_nvcc_run
    if run is None or not run.ok:
        return None, None
    return parse_nvcc_version(run.stdout + run.stderr)


def home_cuda(f: Facts) -> tuple[str | None, str]:
    """The toolkit version torch's extension builder would use (CUDA_HOME's nvcc), and its source."""
    short, _ = _nvcc_versions(f, "home")
    if short:
        return short, f"{f.cuda_home}/bin/nvcc"
    tk = f.toolkit_at(f.home_toolkit) if f.home_toolkit else None
    if tk is not None and tk.short:
        return tk.short, tk.root
    short, _ = _nvcc_versions(f, "path")
    if short and f.cuda_home is None:
        return short, f.path_nvcc or "nvcc"
    return None, ""


def _in_use_toolkit(f: Facts) -> Toolkit | None:
    for real in (f.home_toolkit, f.path_toolkit):
        tk = f.toolkit_at(real) if real else None
        if tk is not None:
            return tk
    return None


def _toolkit_with(f: Facts, cuda: str) -> Toolkit | None:
    """An installed toolkit of exactly this major.minor, complete ones (headers, e.g. not pip's
    nvcc-only wheel) first, then those whose folder names the version (cuda-12.4 over cuda)."""
    want = major_minor(cuda)
    if want is None:
        return None
    matches = [t for t in f.toolkits if t.short == want and t.problem is None and t.nvcc]
    matches.sort(key=lambda t: (not t.has_headers, want not in os.path.basename(t.root)))
    return matches[0] if matches else None


def _export_toolkit(tk: Toolkit) -> str:
    return f"export CUDA_HOME={tk.root} PATH={tk.root}/bin:$PATH"


def _python(f: Facts) -> str:
    return f.torch.python if f.torch is not None and f.torch.python else f.python


# ---------------------------------------------------------------------------------------------
# driver / gpus


def check_driver(f: Facts) -> Check:
    title = "NVIDIA driver"
    d = f.driver
    if d is None:
        return Check(
            "driver",
            "error",
            title,
            f"could not query NVML: {f.nvml_problem or 'no answer'}",
            "run `nvidia-smi` to see whether the driver answers",
            A_GPU,
        )
    if d.error:
        kind = d.error_kind or "other"
        data = {"error_kind": kind}
        if kind == "library_not_found":
            status = "warn" if _torch_cuda(f) else "skip"
            fix = "install the NVIDIA driver to train on GPUs (CPU training with gloo works without one)"
            return Check("driver", status, title, d.error, fix, A_GPU, data)
        fixes = {
            "driver_not_loaded": "sudo modprobe nvidia (or reboot); `dmesg | grep -i nvidia` says why it did not load",
            "version_mismatch": "reboot, or unload and reload the kernel module: sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia",
            "no_permission": "add yourself to the group that owns /dev/nvidia* (often `video`): sudo usermod -aG video $USER, then log in again",
        }
        status = "error" if kind == "other" else "fail"
        return Check(
            "driver",
            status,
            title,
            d.error,
            fixes.get(kind, "run `nvidia-smi`; reinstall the driver if it fails too"),
            A_GPU,
            data,
        )
    cuda = f" supports CUDA up to {d.cuda_version}" if d.cuda_version else ""
    return Check(
        "driver",
        "ok",
        title,
        f"driver {d.version or '?'}{cuda}",
        "",
        A_GPU,
        {"version": d.version, "cuda_version": d.cuda_version},
    )


def _one_model_fix(gpus: Sequence[Any], names: Counter[str]) -> str:
    """The exact --gpus of the most numerous model (the first one listed on a tie); called only
    when no GPU is lost."""
    model = max(names, key=lambda n: names[n])
    indices = ",".join(str(g.index) for g in gpus if g.name == model)
    return f"train on one model: xl launch --gpus {indices} ...  (the {names[model]}x {model})"


def check_gpus(f: Facts) -> Check:
    title = "GPUs"
    d = f.driver
    if d is None or d.error:
        return Check(
            "gpus",
            "skip",
            title,
            "no GPUs can be listed without a working NVIDIA driver",
            "see the driver check" if d is not None and d.error_kind != "library_not_found" else "",
            A_GPU,
        )
    if not f.gpus:
        return Check(
            "gpus",
            "warn",
            title,
            "the driver is loaded but reports no GPUs",
            "check `nvidia-smi`; in a container pass the GPUs in (docker run --gpus all)",
            A_GPU,
        )
    lost = [g for g in f.gpus if getattr(g, "lost", False)]
    names = Counter(g.name for g in f.gpus if not getattr(g, "lost", False))
    models = ", ".join(f"{n}x {name}" for name, n in names.items())
    data = {"count": len(f.gpus), "models": dict(names), "lost": [g.index for g in lost]}
    if lost:
        which = ", ".join(
            f"GPU {g.index}" + (f" ({g.pci_bus_id})" if g.pci_bus_id else "") for g in lost
        )
        return Check(
            "gpus",
            "fail",
            title,
            f"{which} lost (stopped answering the driver); working: {models or 'none'}",
            "check `dmesg` for Xid errors, then `sudo nvidia-smi -r -i <index>` or reboot",
            A_GPU,
            data,
        )
    errors = [g for g in f.gpus if getattr(g, "error", None)]
    if len(names) > 1:
        return Check(
            "gpus",
            "warn",
            title,
            f"mixed models: {models}; DDP runs every rank at the slowest GPU's pace",
            _one_model_fix(f.gpus, names),
            A_GPU,
            data,
        )
    if errors:
        g = errors[0]
        return Check(
            "gpus",
            "warn",
            title,
            f"{models}; GPU {g.index}: {g.error}",
            f"run `nvidia-smi -q -i {g.index}` to see the GPU's state",
            A_GPU,
            data,
        )
    return Check("gpus", "ok", title, models, "", A_GPU, data)


# ---------------------------------------------------------------------------------------------
# CUDA toolkit


def check_cuda_home(f: Facts) -> Check:
    title = "CUDA_HOME"
    home, src = f.cuda_home, f.cuda_home_from
    data: dict[str, Any] = {"cuda_home": home, "from": src}
    if home == "":
        # torch's `CUDA_HOME or CUDA_PATH` returns an empty CUDA_PATH as is and stops looking.
        best = _in_use_toolkit(f) or next(
            (t for t in f.toolkits if t.nvcc and t.version and not t.problem), None
        )
        return Check(
            "cuda_home",
            "fail" if _torch_cuda(f) else "warn",
            title,
            f"{src} is set but empty: torch takes CUDA_HOME='' and looks for nvcc at the relative path bin/nvcc, so CUDA extension builds fail",
            f"unset {src}" + (f"; {_export_toolkit(best)}" if best is not None else ""),
            A_CUDA,
            data,
        )
    if not home:
        if _torch_cuda(f):
            tk = _toolkit_with(f, _torch_cuda(f) or "")
            fix = (
                _export_toolkit(tk)
                if tk
                else f"install CUDA toolkit {_torch_cuda(f)} and export CUDA_HOME=/usr/local/cuda-{_torch_cuda(f)}"
            )
            return Check(
                "cuda_home",
                "warn",
                title,
                "unresolved (no CUDA_HOME, CUDA_PATH, nvcc on PATH or /usr/local/cuda): CUDA extension builds fail",
                fix,
                A_CUDA,
                data,
            )
        return Check(
            "cuda_home",
            "skip",
            title,
            "no CUDA toolkit anywhere (only needed to build CUDA extensions)",
            "",
            A_CUDA,
            data,
        )
    d = f.cuda_home_dir
    best = _in_use_toolkit(f)
    if best is None or not best.version or best.problem:
        best = next((t for t in f.toolkits if t.nvcc and t.version and not t.problem), None)
    home_real = d.real if d is not None else home
    alt = _export_toolkit(best) if best is not None and best.real != home_real else ""
    if d is None or d.problem:
        why = d.problem if d is not None and d.problem else f"{home} is not readable"
        fix = alt or (f"unset {src}" if src in ("CUDA_HOME", "CUDA_PATH") else "")
        return Check(
            "cuda_home",
            "fail",
            title,
            f"{src}={home}: {why}",
            fix or f"point {src} at an installed toolkit",
            A_CUDA,
            data,
        )
    if d.nvcc is None:
        return Check(
            "cuda_home",
            "fail",
            title,
            f'{home} (from {src}) has no bin/nvcc: torch raises "nvcc not found" on every CUDA extension build',
            alt or "install the CUDA toolkit there or point CUDA_HOME at one",
            A_CUDA,
            data,
        )
    home_short, home_full = _nvcc_versions(f, "home")
    run = f.cuda_home_nvcc_run
    if run is not None and not run.ok:
        return Check(
            "cuda_home",
            "error",
            title,
            f"{home}/bin/nvcc: {run.problem}",
            alt or "reinstall the toolkit's nvcc",
            A_CUDA,
            data,
        )
    if run is not None and home_short is None:
        return Check(
            "cuda_home",
            "error",
            title,
            f"{home}/bin/nvcc --version printed no 'release X.Y' (first line: {run.first_line()!r})",
            alt or "check that this is NVIDIA's nvcc; reinstall the toolkit",
            A_CUDA,
            data,
        )
    data["nvcc_version"] = home_full or home_short
    if not d.has_headers:
        where = f"the folder above {f.path_nvcc}" if src == "nvcc on PATH" else src
        target = f.home_toolkit and f.toolkit_at(f.home_toolkit)
        lead = f"; its nvcc leads to {target.root}" if target and target.real != d.real else ""
        fix = (
            _export_toolkit(target)
            if target and target.real != d.real and target.has_headers
            else alt
        )
        return Check(
            "cuda_home",
            "warn",
            title,
            f"{home} ({where}) has no include/cuda_runtime.h{lead}: extension builds won't find CUDA headers and libraries",
            fix or "point CUDA_HOME at a complete toolkit",
            A_CUDA,
            data,
        )
    path_short, _ = _nvcc_versions(f, "path")
    if path_short and home_short and path_short != home_short:
        return Check(
            "cuda_home",
            "warn",
            title,
            f"{home} has nvcc {home_short} but `nvcc` on PATH is {path_short} ({f.path_nvcc}): torch builds with {home_short}",
            f"export PATH={home}/bin:$PATH (or point CUDA_HOME at the {path_short} toolkit)",
            A_CUDA,
            data,
        )
    ver = f" (CUDA {home_short})" if home_short else ""
    return Check(
        "cuda_home", "ok", title, f"{home}{ver}, from {src}, as torch resolves it", "", A_CUDA, data
    )


def check_nvcc(f: Facts) -> Check:
    title = "nvcc"
    if f.path_nvcc is None:
        home_nvcc = f.cuda_home_dir.nvcc if f.cuda_home_dir is not None else None
        if home_nvcc:
            short, _ = _nvcc_versions(f, "home")
            return Check(
                "nvcc",
                "warn",
                title,
                f"not on PATH; CUDA_HOME has {home_nvcc}" + (f" ({short})" if short else ""),
                f"export PATH={os.path.dirname(home_nvcc)}:$PATH",
                A_CUDA,
            )
        tk = next((t for t in f.toolkits if t.nvcc and not t.problem), None)
        if tk is not None:
            return Check(
                "nvcc",
                "warn",
                title,
                f"not on PATH, but {tk.nvcc} exists",
                _export_toolkit(tk),
                A_CUDA,
            )
        if _torch_cuda(f):
            return Check(
                "nvcc",
                "warn",
                title,
                "no nvcc anywhere: CUDA extensions (DeepSpeed ops, JIT kernels) can't be built",
                f"install the CUDA {_torch_cuda(f)} toolkit (nvcc), e.g. from developer.nvidia.com/cuda-downloads",
                A_CUDA,
            )
        return Check(
            "nvcc", "skip", title, "no nvcc (only needed to build CUDA extensions)", "", A_CUDA
        )
    run = f.path_nvcc_run
    if run is None or not run.ok:
        why = run.problem if run is not None else "was not run"
        return Check(
            "nvcc",
            "error",
            title,
            f"{f.path_nvcc}: {why}",
            "run `nvcc --version` by hand; reinstall the toolkit if it fails",
            A_CUDA,
        )
    short, full = parse_nvcc_version(run.stdout + run.stderr)
    if short is None:
        return Check(
            "nvcc",
            "error",
            title,
            f"{f.path_nvcc} --version printed no 'release X.Y' (first line: {run.first_line()!r})",
            "check that this file is NVIDIA's nvcc (`file $(which nvcc)`)",
            A_CUDA,
        )
    return Check(
        "nvcc",
        "ok",
        title,
        f"CUDA {short} (V{full or short}) at {f.path_nvcc}",
        "",
        A_CUDA,
        {"path": f.path_nvcc, "version": full or short},
    )


def _ld_toolkit(f: Facts) -> tuple[Toolkit | None, str | None]:
    """The toolkit whose libcudart LD_LIBRARY_PATH selects first, and that soname. The loader
    looks for the major the toolkit in use (or torch) needs; any libcudart counts otherwise."""
    tk = _in_use_toolkit(f)
    want = vtuple(tk.version)[:1] if tk is not None else vtuple(_torch_cuda(f))[:1]
    for e in f.ld_entries:
        names = (
            [s for s in e.cudart if vtuple(s.rsplit(".so.", 1)[-1])[:1] == want]
            if want
            else e.cudart
        )
        if names:
            for tk in f.toolkits:
                if e.real in tk.lib_dirs:
                    return tk, names[-1]
            return None, names[-1]
    return None, None


def check_toolkits(f: Facts) -> Check:
    title = "CUDA toolkits"
    usable = [t for t in f.toolkits if not t.problem]
    data: dict[str, Any] = {"toolkits": [t.to_json() for t in f.toolkits]}
    if not f.toolkits:
        status = "warn" if _torch_cuda(f) else "skip"
        return Check(
            "toolkits",
            status,
            title,
            "none found (/usr/local/cuda*, /opt/cuda*, CUDA_HOME, CUDA_PATH, PATH, $CONDA_PREFIX, pip)",
            f"install CUDA toolkit {_torch_cuda(f)} to build extensions" if _torch_cuda(f) else "",
            A_CUDA,
            data,
        )
    listing = "; ".join(f"{t.root} {t.version or '?'}" for t in f.toolkits)
    selected: dict[str, str] = {}
    path_tk = f.toolkit_at(f.path_toolkit) if f.path_toolkit else None
    home_tk = f.toolkit_at(f.home_toolkit) if f.home_toolkit else None
    ld_tk, ld_soname = _ld_toolkit(f)
    if path_tk:
        selected["PATH"] = path_tk.root
    if home_tk:
        selected["CUDA_HOME"] = home_tk.root
    if ld_tk:
        selected["LD_LIBRARY_PATH"] = ld_tk.root
    data["selected"] = selected
    versions: dict[str, str | None] = {}
    for k, v in selected.items():
        found = f.toolkit_at(v)
        versions[k] = found.short if found is not None else None
    if ld_soname and not ld_tk:
        versions["LD_LIBRARY_PATH"] = ld_soname.rsplit(".", 1)[-1]
    sel = ", ".join(f"{k} -> {v}" for k, v in selected.items()) or "nothing selects one"
    broken = [t for t in f.toolkits if t.problem]
    distinct_mm = {v for v in versions.values() if v and "." in v}
    majors = {v.split(".")[0] for v in versions.values() if v}
    if len(distinct_mm) > 1 or len(majors) > 1:
        pairs = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
        target = home_tk or path_tk
        fix = (
            _export_toolkit(target)
            + (f" LD_LIBRARY_PATH={target.root}/lib64:$LD_LIBRARY_PATH" if target else "")
            if target
            else ""
        )
        return Check(
            "toolkits",
            "warn",
            title,
            f"they disagree: {pairs} (found: {listing})",
            fix or "make PATH, CUDA_HOME and LD_LIBRARY_PATH name the same toolkit",
            A_CUDA,
            data,
        )
    if broken and not usable:
        return Check(
            "toolkits",
            "fail",
            title,
            f"{broken[0].root}: {broken[0].problem}",
            "fix the folder's permissions or point CUDA_HOME elsewhere",
            A_CUDA,
            data,
        )
    unknown = [t for t in usable if t.version is None and t.nvcc]
    if unknown:
        t = unknown[0]
        run = t.nvcc_run
        why = (
            run.problem
            if run is not None and run.problem
            else f"`{t.nvcc} --version` printed no 'release X.Y'"
        )
        return Check(
            "toolkits",
            "error",
            title,
            f"{t.root}: version unknown, {why}; found: {listing}",
            f"run `{t.nvcc} --version` by hand; remove or repair this toolkit",
            A_CUDA,
            data,
        )
    return Check("toolkits", "ok", title, f"{listing}; {sel}", "", A_CUDA, data)


# ---------------------------------------------------------------------------------------------
# torch


def check_torch(f: Facts) -> Check:
    title = "PyTorch"
    t = f.torch
    py = _python(f)
    if t is None or (t.problem and not t.found):
        why = t.problem if t is not None else "the probe did not run"
        return Check(
            "torch",
            "error",
            title,
            f"could not inspect torch in {py}: {why}",
            f"run `{py} -c 'import torch; print(torch.__version__)'` to see the error",
            A_TORCH,
        )
    gpus = _gpus(f)
    data = {"python": t.python, "version": t.version, "cuda": t.cuda, "location": t.location}
    if not t.found:
        driver_cuda = f.driver.cuda_version if f.driver is not None and not f.driver.error else None
        tag = wheel_tag_for(driver_cuda, at_most=True) if driver_cuda else "cpu"
        return Check(
            "torch",
            "fail",
            title,
            f"torch is not installed in {py}",
            f"{py} -m pip install torch --index-url https://download.pytorch.org/whl/{tag or 'cpu'}",
            A_TORCH,
            data,
        )
    if t.problem:
        return Check(
            "torch",
            "error",
            title,
            f"torch at {t.location}: {t.problem}",
            f"reinstall torch: {py} -m pip install --force-reinstall torch",
            A_TORCH,
            data,
        )
    if t.hip:
        return Check(
            "torch", "ok", title, f"torch {t.version} (ROCm {t.hip} build)", "", A_TORCH, data
        )
    if not t.cuda:
        if gpus:
            driver_cuda = f.driver.cuda_version if f.driver is not None else None
            tag = wheel_tag_for(driver_cuda, at_most=True) or "cu126"
            return Check(
                "torch",
                "fail",
                title,
                f"torch {t.version} is a CPU-only build but this machine has {len(gpus)} GPU(s): training can't use them",
                torch_install_fix(tag, py, t.version),
                A_TORCH,
                data,
            )
        return Check(
            "torch",
            "ok",
            title,
            f"torch {t.version} (CPU-only build; fine with no GPUs, ranks use gloo)",
            "",
            A_TORCH,
            data,
        )
    return Check(
        "torch", "ok", title, f"torch {t.version}, built with CUDA {t.cuda}", "", A_TORCH, data
    )


def check_torch_cuda_match(f: Facts) -> Check:
    title = "torch CUDA vs nvcc"
    tc = _torch_cuda(f)
    if not tc:
        return Check(
            "torch_cuda_match", "skip", title, "torch has no CUDA build to compare", "", A_TORCH
        )
    tk_ver, where = home_cuda(f)
    if not tk_ver:
        return Check(
            "torch_cuda_match",
            "skip",
            title,
            f"no toolkit nvcc to compare with torch's CUDA {tc} (only extension builds need one)",
            "",
            A_TORCH,
        )
    a, b = vtuple(tk_ver)[:2], vtuple(tc)[:2]
    skip = (f.env.get("DS_SKIP_CUDA_CHECK") or "") == "1"
    verdict = deepspeed_verdict(tk_ver, tc, skip)
    data = {"toolkit": tk_ver, "torch_cuda": tc, "toolkit_nvcc": where, "deepspeed": verdict}
    if a == b:
        return Check(
            "torch_cuda_match", "ok", title, f"both CUDA {major_minor(tc)}", "", A_TORCH, data
        )
    match = _toolkit_with(f, tc)
    py = _python(f)
    tag = wheel_tag_for(tk_ver)
    version = f.torch.version if f.torch is not None else None
    if match is not None:
        fix = _export_toolkit(match)
    elif tag:
        fix = f"install toolkit {major_minor(tc)}, or a torch built for {major_minor(tk_ver)}: {torch_install_fix(tag, py, version)}"
    else:
        fix = f"install CUDA toolkit {major_minor(tc)} and export CUDA_HOME to it"
    if a[0] != b[0]:
        return Check(
            "torch_cuda_match",
            "fail",
            title,
            f"nvcc is CUDA {major_minor(tk_ver)} but {_torch_label(f)} was built with {tc}: torch's extension builder refuses a major mismatch; {verdict}",
            fix,
            A_TORCH,
            data,
        )
    return Check(
        "torch_cuda_match",
        "warn",
        title,
        f"nvcc is CUDA {major_minor(tk_ver)} but {_torch_label(f)} was built with {tc}: torch only warns; {verdict}",
        fix,
        A_TORCH,
        data,
    )


def check_driver_cuda(f: Facts) -> Check:
    title = "driver vs torch CUDA"
    tc = _torch_cuda(f)
    d = f.driver
    if not tc:
        return Check("driver_cuda", "skip", title, "torch has no CUDA build", "", A_TORCH)
    if d is None or d.error or not d.cuda_version:
        return Check("driver_cuda", "skip", title, "no NVIDIA driver to compare with", "", A_TORCH)
    data = {"driver_cuda": d.cuda_version, "torch_cuda": tc, "driver": d.version}
    if vtuple(d.cuda_version)[:2] >= vtuple(tc)[:2]:
        return Check(
            "driver_cuda",
            "ok",
            title,
            f"driver supports CUDA {d.cuda_version} >= torch's {tc}",
            "",
            A_TORCH,
            data,
        )
    need = DRIVER_FOR_CUDA.get(major_minor(tc) or "")
    tag = wheel_tag_for(d.cuda_version, at_most=True)
    py = _python(f)
    version = f.torch.version if f.torch is not None else None
    fix = f"upgrade the NVIDIA driver to {need} or newer" if need else "upgrade the NVIDIA driver"
    if tag:
        fix += f", or install a torch built for CUDA <= {d.cuda_version}: {torch_install_fix(tag, py, version)}"
    return Check(
        "driver_cuda",
        "fail",
        title,
        f'driver {d.version} supports CUDA up to {d.cuda_version} but torch needs {tc}: "CUDA driver version is insufficient"',
        fix,
        A_TORCH,
        data,
    )


def check_host_compiler(f: Facts) -> Check:
    title = "host compiler"
    c = f.compiler
    tk = _in_use_toolkit(f)
    cuda_ver, _ = home_cuda(f)
    if cuda_ver is None and tk is not None:
        cuda_ver = tk.version
    if c is None:
        if cuda_ver:
            return Check(
                "host_compiler",
                "warn",
                title,
                "no host compiler for nvcc: no `gcc` on PATH, and neither CC nor NVCC_CCBIN names one",
                "install one: sudo apt install g++ (or point NVCC_CCBIN and CC at a compiler)",
                A_CUDA,
            )
        return Check("host_compiler", "skip", title, "no compiler and no nvcc", "", A_CUDA)
    data: dict[str, Any] = {
        "path": c.path,
        "source": c.source,
        "kind": c.kind,
        "version": c.version,
    }
    if c.problem:
        return Check(
            "host_compiler",
            "error",
            title,
            f"{c.path} (from {c.source}): {c.problem}",
            f"check `{c.path} --version`; point NVCC_CCBIN at a working gcc/g++",
            A_CUDA,
            data,
        )
    if not cuda_ver:
        return Check(
            "host_compiler",
            "skip",
            title,
            f"{c.kind} {c.version} at {c.path}; no nvcc to check it against",
            "",
            A_CUDA,
            data,
        )
    kind = c.kind or "gcc"
    lo = hi = None
    src = ""
    if tk is not None and tk.host_config:
        lo, hi = (tk.gcc_min, tk.gcc_max) if kind == "gcc" else (tk.clang_min, tk.clang_max)
        src = tk.host_config
    if hi is None:
        # The full version matters: 11.4.0 (nvcc V11.4.48) accepts gcc 10, 11.4.1 gcc 11.
        full = _nvcc_versions(f, "home")[1] or _nvcc_versions(f, "path")[1]
        if major_minor(full) != major_minor(cuda_ver):
            full = tk.version if tk is not None and tk.short == major_minor(cuda_ver) else cuda_ver
        hi = compiler_max_from_table(kind, full)
        src = f"NVIDIA's support table for CUDA {major_minor(cuda_ver)}" if hi is not None else ""
    data.update({"max_major": hi, "min_major": lo, "limit_from": src, "cuda": cuda_ver})
    label = f"{kind} {c.version} ({c.path}, from {c.source})"
    if hi is None:
        return Check(
            "host_compiler",
            "warn",
            title,
            f"{label}: no known limit for CUDA {major_minor(cuda_ver)}",
            "check NVIDIA's installation guide for the supported compilers",
            A_CUDA,
            data,
        )
    major = c.major or 0
    if major > hi or (lo is not None and major < lo):
        cands = sorted(
            (x for x in f.other_compilers if x[1] == kind and (lo or 0) <= x[2] <= hi),
            key=lambda x: -x[2],
        )
        cxx = [x for x in cands if "++" in os.path.basename(x[0])]
        pick = (cxx or cands)[0] if cands else None
        if pick is not None:
            # CC too: torch's builder passes `-ccbin $CC`, which beats NVCC_CCBIN.
            folder, name = os.path.split(pick[0])
            c_name = name.replace("g++", "gcc").replace("clang++", "clang")
            paired = [x[0] for x in f.other_compilers if x[0] == os.path.join(folder, c_name)]
            cc = paired[0] if paired else pick[0]
            fix = f"export NVCC_CCBIN={pick[0]} CC={cc} CXX={pick[0]}"
        else:
            fix = (
                f"install {kind} {hi} (e.g. sudo apt install g++-{hi}) and export NVCC_CCBIN=/usr/bin/g++-{hi} CC=/usr/bin/gcc-{hi} CXX=/usr/bin/g++-{hi}"
                if kind == "gcc"
                else f"install clang {hi} and export NVCC_CCBIN=/usr/bin/clang++-{hi} CC=/usr/bin/clang-{hi} CXX=/usr/bin/clang++-{hi}"
            )
        if c.source == "NVCC_APPEND_FLAGS":
            # Its -ccbin comes last on nvcc's command line and beats every variable.
            fix = f"remove -ccbin from NVCC_APPEND_FLAGS; {fix}"
        bound = f"<= {hi}" if major > hi else f">= {lo}"
        return Check(
            "host_compiler",
            "fail",
            title,
            f"{label} is outside what nvcc {major_minor(cuda_ver)} accepts ({kind} {bound}, from {src})",
            fix,
            A_CUDA,
            data,
        )
    return Check(
        "host_compiler",
        "ok",
        title,
        f"{label}; nvcc {major_minor(cuda_ver)} accepts {kind} <= {hi}",
        "",
        A_CUDA,
        data,
    )


def check_ld_library_path(f: Facts) -> Check:
    title = "LD_LIBRARY_PATH"
    value = f.env.get("LD_LIBRARY_PATH")
    tk = _in_use_toolkit(f)
    want: tuple[int, ...] = vtuple(tk.version)[:1] if tk is not None and tk.version else ()
    data: dict[str, Any] = {"entries": [e.path for e in f.ld_entries], "ldconfig": f.ldconfig}
    if f.ldconfig_problem:
        data["ldconfig_problem"] = f.ldconfig_problem
    cache = f.ldconfig.get(f"libcudart.so.{want[0]}") if want else None
    if value is None:
        extra = (
            f"; the ldconfig cache resolves libcudart.so.{want[0]} to {cache[0]}" if cache else ""
        )
        return Check("ld_library_path", "ok", title, f"unset{extra}", "", A_CUDA, data)
    if value == "":
        return Check(
            "ld_library_path",
            "ok",
            title,
            "set but empty (the loader ignores it)",
            "",
            A_CUDA,
            data,
        )
    problems: list[str] = []
    fixes: list[str] = []
    empties = [i for i, e in enumerate(f.ld_entries) if e.path == ""]
    if empties:
        problems.append("an empty entry (a stray ':' means the current directory)")
    missing = [
        e.path + (f" ({e.why})" if e.why and e.why != "does not exist" else "")
        for e in f.ld_entries
        if e.path and not e.exists
    ]
    if missing:
        problems.append(f"missing {', '.join(missing[:3])}")
    files = [e.path for e in f.ld_entries if e.exists and not e.is_dir]
    if files:
        problems.append(f"not a folder: {', '.join(files[:3])}")
    unreadable = [e.path for e in f.ld_entries if e.problem]
    if unreadable:
        problems.append(f"unreadable {', '.join(unreadable[:3])}")
    if want:
        tk_dirs = set(tk.lib_dirs) if tk is not None else set()
        tk_pos = next((i for i, e in enumerate(f.ld_entries) if e.real in tk_dirs), None)
        for i, e in enumerate(f.ld_entries):
            if e.real in tk_dirs:
                continue
            other = [s for s in e.cudart if vtuple(s.rsplit(".so.", 1)[-1])[:1] != want]
            same = [s for s in e.cudart if vtuple(s.rsplit(".so.", 1)[-1])[:1] == want]
            if other:
                problems.append(
                    f"{e.path} holds {', '.join(other)} but the toolkit in use is CUDA {tk.short if tk else '?'}"
                )
            if same and (tk_pos is None or i < tk_pos):
                # Same soname, maybe another minor: the loader takes this one, not the toolkit's.
                problems.append(
                    f"{e.path}/{same[0]} shadows the toolkit's ({tk.root if tk else '?'})"
                )
    if not problems:
        extra = ""
        if cache and not any(f"libcudart.so.{want[0]}" in e.cudart for e in f.ld_entries):
            extra = f"; the ldconfig cache resolves libcudart.so.{want[0]} to {cache[0]}"
        return Check(
            "ld_library_path",
            "ok",
            title,
            f"{len(f.ld_entries)} {'entry' if len(f.ld_entries) == 1 else 'entries'}, no conflicting CUDA libraries{extra}",
            "",
            A_CUDA,
            data,
        )
    lib_dirs = tk.lib_dirs if tk is not None else []
    keep = [
        e.path
        for e in f.ld_entries
        if e.path
        and e.exists
        and e.is_dir
        and not e.problem
        and (not e.cudart or e.real in lib_dirs)
    ]
    if tk is not None and tk.lib_dirs and not any(e.real in tk.lib_dirs for e in f.ld_entries):
        keep.insert(0, f"{tk.root}/lib64")
    fixes.append(
        f"export LD_LIBRARY_PATH={':'.join(dict.fromkeys(keep))}"
        if keep
        else "unset LD_LIBRARY_PATH"
    )
    return Check(
        "ld_library_path",
        "warn",
        title,
        "; ".join(problems),
        fixes[0],
        A_CUDA,
        data,
    )


# ---------------------------------------------------------------------------------------------
# devices


def _resolve_visible(f: Facts) -> Any:
    from xl.gpu.devices import resolve_visible_devices

    return resolve_visible_devices(list(f.gpus), f.env)


def check_cuda_visible_devices(f: Facts) -> Check:
    title = "CUDA_VISIBLE_DEVICES"
    value = f.env.get("CUDA_VISIBLE_DEVICES")
    gpus = list(f.gpus)
    have_driver = f.driver is not None and not f.driver.error
    if value is None:
        detail = f"unset: all {len(gpus)} GPU(s) visible" if have_driver else "unset"
        return Check(
            "cuda_visible_devices", "ok" if have_driver else "skip", title, detail, "", A_DEV
        )
    data: dict[str, Any] = {"value": value}
    if value.strip() == "":
        status = "warn" if gpus or not have_driver else "ok"
        return Check(
            "cuda_visible_devices",
            status,
            title,
            "set but empty: CUDA sees no GPU at all (torch.cuda.is_available() is False)",
            "unset CUDA_VISIBLE_DEVICES (or list the GPUs to use, e.g. 0,1)",
            A_DEV,
            data,
        )
    if not have_driver:
        bad = [
            tok
            for tok in value.split(",")
            if not re.fullmatch(r"\s*(\d+|(GPU|MIG)-[0-9A-Za-z-]+)\s*", tok)
        ]
        if bad:
            return Check(
                "cuda_visible_devices",
                "warn",
                title,
                f"{value!r}: {bad[0]!r} is neither an index nor a GPU-/MIG- UUID",
                "use indices or UUIDs from `nvidia-smi -L`, e.g. CUDA_VISIBLE_DEVICES=0,1",
                A_DEV,
                data,
            )
        return Check(
            "cuda_visible_devices",
            "skip",
            title,
            f"{value!r}; no driver to check the entries against",
            "",
            A_DEV,
            data,
        )
    vis = _resolve_visible(f)
    devices = list(vis.devices)
    # Visibility also reports CUDA_DEVICE_ORDER problems; those belong to the next check.
    problems = [p for p in vis.problems if p.startswith(("CUDA_VISIBLE_DEVICES", "entry "))]
    # Selecting MIG instances is a valid setup; say so without calling it a problem.
    problems = [p for p in problems if "MIG instances" not in p]
    if vis.mig_ids and not problems:
        return Check(
            "cuda_visible_devices",
            "ok",
            title,
            f"{value!r}: {len(vis.mig_ids)} MIG instance(s)"
            + (f" and GPU(s) {', '.join(str(g.index) for g in devices)}" if devices else ""),
            "",
            A_DEV,
            data,
        )
    data["devices"] = [g.index for g in devices]
    if problems:
        fatal = bool(vis.duplicates) or any("CUDA stops there" in p for p in problems)
        status = "fail" if fatal else "warn"
        keep = ",".join(str(g.index) for g in devices) or ",".join(str(g.index) for g in gpus)
        fix = (
            f"export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={keep} (indices from `nvidia-smi -L`)"
            if keep
            else "unset CUDA_VISIBLE_DEVICES"
        )
        return Check("cuda_visible_devices", status, title, "; ".join(problems), fix, A_DEV, data)
    shown = ", ".join(f"{g.index}" for g in devices)
    return Check(
        "cuda_visible_devices",
        "ok",
        title,
        f"{value!r}: CUDA sees nvidia-smi GPU(s) {shown}",
        "",
        A_DEV,
        data,
    )


def check_cuda_device_order(f: Facts) -> Check:
    title = "CUDA_DEVICE_ORDER"
    value = f.env.get("CUDA_DEVICE_ORDER")
    gpus = _gpus(f)
    data = {"value": value}
    if value not in (None, "", "PCI_BUS_ID", "FASTEST_FIRST"):
        return Check(
            "cuda_device_order",
            "warn",
            title,
            f"{value!r} is not a value CUDA knows (PCI_BUS_ID or FASTEST_FIRST)",
            "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
            A_DEV,
            data,
        )
    if not gpus:
        return Check(
            "cuda_device_order",
            "skip",
            title,
            f"{value or 'unset'}; no GPUs to order",
            "",
            A_DEV,
            data,
        )
    if value == "PCI_BUS_ID":
        return Check(
            "cuda_device_order",
            "ok",
            title,
            "PCI_BUS_ID: CUDA's indices match nvidia-smi's",
            "",
            A_DEV,
            data,
        )
    kinds = {(g.name, g.compute_capability) for g in gpus}
    if len(kinds) > 1 or _resolve_visible(f).order_differs:
        models = ", ".join(sorted({g.name for g in gpus}))
        return Check(
            "cuda_device_order",
            "warn",
            title,
            f"{value or 'unset'} (FASTEST_FIRST) with different GPUs ({models}): CUDA's device indices differ from nvidia-smi's",
            "export CUDA_DEVICE_ORDER=PCI_BUS_ID (xl launch sets it for its runs)",
            A_DEV,
            data,
        )
    return Check(
        "cuda_device_order",
        "ok",
        title,
        f"{value or 'unset'}; all GPUs are alike, so the orders agree",
        "",
        A_DEV,
        data,
    )


# ---------------------------------------------------------------------------------------------
# system


def _size(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / MIB:.0f} MiB"


def check_shm(f: Facts) -> Check:
    title = "shared memory"
    if f.shm_total is None:
        return Check(
            "shm",
            "warn",
            title,
            f"can't read the shared memory mount: {f.shm_problem}",
            "mount a tmpfs at /dev/shm (docker: --shm-size=16g or --ipc=host)",
            A_SYS,
        )
    data = {"total_bytes": f.shm_total, "free_bytes": f.shm_free}
    detail = f"{f.shm_path}: {_size(f.shm_total)} (free {_size(f.shm_free or 0)})"
    if f.shm_total < SHM_MIN:
        return Check(
            "shm",
            "warn",
            title,
            f"{detail}: under 512 MiB, NCCL and DataLoader workers fail with bus errors",
            "docker run --shm-size=16g (or --ipc=host); Kubernetes: an emptyDir with medium: Memory at /dev/shm",
            A_SYS,
            data,
        )
    return Check("shm", "ok", title, detail, "", A_SYS, data)


def check_nccl(f: Facts) -> Check:
    title = "NCCL"
    env = f.env
    gpus = _gpus(f)
    traps: list[tuple[str, str]] = []
    consumer = [g for g in gpus if "RTX 40" in g.name]
    driver = f.driver.version if f.driver is not None and not f.driver.error else None
    datacenter = [g for g in gpus if re.search(r"\b(A100|H100|H200|B200|A800|H800|V100)\b", g.name)]
    p2p_off = env.get("NCCL_P2P_DISABLE") == "1"
    if (
        len(consumer) > 1
        and driver
        and vtuple(driver) < (550, 40, 7)
        and not (p2p_off and env.get("NCCL_IB_DISABLE") == "1")
    ):
        traps.append(
            (
                f"{len(consumer)} RTX 40xx GPUs with driver {driver}: P2P/IB between them hangs or corrupts",
                "export NCCL_P2P_DISABLE=1 NCCL_IB_DISABLE=1 (or upgrade the driver to 550.40.07+)",
            )
        )
    if p2p_off and len(datacenter) > 1:
        traps.append(
            (
                "NCCL_P2P_DISABLE=1 on NVLink-class GPUs: all GPU traffic goes through host memory",
                "unset NCCL_P2P_DISABLE",
            )
        )
    if env.get("NCCL_IB_DISABLE") == "1" and f.ib_devices:
        traps.append(
            (
                f"NCCL_IB_DISABLE=1 but InfiniBand is present ({', '.join(f.ib_devices[:2])}): multi-node traffic falls back to TCP",
                "unset NCCL_IB_DISABLE",
            )
        )
    if env.get("NCCL_SHM_DISABLE") == "1":
        traps.append(
            (
                "NCCL_SHM_DISABLE=1: intra-node traffic can't use shared memory",
                "unset NCCL_SHM_DISABLE",
            )
        )
    for old in ("NCCL_BLOCKING_WAIT", "NCCL_ASYNC_ERROR_HANDLING"):
        if old in env:
            traps.append(
                (
                    f"{old} is the old name; torch reads TORCH_{old} now",
                    f"export TORCH_{old}={env[old]}; unset {old}",
                )
            )
    if (env.get("NCCL_DEBUG") or "").upper() == "TRACE":
        traps.append(
            (
                "NCCL_DEBUG=TRACE logs every call and slows training",
                "export NCCL_DEBUG=WARN (or INFO while debugging)",
            )
        )
    ifname = env.get("NCCL_SOCKET_IFNAME")
    if ifname and f.net_ifaces is not None:
        spec = ifname.strip()
        exclude = spec.startswith("^")
        spec = spec.lstrip("^")
        exact = spec.startswith("=")
        names = [n for n in spec.lstrip("=").split(",") if n]
        hit = [
            i for i in f.net_ifaces if any((i == n) if exact else i.startswith(n) for n in names)
        ]
        if not exclude and not hit:
            traps.append(
                (
                    f"NCCL_SOCKET_IFNAME={ifname} matches no interface here ({', '.join(sorted(f.net_ifaces))})",
                    "set NCCL_SOCKET_IFNAME to an interface from `ip -br link` (e.g. the one that holds MASTER_ADDR's route)",
                )
            )
    shadow = next((e for e in f.ld_entries if e.nccl), None)
    if shadow is not None and _torch_cuda(f) and f.torch is not None and f.torch.nccl:
        traps.append(
            (
                f"{shadow.path}/{shadow.nccl[0]} shadows torch's own NCCL {f.torch.nccl} (undefined-symbol errors, hangs)",
                f"remove {shadow.path} from LD_LIBRARY_PATH",
            )
        )
    t = f.torch
    version = f"NCCL {t.nccl} ({t.nccl_from})" if t is not None and t.nccl else None
    data = {
        "version": t.nccl if t is not None else None,
        "variables": {k: v for k, v in env.items() if k.startswith("NCCL_")},
    }
    if traps:
        return Check(
            "nccl",
            "warn",
            title,
            "; ".join(d for d, _ in traps),
            "; ".join(fx for _, fx in traps),
            A_SYS,
            data,
        )
    if not _torch_cuda(f):
        return Check(
            "nccl",
            "skip",
            title,
            "torch has no CUDA build, so no NCCL (ranks use gloo); no NCCL_* traps set",
            "",
            A_SYS,
            data,
        )
    if version:
        return Check("nccl", "ok", title, f"{version}; no NCCL_* traps set", "", A_SYS, data)
    return Check(
        "nccl",
        "ok",
        title,
        "torch's NCCL is built in (no separate nvidia-nccl package); no NCCL_* traps set",
        "",
        A_SYS,
        data,
    )


def check_ninja(f: Facts) -> Check:
    title = "ninja"
    if f.ninja:
        run = f.ninja_run
        if run is not None and not run.ok:
            return Check(
                "ninja",
                "error",
                title,
                f"{f.ninja}: {run.problem}",
                f"{_python(f)} -m pip install --force-reinstall ninja",
                A_CUDA,
            )
        ver = run.stdout.strip().splitlines()[0] if run is not None and run.stdout.strip() else "?"
        return Check(
            "ninja",
            "ok",
            title,
            f"ninja {ver} at {f.ninja}",
            "",
            A_CUDA,
            {"path": f.ninja, "version": ver},
        )
    if f.ninja_in_bin:
        folder = os.path.dirname(f.ninja_in_bin)
        return Check(
            "ninja",
            "warn",
            title,
            f"{f.ninja_in_bin} exists but is not on PATH; torch runs `ninja` from PATH",
            f"export PATH={folder}:$PATH",
            A_CUDA,
        )
    return Check(
        "ninja",
        "warn",
        title,
        "not found: JIT extension builds (DeepSpeed ops, torch.utils.cpp_extension.load) fail",
        f"{_python(f)} -m pip install ninja",
        A_CUDA,
    )


_ARCH_TOKEN = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")


def check_arch_list(f: Facts) -> Check:
    title = "TORCH_CUDA_ARCH_LIST"
    value = f.env.get("TORCH_CUDA_ARCH_LIST")
    gpus = _gpus(f)
    caps = sorted({g.compute_capability for g in gpus if g.compute_capability})
    if value is None or not value.strip():
        if caps:
            return Check(
                "arch_list",
                "ok",
                title,
                f"unset: builds target the GPUs present ({', '.join(caps)})",
                "",
                A_TORCH,
            )
        return Check(
            "arch_list", "skip", title, "unset, and no GPUs here to build for", "", A_TORCH
        )
    archs: list[tuple[int, ...]] = []
    ptx: list[tuple[int, ...]] = []
    bad: list[str] = []
    for tok in re.split(r"[;\s,]+", value.strip()):
        if not tok:
            continue
        named = ARCH_NAMES.get(tok.lower().replace("+ptx", ""))
        items = (
            [n + ("+PTX" if tok.lower().endswith("+ptx") else "") for n in named]
            if named
            else [tok]
        )
        for item in items:
            m = _ARCH_TOKEN.match(item)
            if not m:
                bad.append(tok)
                continue
            cc = (int(m.group(1)), int(m.group(2)))
            archs.append(cc)
            if m.group(4):
                ptx.append(cc)
    data = {"value": value, "gpus": caps}
    if bad:
        return Check(
            "arch_list",
            "fail",
            title,
            f"{value!r}: {bad[0]!r} is not an architecture (like 8.0, 9.0a or 8.6+PTX)",
            'export TORCH_CUDA_ARCH_LIST="' + (";".join(caps) or "8.0;9.0") + '"',
            A_TORCH,
            data,
        )
    tk_ver, _ = home_cuda(f)
    nv = vtuple(tk_ver)[:1]
    if nv and nv[0] in NVCC_ARCH_RANGE:
        lo = NVCC_ARCH_RANGE[nv[0]][0]
        unsupported = sorted({a for a in archs if a < lo})
        if unsupported:
            keep = [a for a in dict.fromkeys(archs) if a >= lo]
            s = ", ".join(f"{a[0]}.{a[1]}" for a in unsupported)
            return Check(
                "arch_list",
                "fail",
                title,
                f"nvcc {major_minor(tk_ver)} can't build for {s} (its oldest is {lo[0]}.{lo[1]})",
                'export TORCH_CUDA_ARCH_LIST="'
                + (";".join(f"{a[0]}.{a[1]}" for a in keep) or f"{lo[0]}.{lo[1]}")
                + '"',
                A_TORCH,
                data,
            )
    if not caps:
        return Check(
            "arch_list", "ok", title, f"{value!r} (no GPUs here to compare with)", "", A_TORCH, data
        )
    missing, jit = [], []
    for cap in caps:
        parts = (*vtuple(cap), 0, 0)
        cc = (parts[0], parts[1])
        if cc in archs:
            continue
        if any(p[0] == cc[0] and p <= cc for p in ptx) or any(p < cc for p in ptx):
            jit.append(cap)
        else:
            missing.append(cap)
    # Keep what the person wrote (names, +PTX) and add what is missing.
    written = [t for t in re.split(r"[;\s,]+", value.strip()) if t]
    want = ";".join(dict.fromkeys([*written, *(c for c in caps if c in missing or c in jit)]))
    if missing:
        names = ", ".join(
            f"{cap} ({next(g.name for g in gpus if g.compute_capability == cap)})"
            for cap in missing
        )
        return Check(
            "arch_list",
            "fail",
            title,
            f'{value!r} leaves out {names}: kernels built now fail with "no kernel image is available"',
            f'export TORCH_CUDA_ARCH_LIST="{want}"',
            A_TORCH,
            data,
        )
    if jit:
        return Check(
            "arch_list",
            "warn",
            title,
            f"{value!r} covers {', '.join(jit)} only through PTX (JIT at first start, slower)",
            f'export TORCH_CUDA_ARCH_LIST="{want}"',
            A_TORCH,
            data,
        )
    return Check(
        "arch_list",
        "ok",
        title,
        f"{value!r} covers every GPU here ({', '.join(caps)})",
        "",
        A_TORCH,
        data,
    )


CHECKS: tuple[tuple[str, Callable[[Facts], Check]], ...] = (
    ("driver", check_driver),
    ("gpus", check_gpus),
    ("cuda_home", check_cuda_home),
    ("nvcc", check_nvcc),
    ("toolkits", check_toolkits),
    ("torch", check_torch),
    ("torch_cuda_match", check_torch_cuda_match),
    ("driver_cuda", check_driver_cuda),
    ("host_compiler", check_host_compiler),
    ("ld_library_path", check_ld_library_path),
    ("cuda_visible_devices", check_cuda_visible_devices),
    ("cuda_device_order", check_cuda_device_order),
    ("shm", check_shm),
    ("nccl", check_nccl),
    ("ninja", check_ninja),
    ("arch_list", check_arch_list),
)

AREA_OF = {
    "driver": A_GPU,
    "gpus": A_GPU,
    "cuda_home": A_CUDA,
    "nvcc": A_CUDA,
    "toolkits": A_CUDA,
    "torch": A_TORCH,
    "torch_cuda_match": A_TORCH,
    "driver_cuda": A_TORCH,
    "host_compiler": A_CUDA,
    "ld_library_path": A_CUDA,
    "cuda_visible_devices": A_DEV,
    "cuda_device_order": A_DEV,
    "shm": A_SYS,
    "nccl": A_SYS,
    "ninja": A_CUDA,
    "arch_list": A_TORCH,
}

TITLES = {
    "driver": "NVIDIA driver",
    "gpus": "GPUs",
    "cuda_home": "CUDA_HOME",
    "nvcc": "nvcc",
    "toolkits": "CUDA toolkits",
    "torch": "PyTorch",
    "torch_cuda_match": "torch CUDA vs nvcc",
    "driver_cuda": "driver vs torch CUDA",
    "host_compiler": "host compiler",
    "ld_library_path": "LD_LIBRARY_PATH",
    "cuda_visible_devices": "CUDA_VISIBLE_DEVICES",
    "cuda_device_order": "CUDA_DEVICE_ORDER",
    "shm": "shared memory",
    "nccl": "NCCL",
    "ninja": "ninja",
    "arch_list": "TORCH_CUDA_ARCH_LIST",
}


def run_checks(f: Facts) -> list[Check]:
    """Every check, in DESIGN.md's order; a check that raises becomes `error`, never a traceback."""
    out: list[Check] = []
    for check_id, fn in CHECKS:
        try:
            out.append(fn(f))
        except Exception as exc:
            out.append(
                Check(
                    check_id,
                    "error",
                    TITLES[check_id],
                    f"the check itself failed: {type(exc).__name__}: {exc}",
                    "please report this as an xl bug (run `xl doctor --json` and attach the output)",
                    AREA_OF[check_id],
                )
            )
    return out
