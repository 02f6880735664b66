"""The figures a metrics.jsonl line may carry, named once: and the one rule to decode a line.

Each figure is one row of FIGURES: its key in the line, the kind of line (``train`` from the
rank, ``sys`` from the supervisor's sampler or xl.watch), its unit, the RankView attribute that
shows its latest value and the exporter family it feeds (docs/contracts.md, "metrics.jsonl";
docs/exporter.md). The run reader, the digest, the diagnoser and the stall rule all decode lines
with ``stamp``/``number``/``decode`` here, so they agree on what a line says:

- a line counts only with an int ``rank`` and a finite number ``t``: a line without a time is
  skipped by everyone (never taken as "now": the wire rejects such a line, so only a hand-made
  or damaged file holds one, and a guess at its time would make a stalled rank look alive);
- a figure is a finite int or float (never a bool); anything else reads as missing.

The wire (xl.wire) imports this module in every rank: it stays stdlib only and tiny (tuples, no
dataclasses), and ``import xl.client`` must not grow.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeGuard

# A line's parts of a step, in the order they are shown (and summed: they add up to step_s).
PHASES = ("data", "compute", "comm", "other")
PHASE_KEYS = ("data_s", "compute_s", "comm_s", "other_s")


class Figure(NamedTuple):
    key: str  # in the metrics.jsonl line
    kind: str  # "train" or "sys"
    unit: str  # "s", "MiB", "1/s", "%", "count", "MHz", "°C", "W", "" (a plain number)
    field: str | None  # the RankView attribute holding its latest value (None: not shown per rank)
    family: str | None  # the exporter's metric family (None: not exported)
    text: str  # what it is, in a few words


FIGURES: tuple[Figure, ...] = (
    Figure(
        "step",
        "train",
        "",
        "step",
        "xl_train_step",
        "the step (optimizer steps), its last step's when the line stands for several",
    ),
    Figure(
        "total_steps",
        "train",
        "",
        "total_steps",
        None,
        "the steps the run will take, where the script tells",
    ),
    Figure("loss", "train", "", "loss", "xl_train_loss", "the rank's loss at its last step"),
    Figure("eval_loss", "train", "", "eval_loss", None, "the latest evaluation's loss"),
    Figure("epoch", "train", "", "epoch", None, "the epoch"),
    Figure("lr", "train", "", "lr", None, "the learning rate (also read from learning_rate)"),
    Figure("learning_rate", "train", "", "lr", None, "the learning rate, as HF names it"),
    Figure(
        "samples",
        "train",
        "count",
        None,
        "xl_train_samples_total",
        "samples the rank processed since its previous line",
    ),
    Figure(
        "samples_per_s",
        "train",
        "1/s",
        "samples_per_s",
        "xl_train_samples_per_second",
        "samples per second",
    ),
    Figure("tokens_per_s", "train", "1/s", "tokens_per_s", None, "tokens per second"),
    Figure(
        "steps_per_s", "train", "1/s", "steps_per_s", None, "steps per second (a tqdm bar's rate)"
    ),
    Figure(
        "steps",
        "train",
        "count",
        None,
        None,
        "how many steps the line stands for (its times are per-step means)",
    ),
    Figure(
        "step_s",
        "train",
        "s",
        "step_s",
        "xl_rank_step_seconds",
        "a step's wall time, end of the previous step to the end of this one",
    ),
    Figure(
        "data_s",
        "train",
        "s",
        "data_s",
        "xl_rank_step_phase_seconds",
        "of the step, waiting for the next batch",
    ),
    Figure(
        "compute_s",
        "train",
        "s",
        "compute_s",
        "xl_rank_step_phase_seconds",
        "of the step, forward, backward and optimizer while not waiting",
    ),
    Figure(
        "comm_s",
        "train",
        "s",
        "comm_s",
        "xl_rank_step_phase_seconds",
        "of the step, waiting on communication that compute did not hide",
    ),
    Figure(
        "other_s",
        "train",
        "s",
        "other_s",
        "xl_rank_step_phase_seconds",
        "of the step, the rest (the script's own code between steps)",
    ),
    Figure(
        "mem_peak_mib",
        "train",
        "MiB",
        "mem_peak_mib",
        "xl_rank_memory_peak_bytes",
        "CUDA: the rank's peak allocated memory during the step",
    ),
    Figure(
        "gpu_util",
        "sys",
        "%",
        "gpu_util",
        "xl_gpu_utilization_ratio",
        "the rank's GPU's utilization",
    ),
    Figure(
        "gpu_mem_used_mib",
        "sys",
        "MiB",
        "gpu_mem_used_mib",
        None,
        "memory used on the rank's GPU, by every process",
    ),
    Figure("gpu_mem_total_mib", "sys", "MiB", "gpu_mem_total_mib", None, "the rank's GPU's memory"),
    Figure(
        "gpu_proc_mem_mib",
        "sys",
        "MiB",
        "gpu_proc_mem_mib",
        "xl_gpu_memory_used_bytes",
        "what the rank's processes hold on its GPU (NVML, per process)",
    ),
    Figure(
        "mem_mib",
        "sys",
        "MiB",
        "mem_mib",
        "xl_rank_memory_bytes",
        "the rank's footprint: PSS over the rank and its children",
    ),
    # What holds the rank's GPU back (xl.gpu.clocks), per GPU
    Figure(
        "clock_event_reasons",
        "sys",
        "",
        None,
        "xl_gpu_clock_event_reasons",
        "NVML's bitmask of why the GPU's clocks are down",
    ),
    Figure("sm_clock_mhz", "sys", "MHz", None, None, "the GPU's SM clock"),
    Figure("sm_clock_max_mhz", "sys", "MHz", None, None, "the GPU's top SM clock"),
    Figure("temp_c", "sys", "°C", None, None, "the GPU's temperature"),
    Figure("power_w", "sys", "W", None, None, "the GPU's power draw"),
    Figure("power_limit_w", "sys", "W", None, None, "the GPU's power limit"),
    Figure("ecc_volatile", "sys", "count", None, None, "uncorrectable ECC errors since load"),
    Figure("xid", "sys", "", None, None, "the GPU's last XID"),
    Figure("xid_t", "sys", "s", None, None, "unix time the last XID was read"),
    Figure("rss_mib", "sys", "MiB", "rss_mib", None, "resident memory"),
    Figure(
        "cgroup_mem_mib", "sys", "MiB", None, None, "the run's processes on the node, together"
    ),
    Figure("cgroup_mem_limit_mib", "sys", "MiB", None, None, "the run's --memory-limit"),
    Figure("cpu_pct", "sys", "%", "cpu_pct", None, "CPU, percent of one core, with its children"),
    Figure("cuda_alloc_mib", "sys", "MiB", "cuda_alloc_mib", None, "torch's allocated CUDA memory"),
    Figure(
        "cuda_reserved_mib", "sys", "MiB", "cuda_reserved_mib", None, "torch's reserved CUDA memory"
    ),
    Figure("cuda_max_alloc_mib", "sys", "MiB", None, None, "torch's peak allocated CUDA memory"),
    Figure(
        "comm_wait_s",
        "sys",
        "s",
        "comm_wait_s",
        None,
        "xl.watch: mean wait per step at the gradient all-reduce",
    ),
    Figure(
        "comm_steps", "sys", "count", None, None, "xl.watch: the steps comm_wait_s is the mean of"
    ),
    Figure(
        "comm_pending_s",
        "sys",
        "s",
        None,
        None,
        "xl.watch: how long the oldest all-reduce bucket has been pending",
    ),
)

BY_KEY: dict[str, Figure] = {f.key: f for f in FIGURES}
KEYS = frozenset(BY_KEY)
# (key, RankView attribute) of the figures a line of each kind sets as they come, most of them:
# the reader copies these; the few with a history or a rule of their own (step, total_steps,
# loss, lr, samples_per_s, eval_loss, epoch) it handles itself.
_OWN_RULE = frozenset(
    {"step", "total_steps", "loss", "lr", "learning_rate", "samples_per_s", "eval_loss", "epoch"}
)
# The step split comes whole with its step_s (TIMED: read only from a line with step_s, so an
# untimed line costs the reader nothing for it); the rest of the train figures, PLAIN.
TIMED = ("step_s", *PHASE_KEYS)
PLAIN_TRAIN = tuple(
    (f.key, f.field)
    for f in FIGURES
    if f.kind == "train" and f.field and f.key not in _OWN_RULE and f.key not in TIMED
)
PLAIN_SYS = tuple((f.key, f.field) for f in FIGURES if f.kind == "sys" and f.field)


def finite(value: object) -> TypeGuard[float]:
    """A finite int or float, not a bool: ``v - v`` is 0 only then (inf - inf and nan - nan are
    nan)."""
    return (type(value) is float or type(value) is int) and value - value == 0


def number(value: object) -> float | int | None:
    """``value`` when it is a figure (finite, not a bool), else None."""
    if type(value) is float or type(value) is int:  # what JSON numbers are: the fast path
        return value if value - value == 0 else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def stamp(rec: object) -> tuple[int, float] | None:
    """(rank, t) of a metrics.jsonl line, or None when it has no int rank or no finite time: such
    a line is skipped (see the module's docstring)."""
    if type(rec) is not dict:
        return None
    rank, t = rec.get("rank"), rec.get("t")
    if type(rank) is not int or not finite(t):  # JSON's ints are exactly int; `true` is not rank 1
        return None
    return rank, t


class Line:
    """One decoded metrics.jsonl line: its rank, time and kind, and its known figures
    (``values``: key -> number, or None for a figure the line gives as null or a non-number)."""

    __slots__ = ("kind", "rank", "raw", "t", "values")

    def __init__(
        self,
        rank: int,
        t: float,
        kind: str,
        values: dict[str, float | int | None],
        raw: dict[str, Any],
    ) -> None:
        self.rank, self.t, self.kind, self.values, self.raw = rank, t, kind, values, raw

    def get(self, key: str) -> float | int | None:
        return self.values.get(key)


def decode(rec: object) -> Line | None:
    """A metrics.jsonl record as a Line, or None when it is not one (see ``stamp``)."""
    head = stamp(rec)
    if head is None or type(rec) is not dict:
        return None
    kind = rec.get("kind")
    return Line(
        head[0],
        head[1],
        kind if type(kind) is str else "",
        {k: number(v) for k, v in rec.items() if k in KEYS},
        rec,
    )


def phases(values: Mapping[str, object]) -> dict[str, float] | None:
    """A line's step split, {"data_s": ..., ...} (per step), when it gives all four parts."""
    out = {}
    for key in PHASE_KEYS:
        v = values.get(key)
        if not finite(v) or v < 0:
            return None
        out[key] = float(v)
    return out


def steps_of(values: Mapping[str, object]) -> int:
    """How many steps a line stands for (``steps``; 1 when it does not say or says nonsense)."""
    n = values.get("steps")
    return int(n) if finite(n) and n >= 1 else 1
