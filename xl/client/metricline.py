"""What one ``xl.log`` call becomes: the metrics.jsonl line the collector stores byte for byte.

This runs on the sender thread, never on the training thread: 0-d tensors are read here with
``.item()``, so logging never waits for the device. torch is never imported: tensors are
recognised by their ``item``/``ndim`` attributes, and CUDA counters are read only when the
script has imported torch itself.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from xl import wire

# The train keys a framework integration reports for the rank itself (xl.client.announce).
OWN_KEYS = ("step", "loss", "samples")
# Keys a script may give itself that torch's step hooks would also report: once it gave one, the
# hooks' lines leave it out ("step_s" stands for the whole split: a script that times its own
# steps is not timed twice).
OWNED = (*OWN_KEYS, "step_s")
# (count key, rate key): ``samples=`` is what was processed since the previous call that gave it.
_RATES = (("samples", "samples_per_s"), ("tokens", "tokens_per_s"))


class OwnTrain:
    """Who sends this rank's train keys, decided here and nowhere else in the rank's process:
    ``reports`` once the rank reports its own train records (an ``xl.log`` call, a framework
    integration, or torch's hooks at the first optimizer step), which goes on the wire as the
    frame header's ``"train": true`` (xl.wire); ``keys``: the keys of OWNED the rank gives
    itself, which the steps' lines leave out. Any thread: its updates are single set updates."""

    __slots__ = ("_keys", "reports")

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self.reports = False

    def announce(self, keys: Iterable[str] = ()) -> None:
        """The rank reports its own train records from now on, and gives ``keys`` itself before
        it has logged them (a framework integration says so before its first step)."""
        self._keys.update(keys)
        self.reports = True

    def logged(self, scalars: Mapping[str, object]) -> None:
        """An ``xl.log`` call's scalars (on the sender thread, as they are turned into lines)."""
        self.reports = True
        if len(self._keys) < len(OWNED):
            self._keys.update(k for k in OWNED if k in scalars)

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self._keys)


# What gives one line's scalars for the steps torch's hooks counted (xl.client.attach_steps):
# called with the keys the rank gives itself and whether every step goes out now.
StepSource = Callable[[Collection[str], bool], tuple[float, Mapping[str, object]] | None]


class _Skip:
    """A value that cannot be stored: its key is left out of the record."""


SKIP = _Skip()


# edge: the script's own values, read as they are turned into the wire's line
def scalar(value: Any) -> Any:
    """The JSON scalar stored for ``value``, or SKIP; never raises (the script's objects may)."""
    kind = type(value)
    if kind is float or kind is int or kind is bool or value is None:
        return value
    if kind is str:
        return value[: wire.MAX_STR]
    if isinstance(value, (int, float)):  # numpy scalars, IntEnum, ...
        return float(value) if isinstance(value, float) else int(value)
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "ndim", 0) == 0:
        # A 0-d tensor / ndarray: read here, off the training thread.
        try:
            out = item()
        except Exception:
            return SKIP
        if isinstance(out, bool):
            return out
        if isinstance(out, (int, float)):
            return out
    return SKIP


def train_line(
    t: float, scalars: Mapping[str, object], rank: int, last_rate_t: dict[str, float]
) -> bytes | None:
    """One queued call as a ``train`` line, or None when it cannot be sent (the caller counts
    it as dropped). ``last_rate_t`` holds when each count was last given, for the rates."""
    rec: dict[str, Any] = {"t": round(t, 6), "rank": rank, "kind": "train"}
    nonfinite: dict[str, str] | None = None
    for key, raw in scalars.items():
        value = scalar(raw)
        if value is SKIP:
            continue
        if key in wire.RESERVED:
            key = f"user_{key}"
        if len(key) > wire.MAX_KEY_LEN:
            key = key[: wire.MAX_KEY_LEN]
        if type(value) is float and not math.isfinite(value):
            # Strict JSON has no NaN: the value is null and the reason travels beside it.
            nonfinite = nonfinite or {}
            nonfinite[key] = "nan" if value != value else ("inf" if value > 0 else "-inf")
            value = None
        rec[key] = value
        if len(rec) >= wire.MAX_KEYS - 4:
            break
    for count_key, rate_key in _RATES:
        count = rec.get(count_key)
        if isinstance(count, (int, float)) and not isinstance(count, bool):
            prev = last_rate_t.get(count_key)
            last_rate_t[count_key] = t
            if prev is not None and t > prev and rate_key not in rec:
                # A rate given beside the count (the step clock's, over the steps' own time) stays.
                rec[rate_key] = round(count / (t - prev), 3)
    if nonfinite:
        rec["nonfinite"] = nonfinite
    try:
        line = wire.dumps_record(rec)
    except (TypeError, ValueError):
        return None
    if not line or len(line) > wire.MAX_RECORD:
        return None
    return line


def drain(
    queue: deque[tuple[float, dict[str, object]]],
    rank: int,
    last_rate_t: dict[str, float],
    own: OwnTrain,
    source: StepSource | None,
    final: bool = True,
) -> tuple[list[bytes], int]:
    """The queued ``xl.log`` calls as ``train`` lines, then one line for the steps torch's hooks
    counted since (``source``, xl.client.attach_steps; ``final``: all of them, even the steps
    that just ended); and how many calls could not be sent.

    ``own`` learns the keys of OWNED the script logged itself: the steps' line leaves them out
    from then on (after the queue, so a key logged for these very steps is already there)."""
    out: list[bytes] = []
    dropped = 0
    while queue:
        try:
            t, scalars = queue.popleft()
        except IndexError:
            break
        own.logged(scalars)
        line = train_line(t, scalars, rank, last_rate_t)
        if line is None:
            dropped += 1
        else:
            out.append(line)
    if source is not None:
        try:
            got = source(own.keys, final)
        except Exception:  # the step source must never stop the sender
            got = None
        line = train_line(got[0], got[1], rank, last_rate_t) if got is not None else None
        if line is not None:
            out.append(line)
    return out, dropped


def sys_line(t: float, rank: int, fields: dict[str, float]) -> bytes | None:
    """A ``sys`` line of the figures only the rank knows; None when it knows none."""
    if not fields:
        return None
    return wire.dumps_record({"t": round(t, 6), "rank": rank, "kind": "sys", **fields})


def cuda_counters(device: int) -> dict[str, float]:
    """torch's CUDA memory counters for this rank's device, when the script uses CUDA."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        cuda = torch.cuda
        if not cuda.is_initialized():
            return {}
        if device >= cuda.device_count():
            device = 0
        mib = 1024.0 * 1024.0
        return {
            "cuda_alloc_mib": round(cuda.memory_allocated(device) / mib, 1),
            "cuda_reserved_mib": round(cuda.memory_reserved(device) / mib, 1),
            "cuda_max_alloc_mib": round(cuda.max_memory_allocated(device) / mib, 1),
        }
    except Exception:
        return {}
