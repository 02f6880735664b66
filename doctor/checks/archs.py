"""TORCH_CUDA_ARCH_LIST: what torch's extension builder makes of it (xl.doctor.archs, torch's own
rules) against the GPUs present and what the toolkit's nvcc can build."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from xl.doctor.archs import VALID, parse_arch_list
from xl.doctor.checks.derived import home_cuda, torch_cuda, torch_label, torch_version, working_gpus
from xl.doctor.checks.finding import Finding, fail, ok, skip, warn
from xl.doctor.checks.fixes import Apply, first_safe, toolkit_fix
from xl.doctor.checks.toolkit_choice import toolkit_choices
from xl.doctor.facts import Facts, major_minor, vtuple
from xl.doctor.report import Fix
from xl.doctor.tables import NVCC_ARCH_RANGE, first_nvcc_for, nvcc_newest_arch
from xl.doctor.wheels import newest_sm

_NAMES = {
    "kepler": "Kepler",
    "maxwell": "Maxwell",
    "pascal": "Pascal",
    "volta": "Volta",
    "turing": "Turing",
    "ampere": "Ampere",
    "ada": "Ada",
    "hopper": "Hopper",
    "blackwell": "Blackwell",
}


# CUDA 13 renamed Thor's architecture from 10.1 to 11.0: nvcc 13 refuses compute_101 and nvcc
# 12.8/12.9 know no compute_110. A list naming the other toolkit's name is renamed, never cut.
_THOR = {"10.1": "11.0", "11.0": "10.1"}


def _rename_thor(token: str) -> str:
    """10.1 <-> 11.0, keeping an arch-specific `a` and a +PTX (10.1a+PTX -> 11.0a+PTX)."""
    base, plus, rest = token.partition("+")
    core = base.rstrip("af")
    return _THOR[core] + base[len(core) :] + plus + rest if core in _THOR else token


def _thor_misnamed(tk_ver: str | None, items: list[str]) -> list[str]:
    """The items this nvcc knows Thor by another name for (10.1 for nvcc 13+, 11.0 for
    12.8-12.9)."""
    v = vtuple(tk_ver)[:2]
    if len(v) < 2 or v < (12, 8):
        return []
    wrong = "10.1" if v[0] >= 13 else "11.0"
    return [a for a in items if a.split("+")[0].rstrip("af") == wrong]


def _export(value: str) -> str:
    return f'export TORCH_CUDA_ARCH_LIST="{value}"'


def _repaired(value: str, caps: list[str], tv: tuple[int, ...] | None = None) -> str:
    """What the person meant, in words torch accepts: commas and stray separators dropped,
    names capitalised as torch spells them, sm_80 / 8.0+ptx written as 8.0 / 8.0+PTX."""
    out: list[str] = []
    for tok in re.split(r"[;,\s]+", value.strip()):
        if not tok:
            continue
        m = re.fullmatch(r"(?:sm_|compute_)?(\d{1,2})(\d)([af]?)", tok)
        if m:
            tok = f"{m.group(1)}.{m.group(2)}{m.group(3)}"
        tok = re.sub(r"\+ptx$", "+PTX", tok, flags=re.IGNORECASE)
        name, plus, rest = tok.partition("+")
        tok = _NAMES.get(name.lower(), name) + plus + rest
        if parse_arch_list(tok, torch_version=tv).bad is not None:
            tok = _rename_thor(tok)  # Thor by the name the other CUDA major gave it
        if parse_arch_list(tok, torch_version=tv).bad is None:
            out.append(tok)
    return ";".join(dict.fromkeys(out)) or ";".join(caps) or "8.0;9.0"


def _arch_fix(f: Facts, values: list[str]) -> str:
    """The first TORCH_CUDA_ARCH_LIST among `values` that clears the check and breaks no other."""

    def apply(value: str) -> Apply:
        return lambda g: replace(g, env={**g.env, "TORCH_CUDA_ARCH_LIST": value}, what_if=True)

    cands = [(_export(v), apply(v)) for v in dict.fromkeys(values)]
    return first_safe(f, "arch_list", cands) or cands[0][0]


def _cc_text(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def _too_new(tk_ver: str | None, items: list[str]) -> tuple[list[str], tuple[int, int] | None]:
    """The items this nvcc cannot build (newer than its newest architecture), and that newest."""
    newest = nvcc_newest_arch(tk_ver)
    if newest is None:
        return [], None
    return [a for a in items if _major_minor(a) > newest], newest


def _unset_fix(
    f: Facts, caps: list[str], newest: tuple[int, int], need: tuple[int, int]
) -> str:
    """A toolkit that builds every GPU here (the one matching torch first, as every other fix
    names), else the GPUs' list cut to what this nvcc builds, the newest as PTX."""
    able = [t for t in toolkit_choices(f) if (nvcc_newest_arch(t.version) or (0, 0)) >= need]
    fix = toolkit_fix(f, "arch_list", able) if able else None
    if fix:
        return fix
    keep = sorted({_cc_text(min(_major_minor(c), newest)) for c in caps})
    value = ";".join([*keep[:-1], keep[-1] + "+PTX"])
    first = first_nvcc_for(need)
    note = (
        f"the newest as PTX, compiled at first start; CUDA {first}+ builds sm_{need[0]}{need[1]}"
        if first
        else ""
    )
    return Fix(_arch_fix(f, [value]), note)


def _thor_finding(
    f: Facts,
    tk_ver: str | None,
    items: list[str],
    misnamed: list[str],
    tv: tuple[int, ...] | None,
    data: dict[str, Any],
) -> Finding:
    """Thor named as the other CUDA major names it: renamed when this torch knows the new name;
    else a toolkit of the CUDA major that knows the name written."""
    new = [_rename_thor(a) if a in misnamed else a for a in dict.fromkeys(items)]
    value = ";".join(new)
    code = misnamed[0].split("+")[0].rstrip("af").replace(".", "")
    detail = (
        f"nvcc {major_minor(tk_ver)} calls Thor {_rename_thor(misnamed[0]).split('+')[0]} (CUDA 13 "
        "renamed 10.1 to 11.0): "
        f'{", ".join(misnamed)} makes it stop with "nvcc fatal: Unsupported gpu architecture '
        f"'compute_{code}'\""
    )
    if parse_arch_list(value, torch_version=tv).bad is None:
        return fail(detail, fix=_arch_fix(f, [value]), data=data)
    # This torch knows only the old name: a toolkit that still builds it.
    old = misnamed[0].startswith("10.1")
    able = [
        t
        for t in toolkit_choices(f)
        if (vtuple(t.version)[:1] < (13,)) == old and vtuple(t.version)[:2] >= (12, 8)
    ]
    fix = toolkit_fix(f, "arch_list", able) if able else None
    want = "12.9" if old else "13.0"
    pkg = f"cuda-toolkit-{want.replace('.', '-')}"  # NVIDIA's apt repository's name for it
    return fail(
        detail + f"; {torch_label(f)} knows Thor only as {misnamed[0].split('+')[0].rstrip('af')}",
        fix=fix
        or f"sudo apt-get install -y {pkg} && export CUDA_HOME=/usr/local/cuda-{want} "
        f"PATH=/usr/local/cuda-{want}/bin:$PATH",
        data=data,
    )


def check_arch_list(f: Facts) -> Finding:
    value = f.env.get("TORCH_CUDA_ARCH_LIST")
    gpus = working_gpus(f)
    caps = sorted({g.compute_capability for g in gpus if g.compute_capability})
    data: dict[str, Any] = {"value": value, "gpus": caps}
    tv = vtuple(torch_version(f)) or None
    tk_ver, _ = home_cuda(f)
    if not value or value == "native":
        how = "native" if value else "unset"
        if caps:
            t = f.torch
            clamp = newest_sm(t.cuda, t.version) if t is not None else None
            al = parse_arch_list(value, caps, clamp, tv)
            data["items"] = al.items
            too_new, newest = _too_new(tk_ver, al.items) if torch_cuda(f) else ([], None)
            if too_new and newest is not None:
                need = max(_major_minor(a) for a in too_new)
                return fail(
                    f"{how}: torch's extension builder targets the GPUs here "
                    f"({';'.join(al.items)}), but nvcc "
                    f"{major_minor(tk_ver)} builds up to {_cc_text(newest)}: "
                    f"\"nvcc fatal: Unsupported gpu architecture 'compute_{need[0]}{need[1]}'\"",
                    fix=_unset_fix(f, caps, newest, need),
                    data=data,
                )
            return ok(f"{how}: builds target the GPUs present ({', '.join(caps)})", data=data)
        if torch_cuda(f) and tk_ver:
            return warn(
                f"{how} and no GPU visible: torch's extension builder takes the architectures from "
                "the visible GPUs and stops with `IndexError: list index out of range`",
                fix=_arch_fix(f, ["8.0;9.0+PTX", "8.0+PTX"]),
                data=data,
            )
        return skip(f"{how}, and no GPUs here to build for", data=data)
    al = parse_arch_list(value, torch_version=tv)
    if al.bad is not None:
        what = "an empty item (a stray ';')" if al.bad == "" else repr(al.bad)
        known = (
            f" ({torch_label(f)}'s cpp_extension does not know it)"
            if al.bad and parse_arch_list(al.bad).bad is None
            else ""
        )
        return fail(
            f'{value!r}: torch splits it on ";" and spaces only, names are case-sensitive; {what} '
            "makes it raise "
            f'"ValueError: Unknown CUDA arch ({al.bad}) or GPU not supported"{known}',
            fix=_arch_fix(f, [_repaired(value, caps, tv), ";".join(caps) or "8.0;9.0"]),
            data=data,
        )
    data["items"] = al.items
    nv = vtuple(tk_ver)[:1]
    if nv and nv[0] in NVCC_ARCH_RANGE:
        lo = NVCC_ARCH_RANGE[nv[0]][0]
        unsupported = sorted({a for a in al.cc() if a < lo})
        if unsupported:
            keep = [a for a in dict.fromkeys(al.items) if _major_minor(a) >= lo]
            s = ", ".join(_cc_text(a) for a in unsupported)
            return fail(
                f"nvcc {major_minor(tk_ver)} can't build for {s} (its oldest is {lo[0]}.{lo[1]})",
                fix=_export(";".join(keep) or f"{lo[0]}.{lo[1]}"),
                data=data,
            )
    misnamed = _thor_misnamed(tk_ver, al.items)
    if misnamed:
        return _thor_finding(f, tk_ver, al.items, misnamed, tv, data)
    too_new, newest = _too_new(tk_ver, al.items)
    if too_new and newest is not None:
        keep = [a for a in dict.fromkeys(al.items) if a not in too_new]
        return fail(
            f"nvcc {major_minor(tk_ver)} can't build for {', '.join(too_new)} (its newest is "
            f"{_cc_text(newest)})",
            fix=_arch_fix(f, [";".join(keep) or f"{_cc_text(newest)}+PTX"]),
            data=data,
        )
    if not caps:
        return ok(f"{value!r} (no GPUs here to compare with)", data=data)
    runs = {c: al.runs_on(c) for c in caps}
    missing = [c for c, h in runs.items() if h == "none"]
    jit = [c for c, h in runs.items() if h == "ptx"]
    # Keep what the person wrote (names, +PTX) and add what is missing.
    written = [t for t in value.replace(" ", ";").split(";") if t]
    want = ";".join(dict.fromkeys([*written, *(c for c in caps if c in missing or c in jit)]))
    if missing:
        names = ", ".join(
            f"{cap} ({next(g.name for g in gpus if g.compute_capability == cap)})"
            for cap in missing
        )
        specific = al.specific()
        why = (
            f" ({', '.join(specific)} is arch-specific: its code, PTX included, runs on that "
            "architecture only)"
            if specific
            else ""
        )
        return fail(
            f'{value!r} leaves out {names}{why}: kernels built now fail with "no kernel image is '
            'available"',
            fix=_export(want),
            data=data,
        )
    if jit:
        return warn(
            f"{value!r} covers {', '.join(jit)} only through PTX (JIT at first start, slower)",
            fix=_export(want),
            data=data,
        )
    return ok(f"{value!r} covers every GPU here ({', '.join(caps)})", data=data)


def _major_minor(arch: str) -> tuple[int, int]:
    return parse_arch_list(arch).cc()[0] if arch in VALID else (0, 0)
