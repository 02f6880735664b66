"""Sizes and rank lists in one style for every view (the plain `xl launch` table, the app's
screens, events and `xl stacks`).

Ranks read as ranges, the way Slurm writes a node list: "0,2-4,7", neighbours past two joined.

Memory comes in MiB (NVML, psutil). Below 1000 MiB it reads in whole M ("512M"); from 1000 MiB on
in G with one decimal ("1.0G", "79.6G"), so two near-equal values never read "1000M" and "1.0G".
"""

from __future__ import annotations

import math
from collections.abc import Iterable

_G_FROM_MIB = 1000  # not 1024: a four-digit M would sit next to a G of about the same size


def mib(value: float | None) -> str:
    """``value`` MiB for a person: "-" when unknown, "512M", "1.5G"."""
    if value is None or not math.isfinite(value) or value < 0:
        return "-"
    if value >= _G_FROM_MIB:
        return f"{value / 1024:.1f}G"
    return f"{value:.0f}M"


def ranges(ranks: Iterable[int]) -> str:
    """[0, 2, 3, 4, 7] -> '0,2-4,7': sorted, each run of three or more neighbours joined."""
    out: list[str] = []
    nums = sorted(set(ranks))
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}{',' if j == i + 1 else '-'}{nums[j]}")
        i = j + 1
    return ",".join(out)


def ranks_text(ranks: Iterable[int]) -> str:
    """'rank 3' or 'ranks 0,2-4,7'."""
    nums = sorted(set(ranks))
    return f"rank{'s' if len(nums) > 1 else ''} {ranges(nums)}"
