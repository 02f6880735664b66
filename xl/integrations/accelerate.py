"""Accelerate integration: ``Accelerator(log_with=XLTracker())``.

``accelerator.log({"loss": ...}, step=step)`` becomes ``xl.log(step=step, loss=...)``; put
``samples`` / ``tokens`` in the dict to get samples/s and tokens/s. Accelerate itself calls
trackers on the main process only (``Accelerator.log`` is ``@on_main_process``), so these
values come from rank 0; every rank still gets GPU/process figures from the sampler, and a
script that wants each rank's own loss calls ``xl.log`` (or ``XLTracker().log``) directly,
which works on any process (``main_process_only = False``).
"""

from __future__ import annotations

from typing import Any

from accelerate.tracking import GeneralTracker

import xl
from xl import client


class XLTracker(GeneralTracker):
    name = "xl"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str = "xl", **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        client.announce()

    @property
    def tracker(self) -> Any:
        return client

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        # Hyperparameters are not metrics; the run's spec already records the launch.
        return None

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        scalars = {
            k: v
            for k, v in values.items()
            if isinstance(k, str) and (isinstance(v, (int, float)) or hasattr(v, "item"))
        }
        if step is not None:
            scalars["step"] = step
        if scalars:
            xl.log(**scalars)

    def finish(self) -> None:
        # Nothing to wait for here: the client sends what is left when the process exits (and
        # spools it if it cannot). Accelerate calls finish on the main process only, just before
        # it destroys the process group; a flush here held rank 0 back while the other ranks
        # tore down gloo and left, and gloo could then abort one of them ("terminate called
        # without an active exception"), failing a run that had trained fine.
        return
