"""A rank's output, written by the rank's own relay: nothing the rank prints waits on the supervisor.

The entry point points file descriptors 1 and 2 (so C libraries too) at a pipe and forks a small
relay process that appends what comes through it to ``logs/rank-<r>.log``. The supervisor only
reads those files (``xl.launcher.supervisor.logsink``), so a supervisor that is frozen, killed or
busy cannot block a rank's print nor end it with EPIPE.

The relay never blocks the rank on a full disk: what cannot be written waits in memory (up to
``_PENDING_CAP``, the newest kept) and is retried every second; once it can write again it says
how much was lost. It ignores SIGINT/SIGTERM/SIGHUP (a stop's SIGTERM is for the rank, whose last
words it still writes) and ends when every writer of the pipe is gone: the rank and whatever
inherited its output. A SIGKILL of the rank's process group (a stop's last step) ends it too.
Stdlib only: it runs before user code in every rank.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import sys
import time

from xl.atomic import makedirs_private

_F_SETPIPE_SZ = 1031  # Linux: a larger pipe absorbs bursts while the relay is descheduled
_PIPE_SIZE = 1 << 20
_PENDING_CAP = 8 << 20
_RETRY_S = 1.0


class _Relay:
    def __init__(self, rfd: int, path: str) -> None:
        self.rfd, self.path = rfd, path
        self.fd: int | None = None
        self.pending = bytearray()
        self.lost = 0
        self.why = ""

    def run(self) -> None:
        while True:
            wait = _RETRY_S if self.pending else None
            try:
                ready, _, _ = select.select([self.rfd], [], [], wait)
                data = os.read(self.rfd, 1 << 16) if ready else None
            except InterruptedError:
                continue
            except OSError:
                data = b""
            if data:
                self.pending += data
                if len(self.pending) > _PENDING_CAP:
                    cut = len(self.pending) - _PENDING_CAP
                    self.lost += cut
                    del self.pending[:cut]
            self.write()
            if data == b"":
                return  # every writer is gone

    def write(self) -> None:
        if not self.pending:
            return
        try:
            if self.fd is None:
                makedirs_private(os.path.dirname(self.path))
                self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if self.lost:
                note = f"[xl: {self.lost} bytes of this rank's output were lost ({self.why})]\n"
                os.write(self.fd, note.encode())
                self.lost = 0
            while self.pending:
                n = os.write(self.fd, self.pending)
                del self.pending[:n]
        except OSError as exc:
            self.why = exc.strerror or str(exc)


def _serve(rfd: int, path: str) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.closerange(3, rfd)
        os.closerange(rfd + 1, 1 << 16)
    # Its own stdout/stderr are the rank's original ones: nothing of the rank is written there.
    _Relay(rfd, path).run()


def start(path: str) -> int | None:
    """Send fds 1 and 2 through a pipe to a relay process appending to ``path``; its pid, or
    None when no pipe or process could be made (the rank then keeps the output it was given)."""
    try:
        rfd, wfd = os.pipe()
    except OSError:
        return None
    with contextlib.suppress(OSError):
        fcntl.fcntl(wfd, _F_SETPIPE_SZ, _PIPE_SIZE)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    try:
        pid = os.fork()
    except OSError:
        os.close(rfd)
        os.close(wfd)
        return None
    if pid == 0:
        code = 0
        try:
            os.close(wfd)
            _serve(rfd, path)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(rfd)
    os.dup2(wfd, 1)
    os.dup2(wfd, 2)
    os.close(wfd)
    return pid


def finish(pid: int, timeout: float = 2.0) -> None:
    """At the rank's end: let the relay write the last lines before the rank is reported gone.

    fds 1 and 2 go to /dev/null (the interpreter still flushes at exit); the relay then sees the
    end of its pipe, unless a child of the rank still holds it: bounded wait."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
    except OSError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except OSError:
            return  # not our child any more (reaped elsewhere)
        if done:
            return
        time.sleep(0.005)
