"""What keeps the supervisor standing: descriptors, a private run dir, and a crash that says so.

- ``raise_fd_limit``: the soft RLIMIT_NOFILE goes up to the hard limit at start (the collector caps
  its connections below it, ``xl.launcher.telemetry.server.connection_cap``), so a flood of
  connections is refused one by one instead of ending the supervisor.
- ``private_umask``: files the supervisor creates in the run dir are 0600, folders 0700; torchrun
  and the ranks get the user's umask back (their checkpoints are theirs).
- ``crash_line``: the crash path writes one line to fd 2 (supervisor.log) with a plain
  ``os.write``: no new descriptor, no import, nothing that can fail on a full disk but the write.
"""

from __future__ import annotations

import contextlib
import os
import resource


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard one; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def private_umask() -> int:
    """Make this process's new files private; returns the umask it had (for its children)."""
    return os.umask(0o077)


def crash_line(what: str) -> None:
    """One line on fd 2 that needs nothing but the write itself."""
    with contextlib.suppress(OSError):
        os.write(2, f"xl supervisor: {what}\n".encode("utf-8", "replace"))
