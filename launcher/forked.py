"""The supervisor as a forked copy of `xl launch` (docs/launch.md, "How a launch starts").

A fork saves a Python start and the imports; only for callers without threads (the child of a
threaded process may inherit a held lock). ``fork_supervisor`` forks it for a run dir that is
made. A one-node ``xl launch`` forks it earlier, as soon as its command line is parsed
(``fork_early_supervisor``): the supervisor at once starts torchrun's interpreter
(xl.launcher.supervisor.warm), which imports torch while the command imports the rest of itself,
plans and checks; then it waits for its run dir. ``EarlySupervisor.start`` gives it that;
``cancel``, or the command's end without a run (a bad option, Ctrl-C), ends both.

Light on purpose: what `xl launch` imports before the early fork delays torchrun by as much.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from xl import envnames, paths
from xl.launcher.rundir.layout import RunLayout, new_run_id
from xl.procfs import hide_values, set_cmdline

if TYPE_CHECKING:
    from xl.launcher.spec import LaunchSpec
    from xl.launcher.supervisor.warm import WarmTorchrun

_CANCEL_WAIT_S = (
    5.0  # the supervisor's end after a cancel: its torchrun interpreter is killed, nothing more
)


class ForkedSupervisor:
    """The Popen-like handle of a supervisor started by fork (poll() reaps it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = 0
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def fork_supervisor(run_dir: Path) -> ForkedSupervisor:
    """Fork the supervisor of the run in ``run_dir`` (made already)."""
    before_fork()
    pid = os.fork()
    if pid:
        return ForkedSupervisor(pid)
    become_supervisor(run_dir)


def become_supervisor(
    run_dir: Path, warm: WarmTorchrun | None = None, *, detached: bool = False
) -> NoReturn:
    """The forked child from here on: the run's supervisor, until its end (``detached``: by
    ``detach`` already)."""
    code = 1
    try:
        if not detached:
            detach(run_dir)
        log = os.open(
            RunLayout(run_dir).supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.chdir(run_dir)
        sys.argv = [sys.executable, "-m", "xl.launcher.supervisor", str(run_dir)]
        from xl.launcher.supervisor.loop import main as supervisor_main  # noqa: PLC0415 - only the forked child runs the supervisor; `xl stop`/`xl attach` must not load it

        code = supervisor_main([str(run_dir)], warm)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(2, f"xl supervisor: crashed: {exc!r}\n".encode("utf-8", "replace"))
        with contextlib.suppress(BaseException):
            import traceback  # noqa: PLC0415 - a crash only: `xl launch` forks before it would load

            traceback.print_exc()
    finally:
        os._exit(code)


def before_fork() -> None:
    """Nothing buffered is printed twice; `xl launch --env KEY=SECRET`: neither this process nor
    its fork may show the value in ps."""
    sys.stdout.flush()
    sys.stderr.flush()
    set_cmdline(hide_values(_own_cmdline(), "--env"))


def _own_cmdline() -> list[str]:
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            return [a.decode("utf-8", "replace") for a in fh.read().rstrip(b"\0").split(b"\0")]
    except OSError:
        return list(sys.argv)


def detach(run_dir: Path, keep: int = -1) -> None:
    """A forked supervisor's own session: no terminal, no Ctrl-C, no SIGHUP from the shell, and
    nothing of the launching process open but ``keep`` (a caller's pipe would not see EOF until
    the run ends)."""
    os.setsid()
    # A fork keeps `xl launch`'s argv: show what this process is instead.
    set_cmdline([os.path.basename(sys.executable), "-m", "xl.launcher.supervisor", str(run_dir)])
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    if keep >= 3:
        os.closerange(3, keep)
        os.closerange(keep + 1, 1 << 16)
    else:
        os.closerange(3, 1 << 16)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    # As a fresh interpreter has it: a peer that vanished is an EPIPE error, not a death.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


class EarlySupervisor:
    """The forked supervisor, waiting for its run dir."""

    def __init__(self, pid: int, go_fd: int, run_id: str) -> None:
        self.pid = pid
        self.go_fd = go_fd
        self.run_id = run_id

    def start(self, run_dir: Path) -> ForkedSupervisor:
        """Its run dir is made: it supervises that run from now on."""
        go_fd, self.go_fd = self.go_fd, -1
        try:
            os.write(go_fd, os.fsencode(run_dir))
        finally:
            os.close(go_fd)
        return ForkedSupervisor(self.pid)

    def cancel(self) -> None:
        """No run: it ends its torchrun interpreter and itself (waited for, bounded). Nothing
        once ``start`` gave it its run."""
        if self.go_fd < 0:
            return
        os.close(self.go_fd)
        self.go_fd = -1
        deadline = time.monotonic() + _CANCEL_WAIT_S
        try:
            while os.waitpid(self.pid, os.WNOHANG)[0] == 0:
                if time.monotonic() > deadline:
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    return
                time.sleep(0.002)
        except (ChildProcessError, ProcessLookupError):
            pass


def fork_early_supervisor(spec: LaunchSpec) -> EarlySupervisor:
    """Fork the run's supervisor now (single-threaded callers only: ``xl launch``).

    The run's id is chosen here: torchrun's interpreter carries it in its environment from its
    start, as every process of a run does (``xl stop`` finds them by it)."""
    run_id = new_run_id(spec)
    run_dir = paths.runs_dir() / run_id
    before_fork()
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(rfd)
        return EarlySupervisor(pid, wfd, run_id)
    warm = None
    try:
        os.close(wfd)
        detach(run_dir, keep=rfd)
        signal.signal(
            signal.SIGHUP, signal.SIG_IGN
        )  # as torchrun would get it from the supervisor's own signals
        from xl.launcher.supervisor.warm import WarmTorchrun  # noqa: PLC0415 - only this forked child starts one

        env = dict(os.environ)
        env.update(spec.env)
        env.update(
            {
                envnames.RUN_ID: run_id,
                envnames.RUN_DIR: str(run_dir),
                envnames.SUPERVISOR_PID: str(os.getpid()),
            }
        )
        warm = WarmTorchrun.start(spec.python or sys.executable, env)
        given = b""
        while chunk := os.read(rfd, 4096):
            given += chunk
        os.close(rfd)
    except BaseException:
        if warm is not None:
            warm.discard()
        os._exit(1)
    if given != os.fsencode(run_dir):  # the launch ended before its run
        if warm is not None:
            warm.discard()
        os._exit(0)
    become_supervisor(run_dir, warm, detached=True)
