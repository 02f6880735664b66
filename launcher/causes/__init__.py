"""Why a rank died, and the fix (docs/launch.md, "Why a rank died"; the ``cause`` object:
docs/contracts.md).

- ``words``: what torch's, NCCL's, Python's and argparse's messages mean (pure text);
- ``host``: what the machine says (the kernel's OOM killer, memory cgroups, who holds a port);
- ``door``: the doctor's checks and fixes (wheels and arch lists, shared memory, NCCL, compute
  mode), the one way a cause reaches them;
- ``explain``: the evidence of one dead rank as a ``Cause``.

Loaded only when a rank failed: not on any run's path to its first step.
"""

from __future__ import annotations

from xl.launcher.causes.explain import Evidence, explain
from xl.launcher.causes.words import one_line, peer_loss

__all__ = ["Evidence", "explain", "one_line", "peer_loss"]
