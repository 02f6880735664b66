"""Descendants of the run that left its environment (a rank's child started with ``env={}``).

``xl stop`` and settling find a run's processes by XL_RUN_ID; those that shed it are recorded in
escaped.json (``xl.launcher.runprocs.escaped``) so they are found too once this supervisor is gone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from xl.launcher import runprocs
from xl.launcher.rundir import layout
from xl.launcher.supervisor.journal import WriteFailed

SCAN_S = 2.0  # how often the processes that left the run's environment are looked for


class Escapes:
    def __init__(self, run_dir: Path, run_id: str) -> None:
        self.run_dir, self.run_id = run_dir, run_id
        self.recorded: list[tuple[int, float]] = []  # (pid, start time) in escaped.json
        self.seen: list[tuple[int, float]] = []  # the last scan's finds, recorded once seen twice
        self.scan_at = 0.0  # monotonic

    def scan(self) -> list[WriteFailed]:
        """At most every SCAN_S: record what is still outside the run's environment a scan later
        (a process in the middle of exiting has lost its environment too). Returns the write of
        escaped.json the disk refused, if it did (tried again on the next scan)."""
        now = time.monotonic()
        if now < self.scan_at:
            return []
        self.scan_at = now + SCAN_S
        seen = runprocs.escaped_descendants(os.getpid(), self.run_id)
        found = [item for item in seen if item in self.seen]
        self.seen = seen
        if found != self.recorded:
            try:
                runprocs.save_escaped(self.run_dir, found)
                self.recorded = found
            except OSError as exc:
                return [WriteFailed(layout.ESCAPED, exc)]
        return []
