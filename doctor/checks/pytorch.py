"""PyTorch: is torch installed and built for this machine (its CUDA and the GPU architectures its
wheel carries), does its CUDA match the toolkit that builds extensions, and does the driver run
it?"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from xl.doctor.archs import parse_arch_list
from xl.doctor.checks.compat import driver_mismatch, forward_compat, ldconfig_fix
from xl.doctor.checks.derived import (
    home_cuda,
    python_of,
    torch_cuda,
    torch_label,
    torch_version,
    working_gpus,
)
from xl.doctor.checks.finding import Finding, error, fail, ok, skip, warn
from xl.doctor.checks.fixes import Apply, first_safe, toolkit_fix, torch_fix, with_torch
from xl.doctor.checks.ldpath import ld_fix
from xl.doctor.checks.toolkit_choice import install_toolkit, toolkit_with
from xl.doctor.checks.upgrade import RUNFILE, branch_for, driver_upgrade, runfile_command
from xl.doctor.facts import Facts, major_minor, vtuple
from xl.doctor.report import Fix
from xl.doctor.tables import DRIVER_FOR_CUDA, deepspeed_verdict
from xl.doctor.wheels import (
    TAG_CUDA,
    install_command,
    is_downgrade,
    tag_of,
    tags_by_cuda,
    version_for,
    wheel_archs,
)

# NVIDIA's minor-version compatibility: a driver of this branch or newer runs any minor of the
# same CUDA major (without PTX JIT of the newer minor's PTX).
MINOR_COMPAT_DRIVER: dict[int, int] = {11: 450, 12: 525, 13: 580}


def _driver_cuda(f: Facts) -> str | None:
    """The CUDA the driver runs: NVML's (the kernel module's), or the forward-compatibility
    package's when that is the libcuda that loads (xl.doctor.checks.compat)."""
    d = f.driver
    nvml = d.cuda_version if d is not None and not d.error and d.cuda_version else None
    fc = forward_compat(f)
    if nvml and fc is not None and fc.cuda and not _geforce(f):
        return max(nvml, fc.cuda, key=vtuple)
    return nvml


def _geforce(f: Facts) -> list[str]:
    return sorted({g.name for g in working_gpus(f) if "GeForce" in g.name})


def _libcuda_problem(f: Facts, data: dict[str, Any]) -> Finding | None:
    """A libcuda.so.1 that is not the kernel module's and cannot work: older than it (803), or
    forward compatibility on GeForce GPUs (804)."""
    lib = driver_mismatch(f)
    d = f.driver
    if lib is None or d is None:
        return None
    data["libcuda"] = {
        "path": lib.path,
        "version": lib.version,
        "from": lib.source,
        "cuda": lib.cuda,
    }
    if vtuple(lib.version) < vtuple(d.version):
        return fail(
            f"{lib.path} (from {lib.source}) is libcuda {lib.version}, older than the kernel "
            f"module's {d.version}: "
            "cuInit fails with CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803)",
            fix=ld_fix(f) if lib.source == "LD_LIBRARY_PATH" else ldconfig_fix(lib),
            data=data,
        )
    geforce = _geforce(f)
    if geforce:
        return fail(
            f"{lib.path} (from {lib.source}) is NVIDIA's forward-compatibility libcuda "
            f"{lib.version}, which works on "
            f"data-center GPUs only: on {', '.join(geforce)} cuInit fails with "
            "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE (804)",
            fix=ld_fix(f) if lib.source == "LD_LIBRARY_PATH" else ldconfig_fix(lib),
            data=data,
        )
    return None


def _wheel_tag(f: Facts) -> str | None:
    """The CUDA tag of a torch wheel from PyTorch's builds (version `+cuNNN`, or the nvidia/
    libraries a PyPI wheel brings): whose architecture list wheels.wheel_archs knows. A conda
    or source build carries other architectures and is not judged."""
    t = f.torch
    tag = tag_of(t.cuda) if t is not None else None
    if t is None or tag is None or wheel_archs(tag, t.version) is None:
        return None
    local = (t.version or "").partition("+")[2]
    if local:
        return tag if local == tag else None
    return tag if t.pip_libs else None


def _no_kernel(tag: str, version: str | None, caps: list[str]) -> list[str]:
    """The capabilities the wheel `torch==version` of this tag has neither a cubin nor PTX for
    (version None: the tag's newest)."""
    al = parse_arch_list(wheel_archs(tag, version))
    return [c for c in caps if al.runs_on(c) == "none"]


def _wheel_tags(f: Facts, caps: list[str]) -> list[str]:
    """Tags worth installing from: every GPU has kernels in the wheel a fix would install
    (the version it pins there); the driver runs them fully (newest first), then through
    minor-version compatibility (oldest first); in each, those that would downgrade torch last."""
    current = torch_version(f)
    cover = [t for t in tags_by_cuda() if not _no_kernel(t, version_for(t, current), caps)]
    dc = vtuple(_driver_cuda(f))[:2]
    if not dc:
        return _no_downgrade_first(cover[::-1], current, least=False)
    full = [t for t in cover if vtuple(TAG_CUDA[t]) <= dc]
    compat = [t for t in cover if vtuple(TAG_CUDA[t]) > dc and vtuple(TAG_CUDA[t])[0] == dc[0]]
    return _no_downgrade_first(full[::-1], current, least=False) + _no_downgrade_first(
        compat, current, least=True
    )


def _no_downgrade_first(tags: list[str], current: str | None, least: bool) -> list[str]:
    """The tags whose pin keeps the installed torch's version (or newer) first, in their order;
    then those that downgrade it (said in the fix), in their order, or the least one first."""
    keep = [t for t in tags if not is_downgrade(t, current)]
    down = [t for t in tags if is_downgrade(t, current)]
    if least:
        down.sort(key=lambda t: vtuple(version_for(t, current)), reverse=True)
    return keep + down


def _wheel_fix(f: Facts, caps: list[str]) -> str:
    """The torch wheel to install: one the driver runs with kernels for every GPU here (tried
    on the facts, breaking no other check); else that wheel with the driver upgrade the newest
    such wheel needs, as this machine's distribution installs it (tried the same way, driver and
    all)."""
    fix = torch_fix(f, "torch", _wheel_tags(f, caps))
    if fix:
        return fix
    py, current = python_of(f), torch_version(f)
    cands = []
    for tag in reversed(tags_by_cuda()):
        pin = version_for(tag, current)
        need = DRIVER_FOR_CUDA.get(TAG_CUDA[tag])
        if need is None or _no_kernel(tag, pin, caps):
            continue
        cmd = driver_upgrade(f, vtuple(need)[0], install_command(py, tag, current))
        cands.append((cmd, _upgraded(tag, pin, need)))
    if cands:
        return first_safe(f, "torch", cands) or cands[0][0]
    newest = max(DRIVER_FOR_CUDA.values(), key=vtuple)
    return driver_upgrade(f, vtuple(newest)[0], f"{py} -m pip install --force-reinstall torch")


def _upgraded(tag: str, pin: str | None, driver: str) -> Apply:
    """The facts after a driver upgrade to `driver` and installing torch `pin` from `tag`."""

    def apply(f: Facts) -> Facts:
        g = with_torch(tag, pin)(f)
        d = replace(g.driver, version=driver, cuda_version=TAG_CUDA[tag]) if g.driver else g.driver
        return replace(g, driver=d)

    return apply


def _gpu_names(f: Facts, caps: list[str]) -> str:
    gpus = working_gpus(f)
    return ", ".join(
        f"{next(g.name for g in gpus if g.compute_capability == c)} (sm_{c.replace('.', '')})"
        for c in caps
    )


def check_torch(f: Facts) -> Finding:
    t = f.torch
    py = python_of(f)
    if t is None or (t.problem and not t.found):
        why = t.problem if t is not None else "the probe did not run"
        return error(
            f"could not inspect torch in {py}: {why}",
            fix=f"{py} -c 'import torch; print(torch.__version__)'",
        )
    gpus = working_gpus(f)
    caps = sorted({g.compute_capability for g in gpus if g.compute_capability})
    data: dict[str, Any] = {
        "python": t.python,
        "version": t.version,
        "cuda": t.cuda,
        "location": t.location,
    }
    if not t.found:
        fix = torch_fix(f, "torch", _wheel_tags(f, caps) if gpus else [])
        return fail(
            f"torch is not installed in {py}",
            fix=fix
            or f"{py} -m pip install torch --index-url https://download.pytorch.org/whl/cpu",
            data=data,
        )
    if t.problem:
        return error(
            f"torch at {t.location}: {t.problem}",
            fix=f"{py} -m pip install --force-reinstall torch",
            data=data,
        )
    if t.hip:
        if not gpus:
            return ok(f"torch {t.version} (ROCm {t.hip} build)", data=data)
        return fail(
            f"torch {t.version} is a ROCm (HIP {t.hip}) build but this machine's {len(gpus)} "
            "GPU(s) are "
            "NVIDIA: torch.cuda.is_available() is False and training runs on the CPU",
            fix=_wheel_fix(f, caps),
            data=data,
        )
    if t.cuda:
        tag = _wheel_tag(f)
        archs = wheel_archs(tag, t.version) if tag else None
        missing = _no_kernel(tag, t.version, caps) if tag else []
        if archs:
            data["archs"] = archs
        if missing:
            return fail(
                f"torch {t.version} carries kernels for {archs} only; "
                f'{_gpu_names(f, missing)} gets "no kernel image is available for execution on the '
                'device" at the first kernel',
                fix=_wheel_fix(f, caps),
                data=data,
            )
        return ok(f"torch {t.version}, built with CUDA {t.cuda}", data=data)
    if not gpus:
        return ok(
            f"torch {t.version} (CPU-only build; fine with no GPUs, ranks use gloo)", data=data
        )
    return fail(
        f"torch {t.version} is a CPU-only build but this machine has {len(gpus)} GPU(s): training "
        "can't use them",
        fix=_wheel_fix(f, caps),
        data=data,
    )


def check_torch_cuda_match(f: Facts) -> Finding:
    tc = torch_cuda(f)
    if not tc:
        return skip("torch has no CUDA build to compare")
    tk_ver, where = home_cuda(f)
    if not tk_ver:
        return skip(
            f"no toolkit nvcc to compare with torch's CUDA {tc} (only extension builds need one)"
        )
    a, b = vtuple(tk_ver)[:2], vtuple(tc)[:2]
    skip_check = (f.env.get("DS_SKIP_CUDA_CHECK") or "") == "1"
    verdict = deepspeed_verdict(tk_ver, tc, skip_check)
    data = {"toolkit": tk_ver, "torch_cuda": tc, "toolkit_nvcc": where, "deepspeed": verdict}
    if a == b:
        return ok(f"both CUDA {major_minor(tc)}", data=data)
    match = toolkit_with(f, tc)
    tag = tag_of(tk_ver)
    fix = toolkit_fix(f, "torch_cuda_match", [match]) if match is not None else None
    if fix is None and tag:
        wheel = torch_fix(f, "torch_cuda_match", [tag])
        if wheel:
            # The other way round (the toolkit torch was built with) is said beside it.
            other = f"the other way: {install_toolkit(tc)}"
            fix = Fix(wheel, "; ".join(n for n in (getattr(wheel, "note", ""), other) if n))
    fix = fix or install_toolkit(tc)
    mismatch = f"nvcc is CUDA {major_minor(tk_ver)} but {torch_label(f)} was built with {tc}"
    if a[0] != b[0]:
        return fail(
            f"{mismatch}: torch's extension builder refuses a major mismatch; {verdict}",
            fix=fix,
            data=data,
        )
    return warn(f"{mismatch}: torch only warns; {verdict}", fix=fix, data=data)


def check_driver_cuda(f: Facts) -> Finding:
    tc = torch_cuda(f)
    d = f.driver
    if not tc:
        return skip("torch has no CUDA build")
    dc = _driver_cuda(f)
    if d is None or dc is None:
        return skip("no NVIDIA driver to compare with")
    data: dict[str, Any] = {"driver_cuda": dc, "torch_cuda": tc, "driver": d.version}
    broken = _libcuda_problem(f, data)
    if broken is not None:
        return broken
    fc = forward_compat(f)
    if vtuple(dc)[:2] >= vtuple(tc)[:2]:
        if fc is not None and fc.cuda == dc and dc != d.cuda_version:
            data["forward_compatibility"] = True
            return ok(
                f"the forward-compatibility libcuda {fc.version} ({fc.path}, from {fc.source}) "
                f"runs CUDA {dc} >= torch's "
                f"{tc}; NVML reports the kernel module's CUDA {d.cuda_version}",
                data=data,
            )
        return ok(f"driver supports CUDA {dc} >= torch's {tc}", data=data)
    major = vtuple(tc)[0]
    floor = MINOR_COMPAT_DRIVER.get(major)
    branch = vtuple(d.version)[:1]
    fix, alternative = _driver_cuda_fix(f, tc, dc)
    if vtuple(dc)[0] == major and floor is not None and branch and branch[0] >= floor:
        data["minor_version_compatibility"] = True
        return warn(
            f"driver {d.version} supports CUDA up to {dc}; torch's {tc} runs through NVIDIA's "
            "minor-version "
            f"compatibility (CUDA {major}.x from driver {floor}), without PTX JIT: Triton kernels "
            "and "
            f"torch.compile may fail (CUDA_ERROR_UNSUPPORTED_PTX_VERSION){alternative}",
            fix=fix,
            data=data,
        )
    return fail(
        f'driver {d.version} supports CUDA up to {dc} but torch needs {tc}: "CUDA driver version '
        'is insufficient"'
        f"{alternative}",
        fix=fix,
        data=data,
    )


def _driver_cuda_fix(f: Facts, tc: str, dc: str) -> tuple[str, str]:
    """(the fix, an alternative said in the detail) for a torch whose CUDA the driver does not
    run fully. One direction: a wheel of the installed torch's version (or newer) that the
    driver runs and that breaks no other check; else the driver upgrade that keeps this torch,
    with the downgrade a wheel the driver runs would be said in the detail, not offered as a
    second fix."""
    caps = sorted({g.compute_capability for g in working_gpus(f) if g.compute_capability})
    current = torch_version(f)
    full = [t for t in _wheel_tags(f, caps) if vtuple(TAG_CUDA[t])[:2] <= vtuple(dc)[:2]]
    # Strict: a wheel that would break an extension build is not taken over a driver upgrade
    # that breaks nothing.
    wheel = torch_fix(
        f, "driver_cuda", [t for t in full if not is_downgrade(t, current)], strict=True
    )
    if wheel:
        return wheel, ""
    branch = branch_for(tc)
    upgrade = (
        driver_upgrade(f, branch)
        if branch is not None
        else Fix(
            runfile_command(None),
            f"download the newest .run installer from {RUNFILE} into this folder first",
        )
    )
    down = torch_fix(f, "driver_cuda", [t for t in full if is_downgrade(t, current)])
    alternative = (
        f". Keeping driver {f.driver.version if f.driver else '?'} instead means a torch "
        f"downgrade: {down}"
        if down
        else ""
    )
    return upgrade, alternative
