"""PyTorch: is torch installed and built for this machine, does its CUDA match the toolkit that
builds extensions, and does the driver run it?"""

from __future__ import annotations

from xl.doctor.checks.common import (
    Finding,
    error,
    export_toolkit,
    fail,
    home_cuda,
    ok,
    python_of,
    skip,
    toolkit_with,
    torch_cuda,
    torch_label,
    torch_version,
    warn,
    working_gpus,
)
from xl.doctor.facts import Facts, major_minor, vtuple
from xl.doctor.tables import DRIVER_FOR_CUDA, deepspeed_verdict, torch_install_fix, wheel_tag_for


def check_torch(f: Facts) -> Finding:
    t = f.torch
    py = python_of(f)
    if t is None or (t.problem and not t.found):
        why = t.problem if t is not None else "the probe did not run"
        return error(
            f"could not inspect torch in {py}: {why}",
            fix=f"run `{py} -c 'import torch; print(torch.__version__)'` to see the error",
        )
    gpus = working_gpus(f)
    data = {"python": t.python, "version": t.version, "cuda": t.cuda, "location": t.location}
    if not t.found:
        driver_cuda = f.driver.cuda_version if f.driver is not None and not f.driver.error else None
        tag = wheel_tag_for(driver_cuda, at_most=True) if driver_cuda else "cpu"
        return fail(
            f"torch is not installed in {py}",
            fix=f"{py} -m pip install torch --index-url https://download.pytorch.org/whl/{tag or 'cpu'}",
            data=data,
        )
    if t.problem:
        return error(
            f"torch at {t.location}: {t.problem}",
            fix=f"reinstall torch: {py} -m pip install --force-reinstall torch",
            data=data,
        )
    if t.hip:
        return ok(f"torch {t.version} (ROCm {t.hip} build)", data=data)
    if t.cuda:
        return ok(f"torch {t.version}, built with CUDA {t.cuda}", data=data)
    if not gpus:
        return ok(
            f"torch {t.version} (CPU-only build; fine with no GPUs, ranks use gloo)", data=data
        )
    driver_cuda = f.driver.cuda_version if f.driver is not None else None
    tag = wheel_tag_for(driver_cuda, at_most=True) or "cu126"
    return fail(
        f"torch {t.version} is a CPU-only build but this machine has {len(gpus)} GPU(s): training can't use them",
        fix=torch_install_fix(tag, py, t.version),
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
    tag = wheel_tag_for(tk_ver)
    if match is not None:
        fix = export_toolkit(match)
    elif tag:
        fix = f"install toolkit {major_minor(tc)}, or a torch built for {major_minor(tk_ver)}: {torch_install_fix(tag, python_of(f), torch_version(f))}"
    else:
        fix = f"install CUDA toolkit {major_minor(tc)} and export CUDA_HOME to it"
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
    if d is None or d.error or not d.cuda_version:
        return skip("no NVIDIA driver to compare with")
    data = {"driver_cuda": d.cuda_version, "torch_cuda": tc, "driver": d.version}
    if vtuple(d.cuda_version)[:2] >= vtuple(tc)[:2]:
        return ok(f"driver supports CUDA {d.cuda_version} >= torch's {tc}", data=data)
    need = DRIVER_FOR_CUDA.get(major_minor(tc) or "")
    tag = wheel_tag_for(d.cuda_version, at_most=True)
    fix = f"upgrade the NVIDIA driver to {need} or newer" if need else "upgrade the NVIDIA driver"
    if tag:
        fix += f", or install a torch built for CUDA <= {d.cuda_version}: {torch_install_fix(tag, python_of(f), torch_version(f))}"
    return fail(
        f'driver {d.version} supports CUDA up to {d.cuda_version} but torch needs {tc}: "CUDA driver version is insufficient"',
        fix=fix,
        data=data,
    )
