"""HF Trainer integration: ``Trainer(..., callbacks=[XLCallback()])``.

Logs from **every** rank (HF's own reporters log rank 0 only), at each optimizer step: the step,
this rank's own loss (read from the model's output by a forward hook, so it is the rank's
last micro-batch loss, not HF's all-rank average; the tensor is read off the training thread),
samples (hence samples/s), tokens (``input_ids`` elements, padding included, hence tokens/s),
total_steps (progress, ETA) and epoch; at each Trainer log, the
scalars it reports (learning rate as ``lr``, grad_norm, ...; HF's averaged loss as
``hf_loss`` when the per-rank loss is available, else as ``loss``).

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


def _output_loss(output: Any) -> Any:
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None or getattr(loss, "ndim", None) != 0:
        return None
    return loss.detach()


class XLCallback(TrainerCallback):
    def __init__(self) -> None:
        self._samples = 0
        self._loss: Any = None
        self._tokens = 0
        self._hook: Any = None
        client.announce()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        per_device = getattr(args, "per_device_train_batch_size", 0) or 0
        accum = getattr(args, "gradient_accumulation_steps", 1) or 1
        # samples this rank processes per optimizer step
        self._samples = int(per_device * accum) if per_device else 0
        model = kwargs.get("model")
        if model is not None and self._hook is None and hasattr(model, "register_forward_hook"):
            try:
                self._hook = model.register_forward_hook(self._capture, with_kwargs=True)
            except Exception:  # an exotic model: HF's averaged loss still gets logged
                self._hook = None

    def _capture(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if not module.training:
            return
        loss = _output_loss(output)
        if loss is not None:
            self._loss = loss
        ids = kwargs.get("input_ids") if isinstance(kwargs, dict) else None
        if ids is not None and hasattr(ids, "numel"):
            # numel() reads the shape, never the device: padding included, no sync.
            self._tokens += int(ids.numel())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        scalars: dict[str, Any] = {"step": state.global_step}
        if self._loss is not None:
            scalars["loss"] = self._loss
        if self._samples:
            scalars["samples"] = self._samples
        if self._tokens:
            scalars["tokens"] = self._tokens
            self._tokens = 0
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
            name = _RENAME.get(key, key)
            if name == "loss" and self._loss is not None:
                name = "hf_loss"
            scalars[name] = value
        if scalars:
            xl.log(step=state.global_step, **scalars)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        xl.flush(timeout=2.0)
