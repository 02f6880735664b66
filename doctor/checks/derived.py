"""What several checks read off the facts the same way: torch's CUDA and version, the
interpreter under test, the nvcc versions and the toolkit CUDA_HOME selects, the working GPUs,
and how a driver fix is said inside a container."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xl.doctor.facts import Facts, parse_nvcc_version
from xl.doctor.report import Fix

if TYPE_CHECKING:
    from xl.gpu.inventory import GPU


def working_gpus(f: Facts) -> list[GPU]:
    """The GPUs still answering the driver (a lost one has no figures to judge)."""
    return [g for g in f.gpus if not g.lost]


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
    """The toolkit version torch's extension builder would use (CUDA_HOME's nvcc), and its
    source."""
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


def on_host(f: Facts, text: str) -> Fix:
    """A driver fix as said in an NVIDIA container (NVIDIA_VISIBLE_DEVICES set): the driver is the
    host's, mounted in by the runtime; installing one inside the container would break it. The
    command stays the command; where it runs is its note."""
    note = getattr(text, "note", "")
    if (f.env.get("NVIDIA_VISIBLE_DEVICES") or "").strip() not in ("", "void", "none"):
        note = "; ".join(n for n in ("run it on the host, not in this container", note) if n)
    return Fix(str(text), note)
