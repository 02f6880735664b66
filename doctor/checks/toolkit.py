"""CUDA toolkit: CUDA_HOME as torch resolves it, `nvcc` on PATH, the toolkits installed and which
one PATH, CUDA_HOME and LD_LIBRARY_PATH each select, and the loader's path to the CUDA runtime."""

from __future__ import annotations

import os
import shlex
from typing import Any

from xl.doctor.checks.derived import nvcc_versions, torch_cuda, torch_label
from xl.doctor.checks.finding import Finding, error, fail, ok, skip, warn
from xl.doctor.checks.fixes import toolkit_fix
from xl.doctor.checks.ldpath import ld_fix, shadowed_torch_libs
from xl.doctor.checks.loaded import all_loaded, older_on_ld_path
from xl.doctor.checks.toolkit_choice import (
    export_toolkit,
    in_use_toolkit,
    install_toolkit,
    preferred_toolkit,
    toolkit_choices,
    toolkit_with,
    usable_toolkit,
)
from xl.doctor.facts import Facts, Toolkit, major_minor, parse_nvcc_version, vtuple
from xl.doctor.report import Fix
from xl.doctor.status import Status


def _cuda_home_unresolved(f: Facts, data: dict[str, Any]) -> Finding:
    """CUDA_HOME is empty or nothing names a toolkit at all."""
    src = f.cuda_home_from
    tc = torch_cuda(f)
    if f.cuda_home == "":
        # torch's `CUDA_HOME or CUDA_PATH` returns an empty CUDA_PATH as is and stops looking.
        best = in_use_toolkit(f) or usable_toolkit(f)
        return Finding(
            status=Status.FAIL if tc else Status.WARN,
            detail=(
                f"{src} is set but empty: torch takes CUDA_HOME='' and looks for nvcc at the "
                "relative path bin/nvcc, so CUDA extension builds fail"
            ),
            fix=f"unset {src}" + (f"; {export_toolkit(best)}" if best is not None else ""),
            data=data,
        )
    if tc:
        tk = toolkit_with(f, tc)
        return warn(
            "unresolved (no CUDA_HOME, CUDA_PATH, nvcc on PATH or /usr/local/cuda): CUDA extension "
            "builds fail",
            fix=export_toolkit(tk) if tk else install_toolkit(tc),
            data=data,
        )
    return skip("no CUDA toolkit anywhere (only needed to build CUDA extensions)", data=data)


def _target_headers(f: Facts, inc: str, data: dict[str, Any]) -> Finding:
    """conda-forge's layout: the headers live in targets/<arch>/include. nvcc finds them (its
    nvcc.profile adds the folder) but the host compiler, given torch's -I$CUDA_HOME/include,
    does not, unless CPATH or CUDA_INC_PATH names the folder."""
    data["include"] = inc
    named = [v for v in ("CPATH", "CUDA_INC_PATH") if inc in (f.env.get(v) or "").split(":")]
    if named:
        return ok(
            f"{f.cuda_home} (from {f.cuda_home_from}); headers in {inc}, found through {named[0]}",
            data=data,
        )
    return warn(
        f"{f.cuda_home} keeps its headers in {inc} (conda-forge's layout): nvcc finds them, but "
        "the "
        "C++ files of an extension include <cuda_runtime_api.h> through -I$CUDA_HOME/include and "
        "fail",
        fix=f"export CPATH={inc}${{CPATH:+:$CPATH}}",
        data=data,
    )


def conda_headers_fix(tk: Toolkit, short: str) -> str:
    """A conda environment with cuda-nvcc but no headers: the conda packages that bring the
    runtime's and the libraries' headers, from the channel its nvcc came from, at its version;
    conda puts them in targets/<arch>/include, which the host compiler is then told (CPATH)."""
    cmd = (
        f"conda install -y -p {tk.root} -c {tk.conda_channel} cuda-cudart-dev cuda-libraries-dev "
        f"cuda-version={short}"
    )
    if tk.target_dir:
        cmd += f" && export CPATH={tk.target_dir}/include${{CPATH:+:$CPATH}}"
    return cmd


def check_cuda_home(f: Facts) -> Finding:
    home, src = f.cuda_home, f.cuda_home_from
    data: dict[str, Any] = {"cuda_home": home, "from": src}
    if not home:
        return _cuda_home_unresolved(f, data)
    d = f.cuda_home_dir
    home_real = d.real if d is not None else home
    # A toolkit that breaks no other check (another major than torch's CUDA would).
    alt = toolkit_fix(f, "cuda_home", toolkit_choices(f, exclude=home_real)) or ""
    if d is None or d.problem:
        why = d.problem if d is not None and d.problem else f"{home} is not readable"
        fix = alt or (f"unset {src}" if src in ("CUDA_HOME", "CUDA_PATH") else "")
        return fail(f"{src}={home}: {why}", fix=fix or install_toolkit(torch_cuda(f)), data=data)
    if d.nvcc is None:
        return fail(
            f'{home} (from {src}) has no bin/nvcc: torch raises "nvcc not found" on every CUDA '
            "extension build",
            fix=alt or install_toolkit(torch_cuda(f)),
            data=data,
        )
    home_short, home_full = nvcc_versions(f, "home")
    run = f.cuda_home_nvcc_run
    if run is not None and not run.ok:
        return error(
            f"{home}/bin/nvcc: {run.problem}",
            fix=alt or install_toolkit(home_short or torch_cuda(f)),
            data=data,
        )
    if run is not None and home_short is None:
        return error(
            f"{home}/bin/nvcc --version printed no 'release X.Y' "
            f"(first line: {run.first_line()!r})",
            fix=alt or Fix(install_toolkit(torch_cuda(f)), "check that this is NVIDIA's nvcc"),
            data=data,
        )
    data["nvcc_version"] = home_full or home_short
    if not d.has_headers and d.target_include:
        return _target_headers(f, d.target_include, data)
    if not d.has_headers:
        where = f"the folder above {f.path_nvcc}" if src == "nvcc on PATH" else src
        target = f.home_toolkit and f.toolkit_at(f.home_toolkit)
        lead = f"; its nvcc leads to {target.root}" if target and target.real != d.real else ""
        fix = (
            export_toolkit(target)
            if target and target.real != d.real and target.has_headers
            else alt
        )
        if d.conda_channel and home_short:
            fix = conda_headers_fix(d, home_short)
        return warn(
            f"{home} ({where}) has no include/cuda_runtime.h{lead}: extension builds won't find "
            "CUDA headers and libraries",
            fix=fix or install_toolkit(home_short or torch_cuda(f)),
            data=data,
        )
    path_short, _ = nvcc_versions(f, "path")
    if path_short and home_short and path_short != home_short:
        # Both ways point at one toolkit: the one matching torch (as every other fix does).
        best = preferred_toolkit(f)
        fix = export_toolkit(best) if best is not None else f"export PATH={home}/bin:$PATH"
        return warn(
            f"{home} has nvcc {home_short} but `nvcc` on PATH is {path_short} ({f.path_nvcc}): "
            f"torch builds with {home_short}",
            fix=fix,
            data=data,
        )
    ver = f" (CUDA {home_short})" if home_short else ""
    return ok(f"{home}{ver}, from {src}, as torch resolves it", data=data)


def _nvcc_not_on_path(f: Facts) -> Finding:
    home_nvcc = f.cuda_home_dir.nvcc if f.cuda_home_dir is not None else None
    if home_nvcc:
        short, _ = nvcc_versions(f, "home")
        tc = torch_cuda(f)
        on_path = f"export PATH={os.path.dirname(home_nvcc)}:$PATH"
        if tc and short and major_minor(short) != major_minor(tc):
            # Every fix names the toolkit of torch's CUDA: not another one put on PATH here.
            match = toolkit_with(f, tc)
            on_path = export_toolkit(match) if match is not None else install_toolkit(tc)
        return warn(
            f"not on PATH; CUDA_HOME has {home_nvcc}" + (f" ({short})" if short else ""),
            fix=on_path,
        )
    choices = toolkit_choices(f)
    fix = toolkit_fix(f, "nvcc", choices)
    tk = next((t for t in choices if fix == export_toolkit(t)), None)
    if tk is not None and fix:
        return warn(f"not on PATH, but {tk.nvcc} exists", fix=fix)
    if torch_cuda(f):
        return warn(
            "no nvcc anywhere: CUDA extensions (DeepSpeed ops, JIT kernels) can't be built",
            fix=install_toolkit(torch_cuda(f)),
        )
    return skip("no nvcc (only needed to build CUDA extensions)")


def check_nvcc(f: Facts) -> Finding:
    if f.path_nvcc is None:
        return _nvcc_not_on_path(f)
    run = f.path_nvcc_run
    if run is None or not run.ok:
        why = run.problem if run is not None else "was not run"
        return error(
            f"{f.path_nvcc}: {why}",
            fix=Fix(
                install_toolkit(torch_cuda(f)),
                "`nvcc --version` run by hand shows the error; this reinstalls the toolkit",
            ),
        )
    short, full = parse_nvcc_version(run.stdout + run.stderr)
    if short is None:
        return error(
            f"{f.path_nvcc} --version printed no 'release X.Y' (first line: {run.first_line()!r})",
            fix=Fix(
                install_toolkit(torch_cuda(f)),
                f"check that {f.path_nvcc} is NVIDIA's nvcc; this installs one",
            ),
        )
    return ok(
        f"CUDA {short} (V{full or short}) at {f.path_nvcc}",
        data={"path": f.path_nvcc, "version": full or short},
    )


def _ld_toolkit(f: Facts) -> tuple[Toolkit | None, str | None]:
    """The toolkit whose libcudart LD_LIBRARY_PATH selects first, and that soname. The loader
    looks for the major the toolkit in use (or torch) needs; any libcudart counts otherwise."""
    tk = in_use_toolkit(f)
    want = vtuple(tk.version)[:1] if tk is not None else vtuple(torch_cuda(f))[:1]
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


def check_toolkits(f: Facts) -> Finding:
    usable = [t for t in f.toolkits if not t.problem]
    data: dict[str, Any] = {"toolkits": [t.to_json() for t in f.toolkits]}
    tc = torch_cuda(f)
    if not f.toolkits:
        return Finding(
            status=Status.WARN if tc else Status.SKIP,
            detail=(
                "none found (/usr/local/cuda*, /opt/cuda*, CUDA_HOME, CUDA_PATH, PATH, "
                "$CONDA_PREFIX, pip)"
            ),
            fix=Fix(install_toolkit(tc), "only extension builds need it") if tc else "",
            data=data,
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
    # CUDA_HOME above a symlinked nvcc is not the toolkit it leads to: name both, as the
    # `cuda_home` check does, or this line would contradict its warning.
    names = {k: k for k in selected}
    if home_tk and f.cuda_home and os.path.realpath(f.cuda_home) != home_tk.root:
        names["CUDA_HOME"] = f"CUDA_HOME ({f.cuda_home})"
    sel = ", ".join(f"{names[k]} -> {v}" for k, v in selected.items()) or "nothing selects one"
    broken = [t for t in f.toolkits if t.problem]
    distinct_mm = {v for v in versions.values() if v and "." in v}
    majors = {v.split(".")[0] for v in versions.values() if v}
    if len(distinct_mm) > 1 or len(majors) > 1:
        pairs = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
        target = preferred_toolkit(f) or home_tk or path_tk
        fix = (
            export_toolkit(target) + f" LD_LIBRARY_PATH={target.root}/lib64:$LD_LIBRARY_PATH"
            if target
            else ""
        )
        return warn(
            f"they disagree: {pairs} (found: {listing})",
            fix=fix or install_toolkit(tc),
            data=data,
        )
    if broken and not usable:
        return fail(
            f"{broken[0].root}: {broken[0].problem}",
            fix=Fix(
                f"sudo chmod -R a+rX {shlex.quote(broken[0].root)}",
                "or point CUDA_HOME at another toolkit",
            ),
            data=data,
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
        return error(
            f"{t.root}: version unknown, {why}; found: {listing}",
            fix=Fix(
                install_toolkit(torch_cuda(f)),
                f"`{t.nvcc} --version` run by hand shows the error; remove or repair {t.root}",
            ),
            data=data,
        )
    return ok(f"{listing}; {sel}", data=data)


def _torch_runtime_dirs(f: Facts, tk: Toolkit | None) -> set[str]:
    """torch's own nvidia/ wheel folders whose CUDA runtime is the toolkit's major.minor: named
    on LD_LIBRARY_PATH (as some launch scripts do), they hold the runtime torch loads anyway and
    one an extension built by that toolkit runs with, so they shadow nothing."""
    t = f.torch
    if t is None or tk is None or not tk.short:
        return set()
    return {
        os.path.realpath(folder)
        for soname, ver, folder in t.pip_libs
        if soname.startswith("libcudart.") and major_minor(ver) == tk.short
    }


def _ld_problems(f: Facts, tk: Toolkit | None, want: tuple[int, ...]) -> list[str]:
    """What is wrong with LD_LIBRARY_PATH's entries: bad folders, and CUDA runtimes of another
    major or ahead of the toolkit's own (the loader takes the first match)."""
    problems: list[str] = []
    if any(e.path == "" for e in f.ld_entries):
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
    if not want:
        return problems
    tk_dirs = set(tk.lib_dirs) if tk is not None else set()
    tk_pos = next((i for i, e in enumerate(f.ld_entries) if e.real in tk_dirs), None)
    own = _torch_runtime_dirs(f, tk)
    for i, e in enumerate(f.ld_entries):
        if e.real in tk_dirs or e.real in own:
            continue
        other = [s for s in e.cudart if vtuple(s.rsplit(".so.", 1)[-1])[:1] != want]
        same = [s for s in e.cudart if vtuple(s.rsplit(".so.", 1)[-1])[:1] == want]
        if other:
            problems.append(
                f"{e.path} holds {', '.join(other)} but the toolkit in use is CUDA "
                f"{tk.short if tk else '?'}"
            )
        if same and (tk_pos is None or i < tk_pos):
            # Same soname, maybe another minor: the loader takes this one, not the toolkit's.
            problems.append(f"{e.path}/{same[0]} shadows the toolkit's ({tk.root if tk else '?'})")
    return problems


def check_ld_library_path(f: Facts) -> Finding:
    value = f.env.get("LD_LIBRARY_PATH")
    tk = in_use_toolkit(f)
    want: tuple[int, ...] = vtuple(tk.version)[:1] if tk is not None and tk.version else ()
    data: dict[str, Any] = {"entries": [e.path for e in f.ld_entries], "ldconfig": f.ldconfig}
    if f.ldconfig_problem:
        data["ldconfig_problem"] = f.ldconfig_problem
    cache = f.ldconfig.get(f"libcudart.so.{want[0]}") if want else None
    if value is None:
        extra = (
            f"; the ldconfig cache resolves libcudart.so.{want[0]} to {cache[0]}" if cache else ""
        )
        return ok(f"unset{extra}", data=data)
    if value == "":
        return ok("set but empty (the loader ignores it)", data=data)
    # cuDNN, NCCL and cuBLAS older than torch's pins are the cuda_libraries check's finding (its
    # fix is the same LD_LIBRARY_PATH): said there once, only referred to here.
    judged = {x.soname for x in all_loaded(f)}
    shadows = [s for s in shadowed_torch_libs(f) if s[1] not in judged]
    if shadows:
        e, soname, theirs, ours = shadows[0]
        return fail(
            f"{e.path}/{soname} ({theirs}) comes before the {soname} {ours} that {torch_label(f)} "
            "loads from its "
            'nvidia/ wheels: importing torch fails with `undefined symbol` (e.g. "__nvJitLink..." '
            "from libcusparse)",
            fix=ld_fix(f),
            data={**data, "shadowed": [[x.path, n, a, b] for x, n, a, b in shadows]},
        )
    # Said where cuda_libraries says it: behind a newer LD_PRELOAD an older one never loads.
    failing = {x.family for x in all_loaded(f) if x.older}
    older = [y for y in older_on_ld_path(f) if y.family in failing]
    refer = ""
    if older:
        data["older"] = [[y.where, y.soname, y.version, y.need] for y in older]
        names = ", ".join(f"{y.where}/{y.soname} ({y.version})" for y in older)
        refer = f"; {names}: older than torch's pin, see cuda_libraries"
    problems = _ld_problems(f, tk, want)
    if not problems:
        extra = ""
        if cache and not any(f"libcudart.so.{want[0]}" in e.cudart for e in f.ld_entries):
            extra = f"; the ldconfig cache resolves libcudart.so.{want[0]} to {cache[0]}"
        n = len(f.ld_entries)
        clean = "" if older else ", no conflicting CUDA libraries"
        return ok(f"{n} {'entry' if n == 1 else 'entries'}{clean}{extra}{refer}", data=data)
    return warn("; ".join(problems) + refer, fix=ld_fix(f), data=data)
