"""Lightning integration (``pytorch_lightning`` and ``lightning``), with no code change under
``xl launch``: the rank entry adds ``callback_for(...)()`` to every Trainer, on every rank.

At each optimizer step, every rank logs its own ``step`` (``trainer.global_step``), ``loss``
(what ``training_step`` returned for the step's batches: the value a script logs as
``train_loss``; the mean over accumulated batches), ``samples`` (the batches' leading
dimension, hence samples/s), ``epoch`` and ``total_steps``. Which progress bar Lightning picks
(Rich or TQDM) changes nothing. After each validation (never the sanity check), the metrics the
script logged during it (``val_loss``, ...) are logged as they are, with ``eval_loss`` for a
validation loss: kept apart from the training loss, and they never move the step.
"""

from __future__ import annotations

import functools
import importlib
import math
from types import ModuleType
from typing import Any

import xl
from xl import client
from xl.integrations.report import OWN_KEYS, batch_size, claim

# the validation loss names Lightning's docs and templates use
_VAL_LOSS = ("val_loss", "valid_loss", "validation_loss", "val/loss")
_VAL_PREFIXES = ("val", "valid", "eval", "validation")

_classes: dict[str, type] = {}


def _loss(outputs: Any) -> Any:
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    if getattr(outputs, "ndim", None) == 0:
        return outputs.detach()
    return None


def _scalar(value: Any) -> Any:
    if getattr(value, "ndim", None) == 0:
        return value.detach()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None


class _Logger:
    """The callback's counts and logic, apart from the class it must subclass (one per package)."""

    def __init__(self) -> None:
        self.loss: Any = None
        self.batches = 0
        self.samples = 0
        self.last_step: int | None = None
        self.total: tuple[int, int | None] | None = None  # (epoch, total_steps) as found then
        client.announce(*OWN_KEYS)

    def train_batch(self, trainer: Any, outputs: Any, batch: Any) -> None:
        loss = _loss(outputs)
        if loss is not None:
            self.loss = loss if self.loss is None else self.loss + loss
            self.batches += 1
        self.samples += batch_size(batch)
        step = int(trainer.global_step)
        if step == self.last_step:
            return  # accumulating: the optimizer has not stepped yet
        self.last_step = step
        epoch = int(trainer.current_epoch)
        scalars: dict[str, Any] = {"step": step, "epoch": epoch}
        if self.loss is not None:
            scalars["loss"] = self.loss / self.batches if self.batches > 1 else self.loss
        if self.samples:
            scalars["samples"] = self.samples
        if self.total is None or self.total[0] != epoch:
            # once an epoch, not every step: only a reloaded dataloader (at an epoch) changes it
            self.total = (epoch, _total_steps(trainer))
        total = self.total[1]
        if total:
            scalars["total_steps"] = total
        self.loss, self.batches, self.samples = None, 0, 0
        if claim("lightning"):
            xl.log(**scalars)

    def validation_end(self, trainer: Any) -> None:
        if getattr(trainer, "sanity_checking", False):
            return
        scalars: dict[str, Any] = {}
        for key, value in dict(getattr(trainer, "callback_metrics", {}) or {}).items():
            if not isinstance(key, str) or not key.lower().startswith(_VAL_PREFIXES):
                continue
            found = _scalar(value)
            if found is None:
                continue
            scalars[key] = found
            if key.lower() in _VAL_LOSS:
                scalars["eval_loss"] = found
        if scalars and claim("lightning"):
            xl.log(step=int(trainer.global_step), epoch=int(trainer.current_epoch), **scalars)


def _total_steps(trainer: Any) -> int | None:
    max_steps = getattr(trainer, "max_steps", -1)
    if isinstance(max_steps, int) and max_steps > 0:
        return max_steps
    try:
        total = trainer.estimated_stepping_batches
    except Exception:  # an iterable of unknown length
        return None
    return int(total) if isinstance(total, (int, float)) and math.isfinite(total) else None


def callback_for(package: str) -> type:
    """The callback class for ``package`` (``pytorch_lightning`` or ``lightning.pytorch``): a
    subclass of that package's own Callback, which Lightning checks for."""
    cls = _classes.get(package)
    if cls is None:
        base = importlib.import_module(f"{package}.callbacks").Callback

        class XLLightningCallback(base):  # type: ignore[valid-type, misc]
            def __init__(self) -> None:
                super().__init__()
                self._xl = _Logger()

            def on_train_start(self, trainer: Any, pl_module: Any) -> None:
                claim("lightning")  # before the first step of a DeepSpeed strategy's engine
                # a batch that only accumulates keeps global_step: no step to log yet
                self._xl.last_step = int(trainer.global_step)

            def on_train_batch_end(
                self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
            ) -> None:
                self._xl.train_batch(trainer, outputs, batch)

            def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
                self._xl.validation_end(trainer)

        cls = _classes[package] = XLLightningCallback
    return cls


def instrument(module: ModuleType) -> None:
    """Every Trainer of the package ``module`` belongs to gets the callback (unless it has one)."""
    trainer_cls = module.Trainer
    if getattr(trainer_cls, "_xl_instrumented", False):
        return
    package = module.__name__.rsplit(".trainer.trainer", 1)[0]
    original = trainer_cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            cls = callback_for(package)
            given = kwargs.get("callbacks")
            given = (
                [given] if given is not None and not isinstance(given, list) else list(given or [])
            )
            if not any(isinstance(cb, cls) for cb in given):
                kwargs["callbacks"] = [*given, cls()]
        except Exception:  # a Lightning we do not know: the Trainer is made as the script asked
            pass
        original(self, *args, **kwargs)

    trainer_cls.__init__ = __init__
    trainer_cls._xl_instrumented = True
