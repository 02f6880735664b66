"""The device picker's model: which GPUs the person chose, in which order, and what that means.

Pure (no Textual) so the GPUs screen, the Launch screen and the tests share one definition of
the resulting ``CUDA_VISIBLE_DEVICES`` and of the warnings shown beside it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

# A GPU this busy (or with this much memory taken by others) is flagged before launching on it:
# the doctor's GPU health check's figures, so the picker and `xl doctor` agree.
from xl.gpu.health import BUSY_MEM_FRACTION, BUSY_UTIL_PCT
from xl.gpu.models import mixed_models

if TYPE_CHECKING:
    from xl.gpu.inventory import GPU


@dataclass
class DeviceSelection:
    """Chosen GPU indices (nvidia-smi numbering) in launch order: LOCAL_RANK k uses ``order[k]``.

    The app holds one: the GPUs picker and the Launch form's GPUs field both edit it, so they
    always show the same choice. ``other`` is a ``--gpus`` value typed in the form that is not a
    list of indices (``auto:4``, ``all``, UUIDs): the picker shows it, and a pick replaces it.
    """

    order: list[int] = field(default_factory=list)
    other: str = ""

    def set_spec(self, spec: str | None) -> None:
        """Take a ``--gpus`` value (the form's field, a remembered launch); "" or None: every
        GPU."""
        spec = (spec or "").strip()
        words = [w.strip() for w in spec.split(",")]
        if spec and all(w.isdigit() for w in words) and len(set(words)) == len(words):
            self.order, self.other = [int(w) for w in words], ""
        else:
            self.order, self.other = [], spec

    def clear(self) -> None:
        self.order, self.other = [], ""

    def toggle(self, index: int) -> None:
        self.other = ""
        if index in self.order:
            self.order.remove(index)
        else:
            self.order.append(index)

    def move(self, index: int, delta: int) -> bool:
        """Move a chosen device earlier (delta < 0) or later; False when it cannot move."""
        if index not in self.order:
            return False
        pos = self.order.index(index)
        new = pos + delta
        if not 0 <= new < len(self.order):
            return False
        self.order.insert(new, self.order.pop(pos))
        return True

    def position(self, index: int) -> int | None:
        return self.order.index(index) if index in self.order else None

    def prune(self, present: Iterable[int]) -> None:
        """Forget devices that disappeared from the inventory."""
        keep = set(present)
        self.order = [i for i in self.order if i in keep]

    @property
    def gpus_spec(self) -> str:
        """The ``--gpus`` value for this selection (for picks, also ``CUDA_VISIBLE_DEVICES``);
        "" when empty: the launcher's default, every GPU."""
        return self.other or ",".join(str(i) for i in self.order)


def selection_warnings(gpus: Sequence[GPU], order: Sequence[int]) -> list[str]:
    """What a person should know before launching on these devices (one line each)."""
    by_index = {g.index: g for g in gpus}
    chosen = [by_index[i] for i in order if i in by_index]
    out: list[str] = []
    mixed = mixed_models(g for g in chosen if not g.lost)
    if mixed:
        out.append(mixed)  # the doctor's words (xl.gpu.models)
    busy: list[tuple[int, list[str]]] = []
    for g in chosen:
        if g.lost:
            out.append(f"GPU {g.index} is lost (fell off the bus): a run on it will fail")
            continue
        if g.mig_mode:
            out.append(
                f"GPU {g.index} has MIG enabled: PyTorch sees only one MIG slice of it; "
                f"disable MIG (nvidia-smi -i {g.index} -mig 0) for training"
            )
        what = _busy(g)
        if what:
            busy.append((g.index, what))
    if len(busy) == 1:
        out.append(f"GPU {busy[0][0]} is busy ({', '.join(busy[0][1])}): ranks will share it")
    elif busy:
        # One line for them all: a line each filled the panel at 80x24 and hid the rest.
        out.append(
            f"GPUs {', '.join(str(i) for i, _ in busy)} are busy (other processes or load): ranks "
            f"will share them"
        )
    return out


def _busy(g: GPU) -> list[str]:
    """What makes ``g`` busy (its processes, its load, its memory taken); [] when it is free."""
    procs = g.processes
    mem_used = g.memory_used_mib or 0.0
    mem_total = g.memory_total_mib or 0.0
    busy_mem = mem_total > 0 and mem_used / mem_total >= BUSY_MEM_FRACTION
    busy_util = (g.util_gpu or 0) >= BUSY_UTIL_PCT
    what = []
    if procs:
        what.append(f"{len(procs)} process{'es' if len(procs) != 1 else ''}")
    if g.util_gpu is not None and busy_util:
        what.append(f"{g.util_gpu}% busy")
    if busy_mem:
        what.append(f"{mem_used / 1024:.1f} GiB used")
    return what
