"""Building CUDA extensions: the host compiler nvcc accepts, and ninja for torch's builder."""

from __future__ import annotations

import os
import shlex
from typing import Any

from xl.doctor.checks.derived import home_cuda, nvcc_versions, python_of
from xl.doctor.checks.finding import Finding, error, fail, ok, skip, warn
from xl.doctor.checks.toolkit_choice import in_use_toolkit
from xl.doctor.facts import Compiler, Facts, Toolkit, major_minor
from xl.doctor.report import Fix
from xl.doctor.tables import TORCH_COMPILER_REFUSES, compiler_max_from_table


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
        fix = (
            f"sudo apt-get install -y g++-{hi} && export "
            f"NVCC_CCBIN=/usr/bin/g++-{hi} CC=/usr/bin/gcc-{hi} CXX=/usr/bin/g++-{hi}"
        )
    else:
        fix = (
            f"sudo apt-get install -y clang-{hi} && export NVCC_CCBIN=/usr/bin/clang++-{hi} "
            f"CC=/usr/bin/clang-{hi} CXX=/usr/bin/clang++-{hi}"
        )
    if c.source == "NVCC_APPEND_FLAGS":
        # Its -ccbin comes last on nvcc's command line and beats every variable.
        fix = f"{without_ccbin(f, c.source)} && {fix}"
    return fix


_CCBIN = ("-ccbin", "--compiler-bindir")


def without_ccbin(f: Facts, var: str) -> str:
    """The command that keeps an NVCC_*_FLAGS variable's other flags and drops its -ccbin."""
    try:
        words = shlex.split(f.env.get(var) or "")
    except ValueError:
        words = (f.env.get(var) or "").split()
    keep: list[str] = []
    skip_next = False
    for w in words:
        if skip_next:
            skip_next = False
        elif w in _CCBIN:
            skip_next = True
        elif not w.startswith(tuple(c + "=" for c in _CCBIN)):
            keep.append(w)
    return f"export {var}={shlex.quote(' '.join(keep))}" if keep else f"unset {var}"


_CCBIN_VARS = ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS")
_ALLOW = ("-allow-unsupported-compiler", "--allow-unsupported-compiler")


def _var_fix(f: Facts, c: Compiler) -> Fix:
    """Stop the variable naming a broken compiler; name an installed one when there is one."""
    fix = without_ccbin(f, c.source) if c.source in _CCBIN_VARS else f"unset {c.source}"
    gccs = sorted(
        (x for x in f.other_compilers if x[1] == "gcc" and "++" not in os.path.basename(x[0])),
        key=lambda x: -x[2],
    )
    if c.source == "CC" and gccs:
        return Fix(fix, f"or point CC at an installed gcc: export CC={gccs[0][0]}")
    return Fix(fix)


def _allow_flag(f: Facts) -> str | None:
    """The NVCC_*_FLAGS variable that holds -allow-unsupported-compiler, if one does."""
    for var in ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS"):
        if any(w in _ALLOW for w in (f.env.get(var) or "").split()):
            return var
    return None


def _allowed_unsupported(
    f: Facts,
    c: Compiler,
    label: str,
    kind: str,
    cuda_ver: str,
    limits: tuple[int | None, int],
    var: str,
    data: dict[str, Any],
) -> Finding:
    """Outside host_config.h's range with nvcc's check switched off: nvcc builds, but torch's own
    table (binary builds, unless TORCH_DONT_CHECK_COMPILER_ABI) may still refuse it."""
    lo, hi = limits
    data["allow_unsupported_compiler"] = var
    mm = major_minor(cuda_ver) or ""
    refuses = TORCH_COMPILER_REFUSES.get(kind, {}).get(mm)
    t = f.torch
    binary = t is not None and t.found and bool(t.cuda) and "+git" not in (t.version or "")
    off = (f.env.get("TORCH_DONT_CHECK_COMPILER_ABI") or "").upper() in (
        "ON",
        "1",
        "YES",
        "TRUE",
        "Y",
    )
    if binary and not off and refuses is not None and (c.major or 0) >= refuses:
        return fail(
            f"{label}: -allow-unsupported-compiler in {var} switches off nvcc's own check, but "
            "torch's builder "
            f"still refuses {kind} >= {refuses} for CUDA {mm} (its compiler table)",
            fix=Fix(
                _compiler_fix(f, c, kind, lo, hi),
                "or keep this compiler: export TORCH_DONT_CHECK_COMPILER_ABI=1",
            ),
            data=data,
        )
    return warn(
        f"{label} is past what nvcc {mm} supports ({kind} <= {hi}); -allow-unsupported-compiler in "
        f"{var} lets it "
        "build, unsupported by NVIDIA (builds may fail or miscompile)",
        fix=_compiler_fix(f, c, kind, lo, hi),
        data=data,
    )


def check_host_compiler(f: Facts) -> Finding:
    c = f.compiler
    tk = in_use_toolkit(f)
    cuda_ver, _ = home_cuda(f)
    if cuda_ver is None and tk is not None:
        cuda_ver = tk.version
    if c is None:
        if cuda_ver:
            return warn(
                "no host compiler for nvcc: no `gcc` on PATH, and neither CC nor NVCC_CCBIN names "
                "one",
                fix=Fix(
                    "sudo apt-get install -y g++",
                    "or point NVCC_CCBIN and CC at a compiler that is installed",
                ),
            )
        return skip("no compiler and no nvcc")
    data: dict[str, Any] = {
        "path": c.path,
        "source": c.source,
        "kind": c.kind,
        "version": c.version,
    }
    if c.missing and c.source != "gcc":
        # A definite failure, not an unknown: nvcc gets `-ccbin <this>` and can't run it.
        how = "torch's builder passes `-ccbin $CC` to nvcc" if c.source == "CC" else "nvcc takes it"
        return fail(
            f"{c.source} names {c.path}, which does not exist: {how}, and every CUDA build stops "
            "there",
            fix=_var_fix(f, c),
            data=data,
        )
    if c.problem:
        return error(
            f"{c.path} (from {c.source}): {c.problem}",
            fix=Fix(
                _var_fix(f, c) if c.source != "gcc" else "sudo apt-get install -y --reinstall g++",
                f"`{c.path} --version` shows what is wrong with it",
            ),
            data=data,
        )
    if not cuda_ver:
        return skip(f"{c.kind} {c.version} at {c.path}; no nvcc to check it against", data=data)
    kind = c.kind or "gcc"
    lo, hi, src = _compiler_limits(f, tk, kind, cuda_ver)
    data.update({"max_major": hi, "min_major": lo, "limit_from": src, "cuda": cuda_ver})
    label = f"{kind} {c.version} ({c.path}, from {c.source})"
    if hi is None:
        # Nothing to judge it by, and so nothing to fix: NVIDIA's guide says what it supports.
        return skip(
            f"{label}: no known limit for CUDA {major_minor(cuda_ver)} (NVIDIA's installation "
            "guide for it lists the supported compilers)",
            data=data,
        )
    major = c.major or 0
    if major > hi or (lo is not None and major < lo):
        bound = f"<= {hi}" if major > hi else f">= {lo}"
        allowed = _allow_flag(f)
        if allowed:
            return _allowed_unsupported(f, c, label, kind, cuda_ver, (lo, hi), allowed, data)
        return fail(
            f"{label} is outside what nvcc {major_minor(cuda_ver)} accepts ({kind} {bound}, from "
            f"{src})",
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
