"""Why a rank died, and the fix (docs/launch.md, "Why a rank died"; the ``cause`` object:
docs/contracts.md).

- ``reading``: a rank's last output read as a person reads a log: prefixes off, its last
  traceback's error, the lines libraries print in their own voice (pure text);
- ``words``: what torch's, NCCL's, Python's and the command-line libraries' messages mean (pure
  text);
- ``host``: what the machine says (the kernel's OOM killer, memory cgroups, who holds a port);
- ``door``: the doctor's checks and fixes (wheels and arch lists, shared memory, NCCL, compute
  mode), the one way a cause reaches them;
- ``evidence``: what is known of a dead rank, and what every cause is made of;
- ``gpu``: the GPU's, NCCL's and shared memory's causes, with the doctor's fixes;
- ``explain``: the evidence of one dead rank as a ``Cause``.

Loaded only when a rank failed: not on any run's path to its first step.
"""

from __future__ import annotations

from xl.launcher.causes.evidence import Evidence
from xl.launcher.causes.explain import explain
from xl.launcher.causes.words import one_line, peer_loss

__all__ = ["Evidence", "explain", "one_line", "peer_loss"]
