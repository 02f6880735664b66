"""Which CUDA toolkit is in use, and which one a fix points at: every fix in a report names the
same toolkit (the one matching torch's CUDA first), so no two fixes pull apart."""

from __future__ import annotations

import os

from xl.doctor.checks.derived import torch_cuda
from xl.doctor.facts import Facts, Toolkit, major_minor, vtuple


def usable(t: Toolkit) -> bool:
    """Whether a fix may name this toolkit: it has an nvcc, a known version, and no problem."""
    return bool(t.nvcc and t.version and not t.problem)


def in_use_toolkit(f: Facts) -> Toolkit | None:
    """The toolkit builds use: CUDA_HOME's, else the one `nvcc` on PATH belongs to."""
    for real in (f.home_toolkit, f.path_toolkit):
        tk = f.toolkit_at(real) if real else None
        if tk is not None:
            return tk
    return None


def usable_toolkit(f: Facts) -> Toolkit | None:
    """The first toolkit with an nvcc and a known version, for fixes that must name one."""
    return next((t for t in f.toolkits if usable(t)), None)


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
        if tk is not None and usable(tk):
            return tk
    return choices[0] if choices else None


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

    return sorted((t for t in f.toolkits if usable(t) and t.real != exclude), key=rank)


def export_toolkit(tk: Toolkit) -> str:
    """The shell line that makes both torch's builder and `nvcc` on PATH use this toolkit."""
    return f"export CUDA_HOME={tk.root} PATH={tk.root}/bin:$PATH"


def install_toolkit(cuda: str | None) -> str:
    """NVIDIA's package of toolkit `cuda` (major.minor; the newest when None), as its apt
    repository names it, installed to /usr/local/cuda-X.Y, with torch's builder and PATH pointed
    at it."""
    mm = major_minor(cuda) if cuda else None
    pkg = f"cuda-toolkit-{mm.replace('.', '-')}" if mm else "cuda-toolkit"
    root = f"/usr/local/cuda-{mm}" if mm else "/usr/local/cuda"
    return f"sudo apt-get install -y {pkg} && export CUDA_HOME={root} PATH={root}/bin:$PATH"
