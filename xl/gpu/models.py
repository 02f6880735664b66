"""Which GPU models a set of GPUs holds, and the one sentence said when they are mixed.

DDP and FSDP wait at every step for the slowest rank, so GPUs of different models train at the
pace of the slowest one: the doctor's `gpus` check and the app's GPU picker warn in these words.
Standard library only and cheap to import (no NVML), so the doctor's checks load it at startup.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xl.gpu.inventory import GPU


def model_counts(gpus: Iterable[GPU]) -> Counter[str]:
    """How many GPUs of each model, in the order the models first appear. Callers leave out the
    GPUs that don't count (lost ones: their name may be unknown)."""
    return Counter(g.name for g in gpus)


def models_text(counts: Counter[str]) -> str:
    """'2x NVIDIA A100-SXM4-80GB, 1x Tesla T4': each model with how many of it."""
    return ", ".join(f"{n}x {name}" for name, n in counts.items())


def model_names(gpus: Iterable[GPU]) -> list[str]:
    """The distinct models, sorted: how a warning names them when their counts don't matter."""
    return sorted({g.name for g in gpus})


def mixed_models(gpus: Iterable[GPU]) -> str | None:
    """The warning for GPUs of more than one model; None when they are all alike (or none)."""
    counts = model_counts(gpus)
    if len(counts) < 2:
        return None
    return f"mixed models: {models_text(counts)}; DDP runs every rank at the slowest GPU's pace"
