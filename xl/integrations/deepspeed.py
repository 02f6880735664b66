"""DeepSpeed integration, with no code change under ``xl launch`` (``instrument``, run by the
rank entry when ``deepspeed.runtime.engine`` loads).

Every rank logs, at each optimizer step of its engine (``engine.step()`` that advances
``global_steps``): ``step`` (the engine's global_steps), ``loss`` (the mean of what the script
passed to ``engine.backward`` over the step's micro-batches, before DeepSpeed scales it) and
``samples`` (train_micro_batch_size_per_gpu x gradient_accumulation_steps, hence samples/s).
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import xl
from xl import client
from xl.integrations.report import OWN_KEYS, claim, steps_of


class _Steps:
    def __init__(self) -> None:
        self.loss: Any = None
        self.micro = 0
        client.announce(*OWN_KEYS)

    def backward(self, loss: Any) -> None:
        if getattr(loss, "ndim", None) == 0:
            value = loss.detach()
            self.loss = value if self.loss is None else self.loss + value
            self.micro += 1

    def stepped(self, engine: Any) -> None:
        scalars: dict[str, Any] = {"step": int(engine.global_steps)}
        if self.loss is not None:
            scalars["loss"] = self.loss / self.micro if self.micro > 1 else self.loss
        self.loss, self.micro = None, 0
        samples = engine.train_micro_batch_size_per_gpu() * engine.gradient_accumulation_steps()
        if samples:
            scalars["samples"] = samples
        if claim("deepspeed"):
            xl.log(**scalars)


def _steps(engine: Any) -> _Steps:
    return steps_of(engine, _Steps)


def instrument(module: ModuleType) -> None:
    """Every DeepSpeedEngine reports this rank's optimizer steps."""
    cls = module.DeepSpeedEngine
    if getattr(cls, "_xl_instrumented", False):
        return
    backward, step = cls.backward, cls.step

    @functools.wraps(backward)
    def _backward(self: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _steps(self).backward(loss)
        except Exception:  # never into the script's training step
            pass
        return backward(self, loss, *args, **kwargs)

    @functools.wraps(step)
    def _step(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = self.global_steps
        out = step(self, *args, **kwargs)
        try:
            if self.global_steps != before:
                _steps(self).stepped(self)
        except Exception:  # never into the script's training step
            pass
        return out

    cls.backward = _backward
    cls.step = _step
    cls._xl_instrumented = True
