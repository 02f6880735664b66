"""GPU architectures as torch reads them: TORCH_CUDA_ARCH_LIST parsed exactly as
torch.utils.cpp_extension._get_cuda_arch_flags parses it (the installed torch's own lists, by its
version: TORCH_ARCHES), the -gencode flags it turns into, and which compiled architectures a GPU
can run (an arch-specific target such as 9.0a runs on that architecture only, PTX included).

torch's rules, kept here to the letter because a build follows them, not what a person meant:
- unset, empty or exactly "native": the visible GPUs' capabilities (each clamped to the newest
  sm_ torch itself was built for), sorted, the last one with +PTX; with no GPU at all torch
  stops with `IndexError: list index out of range`;
- otherwise spaces become ';', then each name is replaced by its architectures with plain string
  replacement, in the order below (so "Ampere+Tegra" before "Ampere"; names are case-sensitive);
  the result is split on ';' only: a comma, an empty item (a stray ';') or an unknown token makes
  torch raise `ValueError: Unknown CUDA arch (...) or GPU not supported`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# torch 2.13's named_arches, in its order (combined names first).
NAMED_ARCHES: tuple[tuple[str, str], ...] = (
    ("Kepler+Tesla", "3.7"),
    ("Kepler", "3.5+PTX"),
    ("Maxwell+Tegra", "5.3"),
    ("Maxwell", "5.0;5.2+PTX"),
    ("Pascal", "6.0;6.1+PTX"),
    ("Volta+Tegra", "7.2"),
    ("Volta", "7.0+PTX"),
    ("Turing", "7.5+PTX"),
    ("Ampere+Tegra", "8.7"),
    ("Ampere", "8.0;8.6+PTX"),
    ("Ada", "8.9+PTX"),
    ("Hopper", "9.0+PTX"),
    ("Blackwell+Tegra", "11.0"),
    ("Blackwell", "10.0;10.3;12.0;12.1+PTX"),
)
SUPPORTED_ARCHES: tuple[str, ...] = (
    "3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6",
    "8.7", "8.9", "9.0", "9.0a", "10.0", "10.0a", "11.0", "11.0a", "10.3", "10.3a", "12.0",
    "12.0a", "12.1", "12.1a",
)  # fmt: skip
VALID = frozenset((*SUPPORTED_ARCHES, *(a + "+PTX" for a in SUPPORTED_ARCHES)))

# What older releases of cpp_extension accept: (first torch version, supported_arches), newest
# last; a torch takes the last row at or below its version. Source: torch/utils/cpp_extension.py
# of each release (`supported_arches`, `named_arches`). Seen in released files: the 2.0-era list
# ending at 9.0; the list with 9.0a (which release added it is inferred as 2.1, not seen); 2.6's
# ending at '10.0' (jetson-containers patches 2.6 to add 10.0a;10.1;10.1a;12.0;12.0a, which 2.7
# ships); the list above from 2.9 (CUDA 13 renamed 10.1 to 11.0, added 10.3 and 12.1), unchanged
# to 2.13. To update: add a row from the release's cpp_extension.py.
_BASE = ("3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0",
         "8.6", "8.7", "8.9", "9.0")  # fmt: skip
TORCH_ARCHES: tuple[tuple[tuple[int, int], tuple[str, ...]], ...] = (
    ((2, 0), _BASE),
    ((2, 1), (*_BASE, "9.0a")),
    ((2, 6), (*_BASE, "9.0a", "10.0")),
    ((2, 7), (*_BASE, "9.0a", "10.0", "10.0a", "10.1", "10.1a", "12.0", "12.0a")),
    ((2, 9), SUPPORTED_ARCHES),
)


# Names younger than torch 2.0 (the Blackwell ones): the release that brought each.
_NAME_SINCE = {"Blackwell": (2, 7), "Blackwell+Tegra": (2, 9)}


def _accepted(
    torch_version: tuple[int, ...] | None,
) -> tuple[frozenset[str], tuple[tuple[str, str], ...]]:
    """(valid items, named architectures) of the cpp_extension of this torch version (None:
    the newest)."""
    if not torch_version:
        return VALID, NAMED_ARCHES
    rows = [arches for since, arches in TORCH_ARCHES if since <= torch_version[:2]]
    arches = rows[-1] if rows else TORCH_ARCHES[0][1]
    valid = frozenset((*arches, *(a + "+PTX" for a in arches)))
    named = tuple(
        (name, value if all(v in valid for v in value.split(";")) else _known_part(value, valid))
        for name, value in NAMED_ARCHES
        if _NAME_SINCE.get(name, (2, 0)) <= torch_version[:2]
    )
    return valid, named


def _known_part(value: str, valid: frozenset[str]) -> str:
    """A name's expansion cut to what this release knows, the last one carrying its +PTX."""
    items = [v for v in value.split(";") if v.split("+")[0] in {a.split("+")[0] for a in valid}]
    items = [v.split("+")[0] for v in items]
    if value.endswith("+PTX") and items:
        items[-1] += "+PTX"
    return ";".join(items)


@dataclass
class ArchList:
    """What torch makes of TORCH_CUDA_ARCH_LIST (or of the GPUs when it is unset)."""

    items: list[str] = field(default_factory=list)  # e.g. ["8.0", "8.6+PTX"]
    bad: str | None = None  # the first item torch rejects ('' for an empty item)
    from_gpus: bool = False  # unset / "native": taken from the visible GPUs
    no_gpu: bool = False  # from_gpus with no GPU: torch's IndexError

    def cc(self) -> list[tuple[int, int]]:
        """The (major, minor) of every item that builds a cubin."""
        return [_cc(a) for a in self.items]

    def ptx(self) -> list[tuple[int, int]]:
        return [_cc(a) for a in self.items if a.endswith("+PTX")]

    def runs_on(self, cap: str) -> str:
        """How a GPU of capability `cap` runs what this list builds (see runs_on): an
        arch-specific item (9.0a, 10.0a) counts only on exactly its own architecture."""
        cc = _cc(cap)
        general = [a for a in self.items if not _specific(a)]
        exact = [a for a in self.items if _specific(a) and _cc(a) == cc]
        how = runs_on(
            cap, [_cc(a) for a in general], [_cc(a) for a in general if a.endswith("+PTX")]
        )
        return "cubin" if exact else how

    def specific(self) -> list[str]:
        """The arch-specific items (9.0a, 10.0a+PTX): their code runs on no other architecture."""
        return [a for a in self.items if _specific(a)]

    def flags(self) -> list[str]:
        """-gencode flags exactly as torch emits them (sorted, deduplicated)."""
        out = []
        for arch in self.items:
            num = arch.split("+")[0].replace(".", "")
            out.append(f"-gencode=arch=compute_{num},code=sm_{num}")
            if arch.endswith("+PTX"):
                out.append(f"-gencode=arch=compute_{num},code=compute_{num}")
        return sorted(set(out))


def _specific(arch: str) -> bool:
    return arch.split("+")[0].endswith("a")


def _cc(arch: str) -> tuple[int, int]:
    major, minor = arch.split("+")[0].split(".")
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def parse_arch_list(
    value: str | None,
    caps: Sequence[str] = (),
    torch_max: tuple[int, int] | None = None,
    torch_version: tuple[int, ...] | None = None,
) -> ArchList:
    """torch's reading of TORCH_CUDA_ARCH_LIST; `caps` are the visible GPUs' capabilities and
    `torch_max` the newest sm_ torch was built for (the clamp), both used only when unset;
    `torch_version` picks that release's lists (None: the newest)."""
    if not value or value == "native":
        archs: list[str] = []
        for cap in caps:
            cc = _cc(cap)
            if torch_max is not None:
                cc = min(torch_max, cc)
            arch = f"{cc[0]}.{cc[1]}"
            if arch not in archs:
                archs.append(arch)
        archs.sort()
        if not archs:
            return ArchList(from_gpus=True, no_gpu=True)
        archs[-1] += "+PTX"
        return ArchList(items=archs, from_gpus=True)
    valid, named = _accepted(torch_version)
    text = value.replace(" ", ";")
    for name, archival in named:
        text = text.replace(name, archival)
    items = text.split(";")
    bad = next((a for a in items if a not in valid), None)
    return ArchList(items=[a for a in items if a in valid], bad=bad)


def runs_on(cap: str, cubins: Sequence[tuple[int, int]], ptx: Sequence[tuple[int, int]]) -> str:
    """How a GPU of capability `cap` runs code built for these architectures: "cubin" (a binary
    of its major and a minor not above its own), "ptx" (JIT from PTX of an older or equal
    architecture), or "none" ("no kernel image is available for execution on the device")."""
    cc = _cc(cap)
    if any(c[0] == cc[0] and c[1] <= cc[1] for c in cubins):
        return "cubin"
    if any(p <= cc for p in ptx):
        return "ptx"
    return "none"
