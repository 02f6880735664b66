"""The libraries torch will load: cuDNN, NCCL and cuBLAS found through LD_PRELOAD,
LD_LIBRARY_PATH, torch's own wheels and the ldconfig cache (xl.doctor.checks.loaded), against
the versions torch's wheels pin. Older than the pin fails with the fix; newer is fine."""

from __future__ import annotations

import re
import shlex
from typing import Any

from xl.doctor.checks.derived import python_of, torch_cuda, torch_label
from xl.doctor.checks.finding import Finding, fail, ok, skip
from xl.doctor.checks.ldpath import ld_fix
from xl.doctor.checks.loaded import Loaded, all_loaded, older_on_ld_path
from xl.doctor.facts import Facts


def preload_fix(f: Facts, drop: set[str]) -> str:
    """LD_PRELOAD without these files: `export LD_PRELOAD=...`, or `unset LD_PRELOAD`."""
    keep = [p for p in re.split(r"[\s:]+", f.env.get("LD_PRELOAD") or "") if p and p not in drop]
    return f"export LD_PRELOAD={shlex.quote(' '.join(keep))}" if keep else "unset LD_PRELOAD"


def _fix(f: Facts, old: list[Loaded]) -> str:
    py = python_of(f)
    fixes: list[str] = []
    preloaded = {x.where for x in old if x.source == "LD_PRELOAD"}
    if preloaded:
        fixes.append(preload_fix(f, preloaded))
    if any(x.source == "LD_LIBRARY_PATH" for x in old):
        fixes.append(ld_fix(f))
    # torch's own wheel older than its pin, or none installed and the cache's older: the pin.
    pins = [f"{x.dist}=={x.need}" for x in old if x.source in ("wheel", "ldconfig")]
    if pins:
        fixes.append(f"{py} -m pip install {' '.join(pins)}")
    return "; ".join(dict.fromkeys(fixes))


def _key(x: Loaded) -> tuple[str, str]:
    return x.where, x.soname


def _said(x: Loaded) -> str:
    if x.source == "wheel":
        return f"the installed {x.dist} {x.version}"
    if x.source == "LD_LIBRARY_PATH":
        return f"LD_LIBRARY_PATH's {x.where}/{x.soname} ({x.version})"
    if x.source == "LD_PRELOAD":
        return f"LD_PRELOAD's {x.where} ({x.version})"
    return f"the ldconfig cache's {x.where} ({x.version})"


def check_cuda_libraries(f: Facts) -> Finding:
    if not torch_cuda(f):
        return skip("torch has no CUDA build, so no cuDNN, NCCL or cuBLAS to load")
    found = all_loaded(f)
    data: dict[str, Any] = {
        "libraries": [
            {
                "name": x.family.name,
                "soname": x.soname,
                "version": x.version,
                "from": x.source,
                "where": x.where,
                "torch_pins": f"{x.dist}=={x.need}",
            }
            for x in found
        ]
    }
    if not found:
        return ok(
            f"{torch_label(f)} pins no nvidia-* wheels (a conda, NGC or source build links its "
            "own): nothing to compare",
            data=data,
        )
    old = [x for x in found if x.older]
    # An older one on LD_LIBRARY_PATH behind an LD_PRELOAD loads once the preload is gone.
    failing = {x.family for x in old}
    old += [y for y in older_on_ld_path(f) if y.family in failing and _key(y) not in map(_key, old)]
    if old:
        said = "; ".join(
            f"{_said(x)} is older than the {x.family.name} {x.need} {torch_label(f)} pins "
            f"({x.dist}): {x.family.breaks}"
            for x in old
        )
        return fail(said, fix=_fix(f, old), data=data)
    parts = []
    for x in found:
        where = {"wheel": x.dist, "none": "not found"}.get(x.source, f"{x.source} {x.where}")
        note = ""
        if x.newer:
            note = f", newer than torch's {x.need}: fine, {x.family.name} keeps its ABI"
        elif x.version is None and x.source != "none":
            note = ", its version not told by its file name: not compared"
        parts.append(f"{x.family.name} {x.version or '?'} ({where}{note})")
    return ok("; ".join(parts), data=data)
