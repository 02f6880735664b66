"""Where lines wait while the collector cannot be reached:
``$XL_RUN_DIR/spool/rank-<r>-<pid>.jsonl``.

Lines are appended as they failed to send. On reconnect the sender claims the file by renaming
it to ``.replay`` and sends it again from the last fully acked line; the rename makes replay and
the supervisor's own ingestion of spool files (once this process is gone) mutually exclusive.
Plain strings and ``os.path``, not pathlib: keeps ``import xl.client`` light in every rank.
"""

from __future__ import annotations

import contextlib
import os

from xl import wire
from xl.atomic import makedirs_private


class Spool:
    """This process's spool file and the replay of what was claimed from it."""

    def __init__(self, run_dir: str | None, rank: int, pid: int) -> None:
        self.run_dir, self.rank = run_dir, rank
        self.path = wire.spool_file(run_dir, rank, pid) if run_dir else None
        self.replay: str | None = None  # the claimed file being sent again
        self.replay_sent = 0  # its lines handed to the connection so far
        self.replay_total: int | None = None  # its lines, once read

    def reset_after_fork(self, pid: int) -> None:
        """A forked child spools to a file of its own; the parent's replay stays the parent's."""
        if self.run_dir:
            self.path = wire.spool_file(self.run_dir, self.rank, pid)
        self.replay, self.replay_sent, self.replay_total = None, 0, None

    def append(self, lines: list[bytes]) -> bool:
        """Keep ``lines`` for later; False when they are lost (no run dir, or the disk refused)."""
        if self.path is None:
            return False
        try:
            makedirs_private(os.path.dirname(self.path))
            with open(
                os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab"
            ) as fh:
                fh.write(b"\n".join(lines) + b"\n")
        except OSError:
            return False
        return True

    def pending(self) -> bool:
        """Lines wait here, not yet stored (spooled, or claimed and not all acked)."""
        return self.replay is not None or (self.path is not None and os.path.exists(self.path))

    def claim(self) -> None:
        """On a new connection: take what was spooled while disconnected, to replay it."""
        if self.replay is None and self.path is not None and os.path.exists(self.path):
            replay = self.path + ".replay"
            with contextlib.suppress(OSError):
                os.replace(self.path, replay)
                self.replay, self.replay_sent, self.replay_total = replay, 0, None

    def replay_lines(self) -> list[bytes] | None:
        """Every line of the claimed file (None, and replay given up, if it cannot be read)."""
        assert self.replay is not None
        try:
            with open(self.replay, "rb") as fh:
                lines = [ln for ln in fh.read().split(b"\n") if ln.strip()]
        except OSError:
            self.replay = None
            return None
        self.replay_total = len(lines)
        return lines

    def all_sent(self) -> bool:
        """Every line of the claimed file was handed to the connection (a file claimed while
        the connection had no room for it has sent nothing yet)."""
        return self.replay_total is not None and self.replay_sent >= self.replay_total

    def rewind(self, unacked: int) -> None:
        """The connection dropped with ``unacked`` replayed lines unacked: send them again."""
        if self.replay is not None:
            self.replay_sent = max(0, self.replay_sent - unacked)

    def finish_replay(self) -> None:
        """Every replayed line is acked: the claimed file is done with."""
        if self.replay is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.replay)
        self.replay, self.replay_sent, self.replay_total = None, 0, None
