"""HF Trainer integration: ``Trainer(..., callbacks=[XLCallback()])``, or nothing at all under
``xl launch`` (the rank entry adds the callback to every Trainer, on every rank).

Logs from **every** rank (HF's own reporters log on rank 0 only), at each optimizer step:
- ``loss``: this rank's loss for the step, as the Trainer computes the loss it logs (the sum of
  ``training_step``'s results over the step's micro-batches: after its scaling for
  ``average_tokens_across_devices`` and gradient accumulation). The Trainer logs the mean of
  these over ranks and logging steps; each rank's own is what tells ranks apart;
- ``samples`` (per_device_train_batch_size x gradient_accumulation_steps, the Trainer's own
  figure, hence samples/s), ``tokens`` (``input_ids`` elements, hence tokens/s), ``step``,
  ``total_steps`` (progress, ETA) and ``epoch``.

At each Trainer log: its scalars (``learning_rate`` as ``lr``, ``grad_norm``, ...; its all-rank
loss as ``hf_loss``). Evaluation results keep their ``eval_`` names (``eval_loss``, ...): they
are never a training loss, and evaluation never moves the step. The end-of-training summary
(``train_runtime``, ``train_loss`` averaged over the run) is not a step and is left out.

Without any callback the supervisor still reads the log dicts rank 0 prints.
"""

from __future__ import annotations

import functools
import math
import sys
from types import ModuleType
from typing import Any

from transformers import TrainerCallback

import xl
from xl import client
from xl.integrations.report import OWN_KEYS, claim

_RENAME = {"learning_rate": "lr", "loss": "hf_loss"}


class XLCallback(TrainerCallback):
    def __init__(self) -> None:
        self._samples = 0
        self._loss: Any = None  # this rank's loss for the step so far (a detached tensor)
        self._tokens = 0
        self._bound: Any = None  # the Trainer whose training_step this callback reads
        client.announce(*OWN_KEYS)

    # edge: the HF Trainer instance (transformers is not imported here)
    def bind(self, trainer: Any) -> None:
        """Read this rank's loss from ``trainer.training_step``: the value the Trainer adds to the
        loss it logs (the instance's method is wrapped; the class and other Trainers are not)."""
        if self._bound is trainer:
            return
        original = trainer.training_step

        @functools.wraps(original)
        def training_step(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            loss = original(model, inputs, *args, **kwargs)
            self._add(loss, inputs)
            return loss

        trainer.training_step = training_step
        self._bound = trainer

    def _add(self, loss: Any, inputs: Any) -> None:
        if getattr(loss, "ndim", None) == 0:
            # A tensor sum on the device: nothing waits for it here; the sender reads it.
            self._loss = loss if self._loss is None else self._loss + loss
        ids = inputs.get("input_ids") if callable(getattr(inputs, "get", None)) else None
        if ids is not None and hasattr(ids, "numel"):
            self._tokens += int(ids.numel())  # the shape, not the data: padding included, no sync

    # edge: TrainerCallback's signature: transformers' own types, not imported here
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        per_device = getattr(args, "per_device_train_batch_size", 0) or 0
        accum = getattr(args, "gradient_accumulation_steps", 1) or 1
        self._samples = int(per_device * accum) if per_device else 0
        if self._bound is None:
            trainer = _calling_trainer()
            if trainer is not None:
                self.bind(trainer)
        claim("transformers")

    # edge: TrainerCallback's signature: transformers' own types, not imported here
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        scalars: dict[str, Any] = {"step": state.global_step}
        if self._loss is not None:
            scalars["loss"] = self._loss
            self._loss = None
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

    # edge: TrainerCallback's signature: transformers' own types, not imported here
    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not logs or "train_runtime" in logs:
            return  # nothing, or the run's summary
        scalars: dict[str, Any] = {}
        for key, value in logs.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if isinstance(value, float) and math.isnan(value) and key != "loss":
                continue
            name = _RENAME.get(key, key)
            if name == "hf_loss" and self._bound is None:
                name = "loss"  # no per-rank loss to show: the Trainer's is the best there is
            scalars[name] = value
        if scalars:
            xl.log(step=state.global_step, **scalars)

    # edge: TrainerCallback's signature: transformers' own types, not imported here
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        xl.flush(timeout=2.0)


def _calling_trainer() -> Any:
    """The Trainer whose callback handler is calling: the Trainer hands callbacks no reference
    to itself, so a callback the script added is bound from its caller's frame."""
    frame = sys._getframe(1)
    for _ in range(8):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return None
        obj = frame.f_locals.get("self")
        if obj is not None and hasattr(obj, "callback_handler") and hasattr(obj, "training_step"):
            return obj
    return None


def _attach(trainer: Any) -> None:
    """Give ``trainer`` an XLCallback (the script's own, if it added one) bound to it."""
    handler = getattr(trainer, "callback_handler", None)
    if handler is None:
        return
    ours = next((cb for cb in handler.callbacks if isinstance(cb, XLCallback)), None)
    if ours is None:
        ours = XLCallback()
        trainer.add_callback(ours)
    ours.bind(trainer)
    claim("transformers")  # its Accelerator's backward is the Trainer's, not the script's


def instrument(module: ModuleType) -> None:
    """Every Trainer (subclasses too) made after ``transformers.trainer`` loads gets a callback."""
    cls = module.Trainer
    if getattr(cls, "_xl_instrumented", False):
        return
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            _attach(self)
        except Exception:  # a Trainer we do not know: it runs as it would have
            pass

    cls.__init__ = __init__
    cls._xl_instrumented = True
