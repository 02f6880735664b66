"""Which cuDNN, NCCL and cuBLAS a CUDA torch will load, and whether that is older than the one
its wheels pin (Requires-Dist of torch's METADATA: nvidia-cudnn-cu12==9.10.2.21, ...).

The loader's order for a library torch's own libraries ask for by soname: LD_PRELOAD first, then
LD_LIBRARY_PATH's folders, then the RUNPATH of torch's libraries (its nvidia/ wheels), then the
ldconfig cache. A version is read off the file's name (libnccl.so.2 -> libnccl.so.2.21.5), or
the installed wheel's metadata for torch's own folders; a library whose version can't be told
is not judged. A newer one is fine: NCCL, cuDNN 9 and cuBLAS keep their ABI within a major.
A build that pins no nvidia-* wheels (NGC's, conda's, a source build) links its own and is not
compared.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

from xl.doctor.checks.derived import torch_cuda
from xl.doctor.facts import Facts, vtuple


@dataclass(frozen=True)
class Family:
    name: str  # cuDNN
    stem: str  # libcudnn
    dist: str  # nvidia-cudnn (the wheels add -cu12, -cu13; CUDA 13's cuBLAS has none)
    depth: int  # version parts that must not go backwards: NCCL's patch adds symbols
    breaks: str  # what an older one does


FAMILIES: tuple[Family, ...] = (
    Family(
        "cuDNN",
        "libcudnn",
        "nvidia-cudnn",
        2,
        'torch raises "cuDNN version incompatibility" at the first convolution',
    ),
    Family(
        "NCCL",
        "libnccl",
        "nvidia-nccl",
        3,
        'torch fails at import with "undefined symbol: nccl..." or at the first collective',
    ),
    Family(
        "cuBLAS",
        "libcublas",
        "nvidia-cublas",
        2,
        'torch fails with "undefined symbol: cublasLt..." or CUBLAS_STATUS_NOT_SUPPORTED at the '
        "first matmul",
    ),
)


@dataclass(frozen=True)
class Loaded:
    """The library of one family that torch will load, and the one it pins."""

    family: Family
    dist: str  # the pinned distribution, e.g. nvidia-nccl-cu12
    need: str  # its pinned version
    soname: str
    version: str | None  # of the one that loads; None when its file doesn't tell
    source: str  # LD_PRELOAD | LD_LIBRARY_PATH | wheel | ldconfig | none
    where: str  # the file, the folder, or the distribution

    @property
    def older(self) -> bool:
        d = self.family.depth
        return bool(self.version) and vtuple(self.version)[:d] < vtuple(self.need)[:d]

    @property
    def newer(self) -> bool:
        d = self.family.depth
        return bool(self.version) and vtuple(self.version)[:d] > vtuple(self.need)[:d]


def _pin(f: Facts, fam: Family) -> tuple[str, str] | None:
    t = f.torch
    if t is None:
        return None
    for name, ver in sorted(t.requires.items()):
        if name == fam.dist or re.fullmatch(re.escape(fam.dist) + r"-cu\d+", name):
            return name, ver
    return None


def _own(f: Facts, real: str) -> bool:
    """Whether a folder is inside torch's own nvidia/ wheels (site-packages/nvidia/...)."""
    t = f.torch
    if t is None or not t.location:
        return False
    nvd = os.path.join(os.path.dirname(os.path.realpath(t.location)), "nvidia") + os.sep
    return real.startswith(nvd)


def loaded(f: Facts, fam: Family) -> Loaded | None:
    """The library of this family torch will load; None when torch pins none (or has no CUDA)."""
    pin = _pin(f, fam)
    if pin is None or not torch_cuda(f) or f.torch is None:
        return None
    dist, need = pin
    major = vtuple(need)[:1]
    soname = f"{fam.stem}.so.{2 if fam.stem == 'libnccl' else (major[0] if major else 0)}"

    def at(version: str | None, source: str, where: str) -> Loaded:
        return Loaded(fam, dist, need, soname, version, source, where)

    for path, so, ver in f.preload:
        if so == soname:
            return at(ver, "LD_PRELOAD", path)
    wheel = f.torch.nvidia_dists.get(dist)
    for e in f.ld_entries:
        if e.exists and e.is_dir and soname in e.cuda_libs:
            if _own(f, e.real):
                break  # torch's own wheel, named on the path: what RUNPATH finds anyway
            return at(e.cuda_libs[soname], "LD_LIBRARY_PATH", e.path)
    if wheel:
        return at(wheel, "wheel", dist)
    if f.ldconfig.get(soname):
        return at(f.ldconfig_versions.get(soname), "ldconfig", f.ldconfig[soname][0])
    return at(None, "none", "")


def all_loaded(f: Facts) -> list[Loaded]:
    return [x for x in (loaded(f, fam) for fam in FAMILIES) if x is not None]


def older_on_ld_path(f: Facts) -> list[Loaded]:
    """The libraries LD_LIBRARY_PATH brings that are older than torch's pins, also those an
    LD_PRELOAD hides now: they load once it is gone, so a fix takes them out with it."""
    behind = replace(f, preload=[])
    return [x for x in all_loaded(behind) if x.source == "LD_LIBRARY_PATH" and x.older]


def unknown_nccl_on_path(f: Facts) -> list[str]:
    """LD_LIBRARY_PATH folders (not torch's own) whose libnccl.so.2 comes before the NCCL wheel
    torch loads and whose file name does not tell its version: it may be older."""
    t = f.torch
    if t is None or not t.nccl or not torch_cuda(f):
        return []
    for e in f.ld_entries:
        if e.exists and e.is_dir and "libnccl.so.2" in e.cuda_libs and not _own(f, e.real):
            return [e.path] if e.cuda_libs["libnccl.so.2"] is None else []
    return []
