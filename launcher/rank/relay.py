"""A rank's output, written by the rank's own relay: nothing the rank prints waits on the
supervisor.

The entry point points file descriptors 1 and 2 (so C libraries too) at a pipe and forks a small
relay process that appends what comes through it to ``logs/rank-<r>.log``. The supervisor only
reads those files (``xl.launcher.supervisor.logsink``), so a supervisor that is frozen, killed or
busy cannot block a rank's print nor end it with EPIPE.

The relay never blocks the rank on a full disk: what cannot be written waits in memory (up to
``_PENDING_CAP``, the newest kept) and is retried every second; once it can write again it says
how much was lost. It ignores SIGINT/SIGTERM/SIGHUP (a stop's SIGTERM is for the rank, whose last
words it still writes). It lives as long as the rank: everything the rank writes until its very
end (atexit handlers, logging's shutdown, the interpreter's last flush) reaches the log. It ends
when every writer of the pipe is gone, or as soon as the rank process is gone and what is in the
pipe is written (a child of the rank, or a duplicate of fd 1 that something keeps, does not hold
it up). While it runs it holds a shared ``flock`` on the log: readers know more may come
(``xl.launcher.rundir.tail.writing``). A SIGKILL of the rank's process group (a stop's last step)
ends it too.

The relay is a helper: losing it never ends training. The rank keeps the pipe's read end, so a
write never fails with EPIPE; a thread of the rank waits on the relay, and if it dies another
one takes over the same pipe (nothing in the pipe is lost); after repeated deaths the rank's
fds 1 and 2 are pointed at the log itself, and only if even that fails is the output dropped,
with "rank R's output relay died" in the rank's record. Stdlib only: it runs before user code in
every rank.
"""

from __future__ import annotations

import _thread
import contextlib
import fcntl
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator

from xl.atomic import makedirs_private, overwrite_in_place

_F_SETPIPE_SZ = 1031  # Linux: a larger pipe absorbs bursts while the relay is descheduled
_PIPE_SIZE = 1 << 20
_READ = 1 << 20  # bytes per read: large reads keep the relay's cost per byte low
_BATCH = 64 << 10
_GATHER_S = 0.002
_PENDING_CAP = 8 << 20
_RETRY_S = 1.0
_LOCK_WAIT_S = 5.0
_POLL_S = 0.5  # without pidfd (Linux < 5.3): how often the relay looks for its rank
_LAST_WRITE_S = 2.0  # after the rank is gone: how long a full disk may keep the relay
# The relay's process name (/proc/PID/comm, what ps and top show): how the sampler tells xl's
# relay from the rank's own children (DataLoader workers) and leaves it out of the rank's memory.
RELAY_NAME = "xl-relay"
_RESTARTS = 3  # relays started again before the rank writes its log itself
# A relay started again: a fresh interpreter (forking a threaded rank is not safe), finding xl
# where the rank found it.
_RELAUNCH = (
    "import sys; sys.path[:0] = {path!r}; "
    "from xl.launcher.rank.relay import main; main(sys.argv[1:])"
)


@contextlib.contextmanager
def record_locked(record: str) -> Iterator[None]:
    """Hold the lock on a rank's record while it is read and written back: the rank (its start,
    notes, end) and its relay (how much output was lost) both rewrite it, and a rewrite made
    from an older read would drop the other's fields (the rank's exit code). The lock is on the
    record's folder, which stays the same file when the record is replaced by a rename. A holder
    stuck in a hung disk's fsync is waited for _LOCK_WAIT_S at most, then written past."""
    try:
        fd = os.open(os.path.dirname(record) or ".", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.005)
            except OSError:
                break
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


class _Relay:
    def __init__(self, rfd: int, path: str, rank_pid: int) -> None:
        self.rfd, self.path, self.rank_pid = rfd, path, rank_pid
        self.fd: int | None = None
        self.pending = bytearray()
        self.lost = 0  # cut since the log last said so
        self.cut = 0  # cut in all
        self.told = 0  # what the rank's record says is lost
        self.tell_at = 0.0  # monotonic: the record is brought up to date at most once a second
        self.why = ""
        self.rank_fd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            self.rank_fd = os.pidfd_open(rank_pid)  # readable once the rank has exited
        self.open()

    def open(self) -> None:
        try:
            makedirs_private(os.path.dirname(self.path))
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            self.why = exc.strerror or str(exc)
            return
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_SH)  # held while this relay runs: more may come
        self.fd = fd

    def rank_gone(self, ready: list[int]) -> bool:
        if self.rank_fd is not None:
            return self.rank_fd in ready
        return os.getppid() != self.rank_pid

    def run(self) -> None:
        gone_at: float | None = None
        while True:
            if gone_at is not None:
                wait: float | None = 0.0  # the rank is gone: what is in the pipe, no more
            elif self.pending:
                wait = _RETRY_S
            else:
                wait = None if self.rank_fd is not None else _POLL_S
            watch = (
                [self.rfd]
                if self.rank_fd is None or gone_at is not None
                else [self.rfd, self.rank_fd]
            )
            try:
                ready, _, _ = select.select(watch, [], [], wait)
                data = os.read(self.rfd, _READ) if self.rfd in ready else None
            except InterruptedError:
                continue
            except OSError:
                data = b""
            if gone_at is None and self.rank_gone(ready):
                gone_at = time.monotonic()
            if data:
                self.keep(self.write_through(data))
            self.write()
            if data == b"" or (gone_at is not None and data is None):
                # without it a full disk kept the relay forever
                gone_at = gone_at or time.monotonic()
                break  # every writer is gone, or the rank is and the pipe is empty
            if data and len(data) < _BATCH and gone_at is None:
                # A flood comes 8 KiB a print buffer: let it gather in the pipe (which holds far
                # more than a rank writes meanwhile) instead of waking for each.
                time.sleep(_GATHER_S)
        while self.pending and time.monotonic() < gone_at + _LAST_WRITE_S:
            time.sleep(0.1)
            self.write()
        self.tell_lost(self.cut + len(self.pending))

    def tell_lost(self, count: int) -> None:
        """The rank's record says how much of its output has not reached the log (the disk
        refused it), kept up to date while the disk refuses it (a relay may be killed before its
        end): its space is held from the rank's start, so this fits on a full disk too."""
        if count == self.told:
            return
        record = os.path.join(
            os.path.dirname(os.path.dirname(self.path)),
            "ranks",
            os.path.basename(self.path).removesuffix(".log") + ".json",
        )
        with record_locked(record):
            try:
                with open(record, "rb") as fh:
                    data = json.loads(fh.read())
            except (OSError, ValueError):
                return
            if isinstance(data, dict):
                data["log_bytes_lost"] = count
                if overwrite_in_place(record, json.dumps(data).encode()):
                    self.told = count

    def write_through(self, data: bytes) -> bytes:
        """Write ``data`` straight from the read when nothing waits before it; what could not be
        written is returned, to wait in ``pending``. A flood of output is copied once less."""
        if self.pending or self.lost or self.fd is None:
            return data
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            self.why = exc.strerror or str(exc)
        return bytes(view)

    def keep(self, data: bytes) -> None:
        if not data:
            return
        self.pending += data
        if len(self.pending) > _PENDING_CAP:
            cut = len(self.pending) - _PENDING_CAP
            self.lost += cut
            self.cut += cut
            del self.pending[:cut]

    def write(self) -> None:
        if not self.pending:
            return
        try:
            if self.fd is None:
                self.open()
                if self.fd is None:
                    return
            if self.lost:
                note = f"[xl: {self.lost} bytes of this rank's output were lost ({self.why})]\n"
                os.write(self.fd, note.encode())
                self.lost = 0
            while self.pending:
                n = os.write(self.fd, self.pending)
                del self.pending[:n]
            self.tell_lost(self.cut)  # all written: only what was cut is lost
        except OSError as exc:
            self.why = exc.strerror or str(exc)
            if time.monotonic() >= self.tell_at:
                self.tell_at = time.monotonic() + _RETRY_S
                self.tell_lost(self.cut + len(self.pending))


def _name_self() -> None:
    """Call this process ``RELAY_NAME``: forked from the rank, it would otherwise read as one more
    process of the rank's (``python``), its pages counted as the rank's memory."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w", encoding="ascii") as fh:
        fh.write(RELAY_NAME)


def _serve(rfd: int, path: str, rank_pid: int) -> None:
    _name_self()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.closerange(3, rfd)
        os.closerange(rfd + 1, 1 << 16)
    # Its own stdout/stderr are the rank's original ones: nothing of the rank is written there.
    _Relay(rfd, path, rank_pid).run()


class RankOutput:
    """The rank's side: fds 1 and 2 into the pipe, the relay's pid, and the thread that keeps
    a relay there for the rank's whole life."""

    def __init__(self, path: str, rfd: int, pid: int, on_note: Callable[[str], None]) -> None:
        self.path, self.rfd, self.pid = path, rfd, pid
        st = os.fstat(rfd)
        self.pipe = (st.st_dev, st.st_ino)
        self.on_note = on_note
        self.rank = os.environ.get("RANK", "?")
        self.ending = False
        self.restarts = 0
        # The low-level start: threading's waits until the new thread has run, which on a busy
        # machine costs a rank's start milliseconds.
        _thread.start_new_thread(self._guarded, ())

    def owns(self, fd: int) -> bool:
        """``fd`` is still this rank's output pipe (not closed, nor reused for another file)."""
        try:
            st = os.fstat(fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.pipe

    def _guarded(self) -> None:
        # a helper's failure is never printed into the rank's output
        with contextlib.suppress(Exception):
            self._watch()

    def _watch(self) -> None:
        while True:
            try:
                _, status = os.waitpid(self.pid, 0)
                code: int | None = os.waitstatus_to_exitcode(status)
            except InterruptedError:
                continue
            except ChildProcessError:
                code = None  # reaped by someone else's wait(): its end is unknown
            if self.ending or code == 0:
                return  # the rank's end, or every writer of the pipe closed it
            how = (
                f"killed by signal {-code}"
                if code is not None and code < 0
                else f"exit code {code}"
            )
            if self.restarts < _RESTARTS and self._restart():
                self.restarts += 1
                self._note(
                    f"[xl: rank {self.rank}'s output relay died ({how}); another one took over]\n"
                )
                continue
            self._fall_back(how)
            return

    def _restart(self) -> bool:
        import subprocess  # noqa: PLC0415 - only when a relay died; ranks start light

        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _RELAUNCH.format(path=sys.path),
                    str(self.rfd),
                    self.path,
                    str(os.getpid()),
                ],
                pass_fds=(self.rfd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError:
            return False
        proc.returncode = 0  # reaped by this thread's waitpid, not by Popen
        self.pid = proc.pid
        return True

    def _fall_back(self, how: str) -> None:
        """No relay stays up: the rank writes its log itself (or, failing that, nowhere)."""
        note = (
            f"[xl: rank {self.rank}'s output relay died ({how});"
            " the rank now writes this log itself]\n"
        )
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            note = (
                f"rank {self.rank}'s output relay died ({how}) and its log cannot be written"
                f" ({exc.strerror}): output is dropped"
            )
        self._drain_into(fd)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        self._drain_into(fd)  # what came while the fds were moved
        os.close(fd)
        self._note(note)

    def _drain_into(self, fd: int) -> None:
        with contextlib.suppress(OSError):
            os.set_blocking(self.rfd, False)
            while data := os.read(self.rfd, _READ):
                os.write(fd, data)

    def _note(self, text: str) -> None:
        with contextlib.suppress(OSError):
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            os.write(fd, text.encode())
            os.close(fd)
        self.on_note(text.strip().strip("[]").removeprefix("xl: "))

    def finish(self) -> None:
        """At the rank's end: its relay writes on until the process is gone; never start another."""
        self.ending = True


def start(path: str, on_note: Callable[[str], None] = lambda _text: None) -> RankOutput | None:
    """Send fds 1 and 2 through a pipe to a relay process appending to ``path``; None when no
    pipe or process could be made (the rank then keeps the output it was given)."""
    try:
        rfd, wfd = os.pipe()
    except OSError:
        return None
    with contextlib.suppress(OSError):
        fcntl.fcntl(wfd, _F_SETPIPE_SZ, _PIPE_SIZE)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    rank_pid = os.getpid()
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
            _serve(rfd, path, rank_pid)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.dup2(wfd, 1)
    os.dup2(wfd, 2)
    os.close(wfd)
    return RankOutput(path, rfd, pid, on_note)  # rfd stays open here: no write fails with EPIPE


def main(argv: list[str]) -> None:
    """A relay started again by the rank: ``FD LOG RANK_PID``."""
    _serve(int(argv[0]), argv[1], int(argv[2]))
