"""The `build` check (`xl doctor --build`): the compile of xl.doctor.probes.compile, held against
the static verdicts. The compiler has the last word: where it disagrees with a static check,
the proof wins and says so (a static `fail` the build proves wrong becomes a `warn` that says
the build went through)."""

from __future__ import annotations

from typing import Any

from xl.doctor.checks.derived import torch_cuda
from xl.doctor.checks.finding import Finding, fail, ok, skip
from xl.doctor.checks.toolkit_choice import install_toolkit
from xl.doctor.facts import Facts
from xl.doctor.report import Check, Fix
from xl.doctor.status import NOT_CLEAN, Status

# Static checks about the compile itself: the proof confirms or overrules them.
ON_THE_PATH = ("cuda_home", "nvcc", "host_compiler", "arch_list")
# Static checks for torch's own refusals before it runs a compiler (the proof runs the
# compilers directly, so these still stand when it builds).
TORCH_REFUSES = ("torch_cuda_match",)


def _guess_fix(f: Facts, err: str, cmd: str) -> Fix:
    """A fix from the compiler's words when no static check had one."""
    low = err.lower()
    if "unsupported gnu version" in low or "unsupported clang version" in low:
        return Fix(
            "sudo apt-get install -y g++-12 && export CC=/usr/bin/gcc-12 CXX=/usr/bin/g++-12",
            "a compiler this nvcc supports (torch passes -ccbin $CC)",
        )
    if "unsupported gpu architecture" in low:
        return Fix('export TORCH_CUDA_ARCH_LIST="8.0;9.0+PTX"', "architectures this nvcc builds")
    if "cuda_runtime" in low and ("no such file" in low or "not found" in low):
        tk = f.cuda_home_dir
        if tk is not None and tk.target_include:
            return Fix(f"export CPATH={tk.target_include}${{CPATH:+:$CPATH}}")
        return Fix(install_toolkit(torch_cuda(f)), "a toolkit with include/cuda_runtime.h")
    if "-lcudart" in low:
        return Fix(
            install_toolkit(torch_cuda(f)),
            f"a toolkit with lib64/libcudart.so (CUDA_HOME is {f.cuda_home})",
        )
    cc = f.env.get("CC")
    if cc and cc in err:
        return Fix("unset CC", "or export CC= a compiler that exists (torch passes -ccbin $CC)")
    return Fix("xl doctor --build --json", f"its checks[build].data.output is what {cmd} printed")


def check_build(f: Facts, static: list[Check]) -> Finding:
    r = f.build
    if r is None:
        return skip(
            "not run: `xl doctor --build` compiles a tiny CUDA extension to prove the setup"
        )
    by = {c.id: c for c in static}
    took = f"{r.seconds:.1f} s"
    data: dict[str, Any] = {
        "seconds": round(r.seconds, 2),
        "nvcc": r.nvcc,
        "arch_flags": r.archs.flags() if r.archs is not None else [],
        "steps": [
            {"name": s.name, "argv": s.argv, "ran": s.run is not None, "ok": s.ok} for s in r.steps
        ],
    }
    if r.cannot:
        if not torch_cuda(f):
            return skip(f"nothing to build with: {r.cannot}", data=data)
        home = by.get("cuda_home")
        return fail(
            f"torch's extension builder can't start: {r.cannot}",
            fix=home.fix if home is not None and home.fix else install_toolkit(torch_cuda(f)),
            data=data,
        )
    step = r.failed
    flagged = [by[i] for i in ON_THE_PATH if i in by and by[i].status in NOT_CLEAN]
    if step is not None:
        err = step.first_error(r.tmp)
        run = step.run
        data["output"] = ((run.stderr + run.stdout) if run is not None else "")[-4000:]
        data["failed_step"] = step.name
        lead = next(
            (c for c in flagged if c.status is not Status.WARN), flagged[0] if flagged else None
        )
        if lead is not None:
            agree = f"as the `{lead.id}` check says"
            fix = lead.fix or _guess_fix(f, err, step.argv[0])
        else:
            agree = "the static checks saw no problem here; the compiler has the last word"
            fix = _guess_fix(f, err, step.argv[0])
        return fail(f"{step.name} failed after {took}: {err!r}; {agree}", fix=fix, data=data)
    refusal = next((by[i] for i in TORCH_REFUSES if i in by and by[i].status is Status.FAIL), None)
    arch = by.get("arch_list")
    al = r.archs
    # torch raises on the arch list before any compiler runs (the proof used nvcc's default).
    if refusal is None and arch is not None and torch_cuda(f) and al is not None:
        refusal = arch if al.bad is not None or al.no_gpu else None
    if refusal is not None:
        return fail(
            "the compilers build it, but torch's builder stops before running them: "
            f"{refusal.detail}",
            fix=refusal.fix,
            data=data,
        )
    overruled = []
    for c in static:
        if c.id in ("host_compiler", "cuda_home") and c.status is Status.FAIL:
            c.status = Status.WARN
            c.detail = (
                "the --build proof compiled and linked with this setup, so it is not a failure; "
                f"the static verdict was: {c.detail}"
            )
            overruled.append(c.id)
    names = "; ".join(s.name for s in r.steps)
    note = (
        f"; the proof overrules the static `{'`, `'.join(overruled)}` failure" if overruled else ""
    )
    data["overruled"] = overruled
    return ok(
        f"built {names} in {took} (--build compiles; plain `xl doctor` does not){note}", data=data
    )
