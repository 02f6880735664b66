"""Medians and means without the statistics module.

Importing ``statistics`` loads fractions, decimal and random: ~4 ms of CPU in each of a launch's
command and supervisor, on two cores that torch's imports fill (docs/launch.md, "How a launch
starts"), for a line of arithmetic each. The results are the statistics module's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def median(values: Iterable[float]) -> float:
    """As ``statistics.median``: the middle value, or the mean of the two middle ones."""
    data = sorted(values)
    n = len(data)
    if not n:
        raise ValueError("no median for empty data")
    mid = n // 2
    return data[mid] if n % 2 else (data[mid - 1] + data[mid]) / 2


def median_low(values: Iterable[float]) -> float:
    """As ``statistics.median_low``: the lower of the two middle values (always a value given)."""
    data = sorted(values)
    if not data:
        raise ValueError("no median low for empty data")
    return data[(len(data) - 1) // 2]


def fmean(values: Iterable[float]) -> float:
    """As ``statistics.fmean``: the mean, summed exactly (math.fsum)."""
    data = list(values)
    if not data:
        raise ValueError("fmean requires at least one data point")
    return math.fsum(data) / len(data)
