"""The order a bench's commands run in, round by round.

With two commands, reversing the order every other round puts each first half the time. With
three (a `--before` xl, or `--hooks`' xl-off), reversing alone keeps the middle one in the middle
in every round, so whatever the position costs (the previous run's teardown, the page cache)
always lands on it. Here the order turns by one each round and runs backwards every other cycle:
over 2 x N rounds each command runs in each position equally often, after each of the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def in_round(items: Sequence[T], i: int) -> list[T]:
    """Round ``i``'s order of ``items``."""
    n = len(items)
    if n == 0:
        return []
    k = i % n
    turned = list(items[k:]) + list(items[:k])
    return turned[::-1] if (i // n) % 2 else turned
