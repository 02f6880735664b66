"""Which torch wheels exist, and what each is built for: the ground every `pip install torch`
fix stands on, so a fix never names a wheel PyTorch did not publish.

Source: the Linux x86_64 indexes https://download.pytorch.org/whl/cuXYZ/torch/ and PyTorch's
release matrices (RELEASE.md), as known on 2025-11; the architecture lists are those of
pytorch/.ci/manywheel/build_cuda.sh for the same releases. A torch newer than this table is not
judged by it: its fixes name no version (pip then takes the newest the index has, which exists).
"""

from __future__ import annotations

from xl.doctor.archs import parse_arch_list
from xl.doctor.facts import vtuple
from xl.doctor.report import Fix

# torch version -> the CUDA tags it was published for.
_PUBLISHED: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("2.0.0", "2.0.1"), ("cu117", "cu118")),
    (("2.1.0", "2.1.1", "2.1.2", "2.2.0", "2.2.1", "2.2.2", "2.3.0", "2.3.1"), ("cu118", "cu121")),
    (("2.4.0", "2.4.1", "2.5.0", "2.5.1"), ("cu118", "cu121", "cu124")),
    (("2.6.0",), ("cu118", "cu124", "cu126")),
    (("2.7.0", "2.7.1"), ("cu118", "cu126", "cu128")),
    (("2.8.0",), ("cu126", "cu128", "cu129")),
    (("2.9.0", "2.9.1"), ("cu126", "cu128", "cu130")),
)
PUBLISHED: frozenset[tuple[str, str]] = frozenset(
    (v, tag) for versions, tags in _PUBLISHED for v in versions for tag in tags
)
KNOWN_VERSIONS: tuple[str, ...] = tuple(v for versions, _ in _PUBLISHED for v in versions)
NEWEST_KNOWN = KNOWN_VERSIONS[-1]

TAG_CUDA: dict[str, str] = {
    "cu117": "11.7",
    "cu118": "11.8",
    "cu121": "12.1",
    "cu124": "12.4",
    "cu126": "12.6",
    "cu128": "12.8",
    "cu129": "12.9",
    "cu130": "13.0",
}

# The architectures each wheel carries: TORCH_CUDA_ARCH_LIST of PyTorch's wheel build, by tag and
# the first torch version a list holds for (a later row of the same tag replaces an earlier one;
# a torch takes the last row at or below its version). What carries sm_XX depends on the torch
# version, not only on the tag: 2.7's cu128 wheels left Volta (7.0) out, 2.8 put it back.
# Sources, to update this table from:
# - .ci/manywheel/build_cuda.sh on each release branch of github.com/pytorch/pytorch (the 2.8
#   rows: 12.6 "5.0;6.0;7.0;7.5;8.0;8.6;9.0", 12.8 "7.0;...;12.0", 12.9 "7.0;...;12.0+PTX", kept
#   sm_70 per https://github.com/pytorch/pytorch/issues/157517);
# - the support matrix in RELEASE.md (https://github.com/pytorch/pytorch/blob/main/RELEASE.md)
#   and https://github.com/pytorch/pytorch/issues/172352 (2.11 leaves Volta out of cu128 again;
#   cu130 is "7.5;...;10.0;12.0+PTX" on x86, 11.0 only on aarch64).
WHEEL_ARCH_ROWS: tuple[tuple[str, str, str], ...] = (
    ("cu117", "2.0.0", "3.7;5.0;6.0;7.0;7.5;8.0;8.6"),
    ("cu118", "2.0.0", "3.7;5.0;6.0;7.0;7.5;8.0;8.6;9.0"),
    ("cu121", "2.1.0", "5.0;6.0;7.0;7.5;8.0;8.6;9.0"),
    ("cu124", "2.4.0", "5.0;6.0;7.0;7.5;8.0;8.6;9.0"),
    ("cu126", "2.6.0", "5.0;6.0;7.0;7.5;8.0;8.6;9.0"),
    ("cu128", "2.7.0", "7.5;8.0;8.6;9.0;10.0;12.0+PTX"),
    ("cu128", "2.8.0", "7.0;7.5;8.0;8.6;9.0;10.0;12.0"),
    ("cu128", "2.11.0", "7.5;8.0;8.6;9.0;10.0;12.0"),
    ("cu129", "2.8.0", "7.0;7.5;8.0;8.6;9.0;10.0;12.0+PTX"),
    ("cu130", "2.9.0", "7.5;8.0;8.6;9.0;10.0;12.0+PTX"),
)


def wheel_archs(tag: str | None, version: str | None) -> str | None:
    """The TORCH_CUDA_ARCH_LIST the wheel `torch==version` from `tag`'s index was built with;
    None when the table has no row for the tag. `version` None: what pip would install (the
    tag's newest row)."""
    rows = [(vtuple(first), archs) for t, first, archs in WHEEL_ARCH_ROWS if t == tag]
    if not rows:
        return None
    want = vtuple(base_version(version))
    if not want:
        return rows[-1][1]
    known = [archs for first, archs in rows if first <= want]
    return known[-1] if known else rows[0][1]


def newest_sm(cuda: str | None, version: str | None) -> tuple[int, int] | None:
    """The newest sm_ a torch wheel of this CUDA and version carries: what torch's extension
    builder clamps the GPUs' capabilities to when TORCH_CUDA_ARCH_LIST is unset."""
    archs = wheel_archs(tag_of(cuda), version)
    cc = parse_arch_list(archs).cc() if archs else []
    return max(cc) if cc else None


def base_version(version: str | None) -> str | None:
    """'2.4.0+cu124' -> '2.4.0'."""
    return version.split("+")[0] if version else None


def tag_of(cuda: str | None) -> str | None:
    want = vtuple(cuda)[:2]
    return next((t for t, c in TAG_CUDA.items() if vtuple(c) == want), None)


def known(version: str | None) -> bool:
    return base_version(version) in KNOWN_VERSIONS


def is_published(version: str | None, tag: str) -> bool:
    """Whether `torch==version` exists on the tag's index (a version past the table: unknown,
    so not claimed)."""
    return (base_version(version) or "", tag) in PUBLISHED


def versions_on(tag: str) -> list[str]:
    return [v for v in KNOWN_VERSIONS if (v, tag) in PUBLISHED]


def version_for(tag: str, current: str | None) -> str | None:
    """The torch version a fix should pin on this tag's index: the current one when published
    there; else the oldest published one newer than it; else the tag's last one. None means
    "no pin" (a torch newer than this table on a tag that is still published: pip takes the
    newest, which exists)."""
    on = versions_on(tag)
    if not on:
        return None
    cur = base_version(current)
    if cur and is_published(cur, tag):
        return cur
    newer = [v for v in on if vtuple(v) > vtuple(cur)] if cur else []
    if newer:
        return newer[0]
    if cur and vtuple(cur) > vtuple(NEWEST_KNOWN) and NEWEST_KNOWN in on:
        return None
    return on[-1]


def is_downgrade(tag: str, current: str | None) -> bool:
    """Whether the torch a fix would pin on this tag's index is older than the one installed."""
    pin, cur = version_for(tag, current), vtuple(base_version(current))
    return bool(pin and cur and vtuple(pin) < cur)


def install_command(python: str, tag: str, current: str | None) -> Fix:
    """`pip install torch` from the tag's index, pinned only to a version the table says exists.
    A pin older than the installed torch is a downgrade, said in the note (pip would take it back
    silently otherwise)."""
    pin = version_for(tag, current)
    spec = f"torch=={pin}" if pin else "torch"
    note = (
        f"the wheel is a downgrade from torch {base_version(current)}: {pin} is the newest torch "
        f"published for {tag}"
        if is_downgrade(tag, current)
        else ""
    )
    return Fix(
        f"{python} -m pip install --force-reinstall {spec} "
        f"--index-url https://download.pytorch.org/whl/{tag}",
        note,
    )


def tags_by_cuda() -> list[str]:
    return sorted(TAG_CUDA, key=lambda t: vtuple(TAG_CUDA[t]))
