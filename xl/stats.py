"""Medians and means without the statistics module, and the running ones the diagnoses keep.

Importing ``statistics`` loads fractions, decimal and random: ~4 ms of CPU in each of a launch's
command and supervisor, on two cores that torch's imports fill (docs/launch.md, "How a launch
starts"), for a line of arithmetic each. The results are the statistics module's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any, Generic, TypeVar


def median(values: Iterable[float]) -> float:
    """As ``statistics.median``: the middle value, or the mean of the two middle ones."""
    return median_sorted(sorted(values))


def median_sorted(data: Sequence[float]) -> float:
    """``median`` of values already sorted (a caller that sorts them for more than the median
    sorts them once)."""
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


def trimmed_mean(values: Sequence[float]) -> float:
    """The mean of ``values`` without their highest and lowest tenth, and at least without the
    highest and the lowest one when there are three or more."""
    values = sorted(values)
    cut = max(1, len(values) // 10) if len(values) >= 3 else 0
    kept = values[cut : len(values) - cut]
    return sum(kept) / len(kept)


def standard_error(values: Sequence[float]) -> float:
    """The standard error of the mean of ``values`` (their sample standard deviation over the
    square root of their number; 0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    return (sum([(v - mean) ** 2 for v in values]) / max(1, n - 1) / n) ** 0.5


_Item = TypeVar("_Item", bound=tuple[Any, ...])


class TimedWindow(Generic[_Item]):
    """The newest ``maxlen`` of a rank's timed items ((t, ...) tuples, in the order they came),
    and those of a window, for the supervisor's diagnoses: once the items are in time order (the
    usual case: a rank's spool, merged late, is what puts them out of it), the window is read
    from the newest end and costs the lines inside it, not every line kept (thousands of ranks,
    every second)."""

    __slots__ = ("_unordered", "items")

    def __init__(self, maxlen: int) -> None:
        self.items: deque[_Item] = deque(maxlen=maxlen)
        # Appends to come before every item out of time order has left: a pair out of order
        # stays adjacent until its older item leaves, at most maxlen appends later.
        self._unordered = 0

    def append(self, item: _Item) -> None:
        items = self.items
        if items and item[0] < items[-1][0]:
            self._unordered = items.maxlen or 0
        elif self._unordered:
            self._unordered -= 1
        items.append(item)

    @property
    def ordered(self) -> bool:
        """Every item kept is in time order (none came before the one before it)."""
        return not self._unordered

    def since(self, t: float) -> list[_Item]:
        """The items at ``t`` or later, in the order they came."""
        if self._unordered:
            return [s for s in self.items if s[0] >= t]
        out = []
        for s in reversed(self.items):
            if s[0] < t:
                break
            out.append(s)
        out.reverse()
        return out


class RunningMedian:
    """The last ``maxlen`` values (a rank's step times) and their median, sorted once however
    many values came since it was last read: the supervisor's diagnoses read each rank's median
    every second (the quiet spell; the stall rule past its least threshold), while the values
    come with the collector's records, up to ten a second a rank (sorting them at each of two
    reads a second would be most of the diagnoses' work at thousands of ranks)."""

    __slots__ = ("_ordered", "values")

    def __init__(self, maxlen: int = 200) -> None:
        self.values: deque[float] = deque(maxlen=maxlen)
        self._ordered: list[float] | None = None  # the values sorted; None: changed since

    def __bool__(self) -> bool:
        return bool(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def append(self, dt: float) -> None:
        self.values.append(dt)
        self._ordered = None

    def median(self) -> float:
        """As ``median`` of the values (the same sorted list, the same arithmetic)."""
        data = self._ordered
        if data is None:
            data = self._ordered = sorted(self.values)
        return median_sorted(data)

    def last(self, n: int) -> list[float]:
        """The newest ``n`` values, newest first."""
        return list(islice(reversed(self.values), n))
