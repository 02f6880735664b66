"""Why a rank died, and the fix (docs/launch.md, "Why a rank died"; the ``cause`` object:
docs/contracts.md).

- ``reading``: a rank's last output read as a person reads a log: prefixes off, its last
  traceback's error, the lines libraries print in their own voice (pure text);
- ``words``: what torch's, NCCL's, Python's and the command-line libraries' messages mean (pure
  text);
- ``host``: what the machine says (the kernel's OOM killer, memory cgroups, who holds a port);
- ``doctor_facts``: the doctor's checks and fixes (wheels and arch lists, shared memory, NCCL,
  compute mode), the one way a cause reaches them;
- ``evidence``: what is known of a dead rank, and what every cause is made of;
- ``gpu``: the GPU's, NCCL's and shared memory's causes, with the doctor's fixes;
- ``why``: the evidence of one dead rank as a ``Cause`` (``explain``).

Loaded only when a rank failed: not on any run's path to its first step.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xl.launcher.causes.evidence import Evidence
    from xl.launcher.causes.why import explain
    from xl.launcher.causes.words import one_line, peer_loss

__all__ = ["Evidence", "explain", "one_line", "peer_loss"]

# Exported lazily: the supervisor reads a zombie's exit (``host``) and a peer's loss (``words``)
# the moment a rank dies, before anything is explained; ``explain`` and the doctor's API load
# only when a cause is made.
_HOMES = {
    "Evidence": "evidence",
    "explain": "why",
    "one_line": "words",
    "peer_loss": "words",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
