"""Sizes in one style for every view (the plain `xl launch` table and the app's screens).

Memory comes in MiB (NVML, psutil). Below 1000 MiB it reads in whole M ("512M"); from 1000 MiB on
in G with one decimal ("1.0G", "79.6G"), so two near-equal values never read "1000M" and "1.0G".
"""

from __future__ import annotations

import math

_G_FROM_MIB = 1000  # not 1024: a four-digit M would sit next to a G of about the same size


def mib(value: float | None) -> str:
    """``value`` MiB for a person: "-" when unknown, "512M", "1.5G"."""
    if value is None or not math.isfinite(value) or value < 0:
        return "-"
    if value >= _G_FROM_MIB:
        return f"{value / 1024:.1f}G"
    return f"{value:.0f}M"
