"""How every XL_* tunable is read: one rule for a number from the environment.

A tunable that is missing, not a number, infinite or NaN takes its default; ``floor`` clamps a
number below it up to it (a grace of -1 s is no grace), ``positive`` refuses zero and negatives (a
stall threshold of 0 would flag every rank). Where each one is used and what it does:
docs/contracts.md, "Tunables". The run's own variables (XL_RUN_ID, XL_RUN_DIR, XL_COLLECTOR,
XL_TOKEN) are not tunables: they are the contract with the ranks (docs/contracts.md). """

from __future__ import annotations

import math
import os
from collections.abc import Mapping


def number(
    name: str,
    default: float,
    *,
    floor: float | None = None,
    positive: bool = False,
    env: Mapping[str, str] | None = None,
) -> float:
    """The tunable ``name`` as a finite float (see the module's rule); ``env`` defaults to
    os.environ."""
    raw = (os.environ if env is None else env).get(name)
    try:
        value = float(raw) if raw is not None else default
    except ValueError:
        return default
    if not math.isfinite(value) or (positive and value <= 0):
        return default
    return value if floor is None else max(floor, value)
