"""Accelerate integration: ``Accelerator(log_with=XLTracker())``, or nothing at all under
``xl launch``.

The tracker: ``accelerator.log({"train_loss": ...}, step=step)`` becomes
``xl.log(step=step, loss=...)`` (``train_loss`` is the name Accelerate's examples use; ``loss``
given beside it wins); put ``samples`` / ``tokens`` in the dict to get samples/s and tokens/s.
Accelerate calls trackers on the main process only (``Accelerator.log`` is
``@on_main_process``), so these values come from rank 0.

Unchanged scripts (``instrument``, run by the rank entry): every rank logs, at each optimizer
step (``accelerator.backward`` while gradients sync), its step, steps/s, the loss it passed to
``backward`` (the mean over the step's micro-batches) and the samples its prepared model saw
(hence samples/s). On the process where the script set up an XLTracker, the script's own
figures are the ones kept.
"""

from __future__ import annotations

import functools
import time
from types import ModuleType
from typing import Any

from accelerate.tracking import GeneralTracker

import xl
from xl import client
from xl.integrations.report import OWN_KEYS, batch_size, claim, steps_of

_RENAME = {"train_loss": "loss", "learning_rate": "lr"}


class XLTracker(GeneralTracker):
    name = "xl"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str = "xl", **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        client.announce()

    # edge: Accelerate's GeneralTracker API: its `tracker` is whatever the backend is
    @property
    def tracker(self) -> Any:
        return client

    # edge: Accelerate's GeneralTracker API: the config as the user's script passed it
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        # Hyperparameters are not metrics; the run's spec already records the launch.
        return None

    # edge: Accelerate's GeneralTracker API: the values as the user's script logged them
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        scalars: dict[str, Any] = {}
        for key, value in values.items():
            if not isinstance(key, str) or not (
                isinstance(value, (int, float)) or hasattr(value, "item")
            ):
                continue
            name = _RENAME.get(key, key)
            if name in values and name != key:
                name = key  # the script gave both: its own ``loss`` is the loss
            scalars[name] = value
        if step is not None:
            scalars["step"] = step
        if scalars:
            xl.log(**scalars)

    def finish(self) -> None:
        # Nothing to wait for here: the client sends what is left when the process exits (and
        # spools it if it cannot). Accelerate calls finish on the main process only, just before
        # it destroys the process group; a flush here would hold rank 0 back while the other
        # ranks tear down gloo and leave, and gloo can then abort one of them ("terminate called
        # without an active exception"), failing a run that trained fine.
        return


class _Steps:
    """One Accelerator's count of optimizer steps, losses and samples on this rank."""

    def __init__(self) -> None:
        self.step = 0
        self.loss: Any = None
        self.micro = 0
        self.samples = 0
        self.last_t: float | None = None
        client.announce(*OWN_KEYS)

    def count(self, module: Any, args: Any, kwargs: Any) -> None:
        if getattr(module, "training", True):
            self.samples += batch_size(args) or batch_size(kwargs)

    def backward(self, accelerator: Any, loss: Any) -> None:
        if getattr(loss, "ndim", None) == 0:
            value = loss.detach()
            self.loss = value if self.loss is None else self.loss + value
            self.micro += 1
        if not getattr(accelerator, "sync_gradients", True):
            return  # inside accumulate(): the step ends at the micro-batch that syncs
        self.step += 1
        scalars: dict[str, Any] = {"step": self.step}
        now = time.monotonic()
        if self.last_t is not None and now > self.last_t:
            scalars["steps_per_s"] = round(1.0 / (now - self.last_t), 3)
        self.last_t = now
        if self.loss is not None:
            scalars["loss"] = self.loss / self.micro if self.micro > 1 else self.loss
        if self.samples:
            scalars["samples"] = self.samples
        self.loss, self.micro, self.samples = None, 0, 0
        trackers = getattr(accelerator, "trackers", None) or ()
        if claim("accelerate") and not any(isinstance(t, XLTracker) for t in trackers):
            xl.log(**scalars)


def _steps(accelerator: Any) -> _Steps:
    return steps_of(accelerator, _Steps)


def instrument(module: ModuleType) -> None:
    """Every Accelerator's backward and prepared models report this rank's steps."""
    cls = module.Accelerator
    if getattr(cls, "_xl_instrumented", False):
        return
    backward, prepare_model = cls.backward, cls.prepare_model

    @functools.wraps(backward)
    def _backward(self: Any, loss: Any, **kwargs: Any) -> Any:
        out = backward(self, loss, **kwargs)
        try:
            _steps(self).backward(self, loss)
        except Exception:  # never into the script's training step
            pass
        return out

    @functools.wraps(prepare_model)
    def _prepare_model(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        out = prepare_model(self, model, *args, **kwargs)
        try:
            if not kwargs.get("evaluation_mode") and hasattr(out, "register_forward_pre_hook"):
                out.register_forward_pre_hook(_steps(self).count, with_kwargs=True)
                claim("accelerate")  # before the first step of a DeepSpeed engine it prepared
        except Exception:  # a model we cannot hook: steps and loss are still logged
            pass
        return out

    cls.backward = _backward
    cls.prepare_model = _prepare_model
    cls._xl_instrumented = True
