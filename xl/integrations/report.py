"""Which framework reports a rank's steps when several are stacked in one process.

HF Trainer drives Accelerate (its ``accelerator.backward``), and Accelerate can drive DeepSpeed's
engine: each layer would log the same step again. The framework closest to the script wins:
Trainer and Lightning over Accelerate, Accelerate over DeepSpeed. A layer asks ``claim`` before
it logs; the first call of a higher layer takes the rank over for good.

Also the helpers every integration shares: a batch's size, read from its shape (no sync), and
the step counters kept on a framework's own object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from xl.client.metricline import OWN_KEYS

__all__ = ["OWN_KEYS", "batch_size", "claim", "steps_of"]

T = TypeVar("T")

_LEVEL = {"deepspeed": 1, "accelerate": 2, "transformers": 3, "lightning": 3}
_owner: str | None = None


def claim(name: str) -> bool:
    """Whether ``name`` reports this rank's steps (and it becomes the owner if none higher is)."""
    global _owner
    if _owner is None or _LEVEL[name] > _LEVEL[_owner]:
        _owner = name
    return _owner == name


def steps_of(owner: object, factory: Callable[[], T]) -> T:
    """xl's step counters for ``owner`` (an Accelerator, a DeepSpeed engine), made on first use and
    kept in the object's own ``__dict__``: its class's properties and slots are never touched."""
    steps = owner.__dict__.get("_xl_steps")
    if steps is None:
        steps = owner.__dict__["_xl_steps"] = factory()
    return steps


def batch_size(batch: object, depth: int = 0) -> int:
    """The leading dimension of the first tensor in ``batch`` (a tensor, a mapping, a sequence);
    0 when none is found. Reads shapes only: never waits for the device."""
    if depth > 3 or batch is None:
        return 0
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 0
    values = getattr(batch, "values", None)
    if callable(values):  # dicts, HF's BatchEncoding
        items: Any = values()
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return 0
    for item in items:
        found = batch_size(item, depth + 1)
        if found:
            return found
    return 0
