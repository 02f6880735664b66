"""TORCH_CUDA_ARCH_LIST: what torch's extension builder makes of it (xl.doctor.archs, torch's own
rules) against the GPUs present and what the toolkit's nvcc can build."""

from __future__ import annotations

import re
from dataclasses import replace

from xl.doctor.archs import VALID, parse_arch_list, runs_on
from xl.doctor.checks.common import (
    Apply,
    Finding,
    fail,
    first_safe,
    home_cuda,
    ok,
    skip,
    torch_cuda,
    warn,
    working_gpus,
)
from xl.doctor.facts import Facts, major_minor, vtuple
from xl.doctor.tables import NVCC_ARCH_RANGE

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


def _export(value: str) -> str:
    return f'export TORCH_CUDA_ARCH_LIST="{value}"'


def _repaired(value: str, caps: list[str]) -> str:
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
        if parse_arch_list(tok).bad is None:
            out.append(tok)
    return ";".join(dict.fromkeys(out)) or ";".join(caps) or "8.0;9.0"


def _arch_fix(f: Facts, values: list[str]) -> str:
    """The first TORCH_CUDA_ARCH_LIST among `values` that clears the check and breaks no other."""

    def apply(value: str) -> Apply:
        return lambda g: replace(g, env={**g.env, "TORCH_CUDA_ARCH_LIST": value}, what_if=True)

    cands = [(_export(v), apply(v)) for v in dict.fromkeys(values)]
    return first_safe(f, "arch_list", cands) or cands[0][0]


def check_arch_list(f: Facts) -> Finding:
    value = f.env.get("TORCH_CUDA_ARCH_LIST")
    gpus = working_gpus(f)
    caps = sorted({g.compute_capability for g in gpus if g.compute_capability})
    data = {"value": value, "gpus": caps}
    if not value or value == "native":
        how = "native" if value else "unset"
        if caps:
            return ok(f"{how}: builds target the GPUs present ({', '.join(caps)})", data=data)
        if torch_cuda(f) and home_cuda(f)[0]:
            return warn(
                f"{how} and no GPU visible: torch's extension builder takes the architectures from "
                "the visible GPUs and stops with `IndexError: list index out of range`",
                fix=_arch_fix(f, ["8.0;9.0+PTX", "8.0+PTX"]),
                data=data,
            )
        return skip(f"{how}, and no GPUs here to build for", data=data)
    al = parse_arch_list(value)
    if al.bad is not None:
        what = "an empty item (a stray ';')" if al.bad == "" else repr(al.bad)
        return fail(
            f'{value!r}: torch splits it on ";" and spaces only, names are case-sensitive; {what} makes it raise '
            f'"ValueError: Unknown CUDA arch ({al.bad}) or GPU not supported"',
            fix=_arch_fix(f, [_repaired(value, caps), ";".join(caps) or "8.0;9.0"]),
            data=data,
        )
    data["items"] = al.items
    tk_ver, _ = home_cuda(f)
    nv = vtuple(tk_ver)[:1]
    if nv and nv[0] in NVCC_ARCH_RANGE:
        lo = NVCC_ARCH_RANGE[nv[0]][0]
        unsupported = sorted({a for a in al.cc() if a < lo})
        if unsupported:
            keep = [a for a in dict.fromkeys(al.items) if _major_minor(a) >= lo]
            s = ", ".join(f"{a[0]}.{a[1]}" for a in unsupported)
            return fail(
                f"nvcc {major_minor(tk_ver)} can't build for {s} (its oldest is {lo[0]}.{lo[1]})",
                fix=_export(";".join(keep) or f"{lo[0]}.{lo[1]}"),
                data=data,
            )
    if not caps:
        return ok(f"{value!r} (no GPUs here to compare with)", data=data)
    runs = {c: runs_on(c, al.cc(), al.ptx()) for c in caps}
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
        return fail(
            f'{value!r} leaves out {names}: kernels built now fail with "no kernel image is available"',
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
