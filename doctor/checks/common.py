"""What every check shares: the Finding a check returns, and views over the facts that several
areas need (the toolkit in use, torch's CUDA, the nvcc versions, the fix that selects a toolkit).

A check decides only status, detail, fix and data; its id, title and area come from the registry
(xl.doctor.checks), so they are written once."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from xl.doctor.facts import (
    CmdResult,
    Facts,
    Toolkit,
    TorchInfo,
    major_minor,
    parse_nvcc_version,
    vtuple,
)
from xl.doctor.wheels import NEWEST_KNOWN, TAG_CUDA, base_version, install_command, version_for


@dataclass
class Finding:
    """One check's verdict before the registry names it (see xl.doctor.report.Check)."""

    status: str  # ok | warn | fail | skip | error
    detail: str  # one line
    fix: str = ""  # what to type or change; empty when there is nothing to do
    data: dict[str, Any] = field(default_factory=dict)


def ok(detail: str, *, data: dict[str, Any] | None = None) -> Finding:
    return Finding(status="ok", detail=detail, data=data or {})


def skip(detail: str, *, fix: str = "", data: dict[str, Any] | None = None) -> Finding:
    return Finding(status="skip", detail=detail, fix=fix, data=data or {})


def warn(detail: str, *, fix: str, data: dict[str, Any] | None = None) -> Finding:
    return Finding(status="warn", detail=detail, fix=fix, data=data or {})


def fail(detail: str, *, fix: str, data: dict[str, Any] | None = None) -> Finding:
    return Finding(status="fail", detail=detail, fix=fix, data=data or {})


def error(detail: str, *, fix: str, data: dict[str, Any] | None = None) -> Finding:
    """The check could not decide (a probe failed): less certain than a found problem."""
    return Finding(status="error", detail=detail, fix=fix, data=data or {})


# ---------------------------------------------------------------------------------------------
# views over the facts


def working_gpus(f: Facts) -> list[Any]:
    return [g for g in f.gpus if not getattr(g, "lost", False)]


def torch_cuda(f: Facts) -> str | None:
    """The CUDA version torch was built with; None for a CPU or ROCm build or no torch."""
    t = f.torch
    return t.cuda if t is not None and t.found and t.cuda else None


def torch_label(f: Facts) -> str:
    t = f.torch
    return f"torch {t.version}" if t is not None and t.version else "torch"


def torch_version(f: Facts) -> str | None:
    return f.torch.version if f.torch is not None else None


def python_of(f: Facts) -> str:
    """The interpreter under test, as the torch probe reported it (what fixes name)."""
    return f.torch.python if f.torch is not None and f.torch.python else f.python


def nvcc_versions(f: Facts, which: str) -> tuple[str | None, str | None]:
    """(major.minor, full) of the nvcc on PATH (`which="path"`) or in CUDA_HOME ("home")."""
    run = f.path_nvcc_run if which == "path" else f.cuda_home_nvcc_run
    if run is None or not run.ok:
        return None, None
    return parse_nvcc_version(run.stdout + run.stderr)


def home_cuda(f: Facts) -> tuple[str | None, str]:
    """The toolkit version torch's extension builder would use (CUDA_HOME's nvcc), and its source."""
    short, _ = nvcc_versions(f, "home")
    if short:
        return short, f"{f.cuda_home}/bin/nvcc"
    tk = f.toolkit_at(f.home_toolkit) if f.home_toolkit else None
    if tk is not None and tk.short:
        return tk.short, tk.root
    short, _ = nvcc_versions(f, "path")
    if short and f.cuda_home is None:
        return short, f.path_nvcc or "nvcc"
    return None, ""


def in_use_toolkit(f: Facts) -> Toolkit | None:
    """The toolkit builds use: CUDA_HOME's, else the one `nvcc` on PATH belongs to."""
    for real in (f.home_toolkit, f.path_toolkit):
        tk = f.toolkit_at(real) if real else None
        if tk is not None:
            return tk
    return None


def usable_toolkit(f: Facts) -> Toolkit | None:
    """The first toolkit with an nvcc and a known version, for fixes that must name one."""
    return next((t for t in f.toolkits if t.nvcc and t.version and not t.problem), None)


def toolkit_with(f: Facts, cuda: str) -> Toolkit | None:
    """An installed toolkit of exactly this major.minor, complete ones (headers, e.g. not pip's
    nvcc-only wheel) first, then those whose folder names the version (cuda-12.4 over cuda)."""
    want = major_minor(cuda)
    if want is None:
        return None
    matches = [t for t in f.toolkits if t.short == want and t.problem is None and t.nvcc]
    matches.sort(key=lambda t: (not t.has_headers, want not in os.path.basename(t.root)))
    return matches[0] if matches else None


def preferred_toolkit(f: Facts) -> Toolkit | None:
    """The one toolkit every fix in a report points at, so no two fixes pull apart: the one
    matching torch's CUDA (else its major), then the one CUDA_HOME selects, then PATH's."""
    choices = toolkit_choices(f)
    tc = torch_cuda(f)
    if tc and choices and vtuple(choices[0].short)[:1] == vtuple(tc)[:1]:
        return choices[0]
    for real in (f.home_toolkit, f.path_toolkit):
        tk = f.toolkit_at(real) if real else None
        if tk is not None and tk.nvcc and tk.version and not tk.problem:
            return tk
    return choices[0] if choices else None


def on_host(f: Facts, text: str) -> str:
    """A driver fix as said in an NVIDIA container (NVIDIA_VISIBLE_DEVICES set): the driver is the
    host's, mounted in by the runtime; installing one inside the container would break it."""
    if (f.env.get("NVIDIA_VISIBLE_DEVICES") or "").strip() not in ("", "void", "none"):
        return f"on the host, not in this container, {text}"
    return text


def export_toolkit(tk: Toolkit) -> str:
    """The shell line that makes both torch's builder and `nvcc` on PATH use this toolkit."""
    return f"export CUDA_HOME={tk.root} PATH={tk.root}/bin:$PATH"


# ---------------------------------------------------------------------------------------------
# fixes tried before they are printed

Apply = Callable[[Facts], Facts]


def first_safe(f: Facts, check_id: str, candidates: Sequence[tuple[str, Apply]]) -> str | None:
    """The first candidate fix that, applied to the facts, clears this check's failure and makes
    no other check fail that did not fail before; None when none does. On hypothetical facts
    (a fix being tried) the first candidate stands, so trying never recurses."""
    if not candidates:
        return None
    if f.what_if or f.recheck is None:
        return candidates[0][0]
    before = f.recheck(replace(f, what_if=True))
    for text, apply in candidates:
        after = f.recheck(apply(f))
        if after.get(check_id) == "fail":
            continue
        if any(s == "fail" and before.get(k) != "fail" for k, s in after.items() if k != check_id):
            continue
        return text
    return None


def with_torch(tag: str, version: str | None) -> Apply:
    """The facts after installing torch `version` (None: the index's newest) from `tag`."""

    def apply(f: Facts) -> Facts:
        base = version or base_version(torch_version(f)) or NEWEST_KNOWN
        t = f.torch if f.torch is not None else TorchInfo(python=f.python)
        new = replace(t, found=True, cuda=TAG_CUDA[tag], hip=None, version=f"{base}+{tag}", problem=None)
        return replace(f, torch=new, what_if=True)

    return apply


def torch_fix(f: Facts, check_id: str, tags: Sequence[str]) -> str | None:
    """The first `pip install torch ... --index-url .../<tag>` among `tags` that is published
    (wheels.py) and breaks no other check."""
    py = python_of(f)
    cands = []
    for tag in tags:
        pin = version_for(tag, torch_version(f))
        cands.append((install_command(py, tag, torch_version(f)), with_torch(tag, pin)))
    return first_safe(f, check_id, cands)


def with_toolkit(tk: Toolkit) -> Apply:
    """The facts after `export_toolkit(tk)`: CUDA_HOME and PATH's nvcc are this toolkit's."""

    def apply(f: Facts) -> Facts:
        run = tk.nvcc_run
        if run is None or not run.ok:
            mm = major_minor(tk.version) or "?"
            line = f"Cuda compilation tools, release {mm}, V{tk.version}"
            run = CmdResult(argv=[tk.nvcc or "nvcc", "--version"], stdout=line)
        return replace(
            f,
            env={**f.env, "CUDA_HOME": tk.root},
            cuda_home=tk.root,
            cuda_home_from="CUDA_HOME",
            cuda_home_dir=tk,
            home_toolkit=tk.real,
            path_toolkit=tk.real,
            path_nvcc=tk.nvcc,
            path_nvcc_run=run,
            cuda_home_nvcc_run=run,
            what_if=True,
        )

    return apply


def toolkit_choices(f: Facts, exclude: str | None = None) -> list[Toolkit]:
    """Usable toolkits a fix may point at, best first: torch's CUDA exactly, then its major
    (another major makes torch's builder refuse), complete ones (headers) before others, the
    one in use before the rest. `exclude` is a real path to leave out (the one that failed)."""
    tc = major_minor(torch_cuda(f))
    in_use = in_use_toolkit(f)

    def rank(t: Toolkit) -> tuple[int, bool, bool]:
        same_major = vtuple(t.short)[:1] == vtuple(tc)[:1]
        match = 0 if t.short == tc else 1 if same_major else 2
        return (match if tc else 0, not t.has_headers, t is not in_use)

    usable = [t for t in f.toolkits if t.nvcc and t.version and not t.problem and t.real != exclude]
    return sorted(usable, key=rank)


def toolkit_fix(f: Facts, check_id: str, tks: Sequence[Toolkit]) -> str | None:
    """The first `export CUDA_HOME=... PATH=...` among these toolkits that breaks no other check."""
    return first_safe(f, check_id, [(export_toolkit(tk), with_toolkit(tk)) for tk in tks])
