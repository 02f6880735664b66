"""HF Trainer integration: ``Trainer(..., callbacks=[XLCallback()])``.

Logs from **every** rank (HF's own reporters log rank 0 only): step, samples (so samples/s),
total_steps (progress, ETA) and epoch at each optimizer step, and at each Trainer log the
scalars it reports (loss, learning rate as ``lr``, grad_norm, ...). The loss HF reports is
already averaged over ranks; step timing and throughput are this rank's own.

Without this callback the supervisor still reads the log dicts rank 0 prints.
"""

from __future__ import annotations

import math
from typing import Any

from transformers import TrainerCallback

import xl
from xl import client

_RENAME = {"learning_rate": "lr"}
# Per-run summaries HF logs once at the end; they are not step metrics.
_SKIP = {"total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


class XLCallback(TrainerCallback):
    def __init__(self) -> None:
        self._samples = 0
        self._world = 1
        client.announce()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        world = max(1, int(getattr(args, "world_size", 1) or 1))
        per_device = getattr(args, "per_device_train_batch_size", 0) or 0
        accum = getattr(args, "gradient_accumulation_steps", 1) or 1
        # samples this rank processes per optimizer step
        self._samples = int(per_device * accum) if per_device else 0
        self._world = world

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        scalars: dict[str, Any] = {"step": state.global_step}
        if self._samples:
            scalars["samples"] = self._samples
        if state.max_steps and state.max_steps > 0:
            scalars["total_steps"] = state.max_steps
        if state.epoch is not None:
            scalars["epoch"] = state.epoch
        xl.log(**scalars)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not logs:
            return
        scalars: dict[str, Any] = {}
        for key, value in logs.items():
            if key in _SKIP or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if isinstance(value, float) and math.isnan(value) and key != "loss":
                continue
            scalars[_RENAME.get(key, key)] = value
        if scalars:
            xl.log(step=state.global_step, **scalars)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        xl.flush(timeout=2.0)
