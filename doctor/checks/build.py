"""Building CUDA extensions: the host compiler nvcc accepts, ninja for torch's builder, and the
architectures TORCH_CUDA_ARCH_LIST builds for."""

from __future__ import annotations

import os
import re
from typing import Any

from xl.doctor.checks.common import (
    Finding,
    error,
    fail,
    home_cuda,
    in_use_toolkit,
    nvcc_versions,
    ok,
    python_of,
    skip,
    warn,
    working_gpus,
)
from xl.doctor.facts import Compiler, Facts, Toolkit, major_minor, vtuple
from xl.doctor.tables import ARCH_NAMES, NVCC_ARCH_RANGE, compiler_max_from_table


def _compiler_limits(
    f: Facts, tk: Toolkit | None, kind: str, cuda_ver: str
) -> tuple[int | None, int | None, str]:
    """(oldest, newest) major of `kind` nvcc accepts, and where that came from: the toolkit's
    host_config.h, else NVIDIA's support table."""
    lo = hi = None
    src = ""
    if tk is not None and tk.host_config:
        lo, hi = (tk.gcc_min, tk.gcc_max) if kind == "gcc" else (tk.clang_min, tk.clang_max)
        src = tk.host_config
    if hi is None:
        # The full version matters: 11.4.0 (nvcc V11.4.48) accepts gcc 10, 11.4.1 gcc 11.
        full = nvcc_versions(f, "home")[1] or nvcc_versions(f, "path")[1]
        if major_minor(full) != major_minor(cuda_ver):
            full = tk.version if tk is not None and tk.short == major_minor(cuda_ver) else cuda_ver
        hi = compiler_max_from_table(kind, full)
        src = f"NVIDIA's support table for CUDA {major_minor(cuda_ver)}" if hi is not None else ""
    return lo, hi, src


def _compiler_fix(f: Facts, c: Compiler, kind: str, lo: int | None, hi: int) -> str:
    """Point nvcc (and torch's `-ccbin $CC`) at an accepted compiler on PATH, or install one."""
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
    elif kind == "gcc":
        fix = f"install {kind} {hi} (e.g. sudo apt install g++-{hi}) and export NVCC_CCBIN=/usr/bin/g++-{hi} CC=/usr/bin/gcc-{hi} CXX=/usr/bin/g++-{hi}"
    else:
        fix = f"install clang {hi} and export NVCC_CCBIN=/usr/bin/clang++-{hi} CC=/usr/bin/clang-{hi} CXX=/usr/bin/clang++-{hi}"
    if c.source == "NVCC_APPEND_FLAGS":
        # Its -ccbin comes last on nvcc's command line and beats every variable.
        fix = f"remove -ccbin from NVCC_APPEND_FLAGS; {fix}"
    return fix


def check_host_compiler(f: Facts) -> Finding:
    c = f.compiler
    tk = in_use_toolkit(f)
    cuda_ver, _ = home_cuda(f)
    if cuda_ver is None and tk is not None:
        cuda_ver = tk.version
    if c is None:
        if cuda_ver:
            return warn(
                "no host compiler for nvcc: no `gcc` on PATH, and neither CC nor NVCC_CCBIN names one",
                fix="install one: sudo apt install g++ (or point NVCC_CCBIN and CC at a compiler)",
            )
        return skip("no compiler and no nvcc")
    data: dict[str, Any] = {
        "path": c.path,
        "source": c.source,
        "kind": c.kind,
        "version": c.version,
    }
    if c.problem:
        return error(
            f"{c.path} (from {c.source}): {c.problem}",
            fix=f"check `{c.path} --version`; point NVCC_CCBIN at a working gcc/g++",
            data=data,
        )
    if not cuda_ver:
        return skip(f"{c.kind} {c.version} at {c.path}; no nvcc to check it against", data=data)
    kind = c.kind or "gcc"
    lo, hi, src = _compiler_limits(f, tk, kind, cuda_ver)
    data.update({"max_major": hi, "min_major": lo, "limit_from": src, "cuda": cuda_ver})
    label = f"{kind} {c.version} ({c.path}, from {c.source})"
    if hi is None:
        return warn(
            f"{label}: no known limit for CUDA {major_minor(cuda_ver)}",
            fix="check NVIDIA's installation guide for the supported compilers",
            data=data,
        )
    major = c.major or 0
    if major > hi or (lo is not None and major < lo):
        bound = f"<= {hi}" if major > hi else f">= {lo}"
        return fail(
            f"{label} is outside what nvcc {major_minor(cuda_ver)} accepts ({kind} {bound}, from {src})",
            fix=_compiler_fix(f, c, kind, lo, hi),
            data=data,
        )
    return ok(f"{label}; nvcc {major_minor(cuda_ver)} accepts {kind} <= {hi}", data=data)


def check_ninja(f: Facts) -> Finding:
    if f.ninja:
        run = f.ninja_run
        if run is not None and not run.ok:
            return error(
                f"{f.ninja}: {run.problem}",
                fix=f"{python_of(f)} -m pip install --force-reinstall ninja",
            )
        ver = run.stdout.strip().splitlines()[0] if run is not None and run.stdout.strip() else "?"
        return ok(f"ninja {ver} at {f.ninja}", data={"path": f.ninja, "version": ver})
    if f.ninja_in_bin:
        return warn(
            f"{f.ninja_in_bin} exists but is not on PATH; torch runs `ninja` from PATH",
            fix=f"export PATH={os.path.dirname(f.ninja_in_bin)}:$PATH",
        )
    return warn(
        "not found: JIT extension builds (DeepSpeed ops, torch.utils.cpp_extension.load) fail",
        fix=f"{python_of(f)} -m pip install ninja",
    )


_ARCH_TOKEN = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")
_ARCH_SEP = re.compile(r"[;\s,]+")


def _parse_arch_list(value: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[str]]:
    """(architectures, those with +PTX, tokens that are not one), names such as Ampere expanded."""
    archs: list[tuple[int, int]] = []
    ptx: list[tuple[int, int]] = []
    bad: list[str] = []
    for tok in _ARCH_SEP.split(value.strip()):
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
    return archs, ptx, bad


def _export_arch_list(value: str) -> str:
    return f'export TORCH_CUDA_ARCH_LIST="{value}"'


def _arch_coverage(
    caps: list[str], archs: list[tuple[int, int]], ptx: list[tuple[int, int]]
) -> tuple[list[str], list[str]]:
    """The GPUs' capabilities with no kernels at all, and those covered only by PTX (JIT)."""
    missing: list[str] = []
    jit: list[str] = []
    for cap in caps:
        parts = (*vtuple(cap), 0, 0)
        cc = (parts[0], parts[1])
        if cc in archs:
            continue
        if any(p[0] == cc[0] and p <= cc for p in ptx) or any(p < cc for p in ptx):
            jit.append(cap)
        else:
            missing.append(cap)
    return missing, jit


def check_arch_list(f: Facts) -> Finding:
    value = f.env.get("TORCH_CUDA_ARCH_LIST")
    gpus = working_gpus(f)
    caps = sorted({g.compute_capability for g in gpus if g.compute_capability})
    if value is None or not value.strip():
        if caps:
            return ok(f"unset: builds target the GPUs present ({', '.join(caps)})")
        return skip("unset, and no GPUs here to build for")
    archs, ptx, bad = _parse_arch_list(value)
    data = {"value": value, "gpus": caps}
    if bad:
        return fail(
            f"{value!r}: {bad[0]!r} is not an architecture (like 8.0, 9.0a or 8.6+PTX)",
            fix=_export_arch_list(";".join(caps) or "8.0;9.0"),
            data=data,
        )
    tk_ver, _ = home_cuda(f)
    nv = vtuple(tk_ver)[:1]
    if nv and nv[0] in NVCC_ARCH_RANGE:
        lo = NVCC_ARCH_RANGE[nv[0]][0]
        unsupported = sorted({a for a in archs if a < lo})
        if unsupported:
            keep = [a for a in dict.fromkeys(archs) if a >= lo]
            s = ", ".join(f"{a[0]}.{a[1]}" for a in unsupported)
            return fail(
                f"nvcc {major_minor(tk_ver)} can't build for {s} (its oldest is {lo[0]}.{lo[1]})",
                fix=_export_arch_list(
                    ";".join(f"{a[0]}.{a[1]}" for a in keep) or f"{lo[0]}.{lo[1]}"
                ),
                data=data,
            )
    if not caps:
        return ok(f"{value!r} (no GPUs here to compare with)", data=data)
    missing, jit = _arch_coverage(caps, archs, ptx)
    # Keep what the person wrote (names, +PTX) and add what is missing.
    written = [t for t in _ARCH_SEP.split(value.strip()) if t]
    want = ";".join(dict.fromkeys([*written, *(c for c in caps if c in missing or c in jit)]))
    if missing:
        names = ", ".join(
            f"{cap} ({next(g.name for g in gpus if g.compute_capability == cap)})"
            for cap in missing
        )
        return fail(
            f'{value!r} leaves out {names}: kernels built now fail with "no kernel image is available"',
            fix=_export_arch_list(want),
            data=data,
        )
    if jit:
        return warn(
            f"{value!r} covers {', '.join(jit)} only through PTX (JIT at first start, slower)",
            fix=_export_arch_list(want),
            data=data,
        )
    return ok(f"{value!r} covers every GPU here ({', '.join(caps)})", data=data)
