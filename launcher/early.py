"""torchrun's start, overlapped with `xl launch`'s own (docs/launch.md, "torchrun starts first").

torchrun spends its first 1.5-2 s importing torch; `xl launch` spends ~60 ms after reading its
command line before it can say how torchrun must run (its imports, the GPU inventory, the plan,
the run dir). So, once the command line is read, the command forks the process that will
supervise the run, and that process at once starts the interpreter that will be torchrun: it
imports ``torch.distributed.run``, then waits on its stdin. When the run dir is made the command
hands it to the supervisor (``Early.hand_over``); the supervisor, where it would start torchrun,
sends the waiting interpreter its command line, environment, directory, log, umask and
open-files limit (``Waiting.go``), which it takes as its own before it runs torchrun's main.

For the run nothing changes: torchrun is the supervisor's child in the run's session, with the
command line ps shows, the environment (XL_RUN_ID from its start: the run's id is chosen before
the fork), directory, limits and log it would have had. What a running interpreter cannot take
on (the dynamic loader's and Python's own variables) must be as they were at its start, and its
command line must fit where the kernel keeps it; otherwise it is ended and torchrun starts as
before, as it does under --python, on several nodes and with ``XL_EARLY_TORCHRUN=0``. A launch
that stops before its run starts (a bad option, Ctrl-C) ends both processes before it exits.

The module's top level is the standard library's ``os`` and ``sys`` only: the waiting
interpreter imports it before torch.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from xl import envnames

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import NoReturn

# Read by the dynamic loader or Python at a process's start only: a waiting interpreter whose
# values differ cannot be made into the torchrun asked for.
_AT_START = ("LD_", "PYTHON", "GLIBC_TUNABLES", "MALLOC_")
_BOOT = "from xl.launcher.early import boot; boot()"


def wanted(env: Mapping[str, str]) -> bool:
    """Whether this machine and the person let torchrun start early (Linux, not switched off)."""
    return (
        env.get(envnames.EARLY_TORCHRUN, "1") != "0"
        and sys.platform.startswith("linux")
        and hasattr(os, "posix_spawn")
    )


class Early:
    """The command's side: the forked supervisor-to-be, waiting for its run dir on a pipe."""

    def __init__(self, pid: int, pipe: int, run_id: str) -> None:
        self.pid, self.pipe, self.run_id = pid, pipe, run_id

    @classmethod
    def start(cls, run_id: str) -> Early:
        """Fork the supervisor-to-be; it starts the waiting torchrun (whose environment holds
        XL_RUN_ID=``run_id``, as `xl stop` finds a run's processes) and imports what it will run."""
        from xl.procfs import hide_own_values  # noqa: PLC0415 - os only; the waiting torchrun never needs it

        hide_own_values("--env")  # `--env KEY=SECRET`: no process of the run shows the value in ps
        read, write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            os.close(read)
            return cls(pid, write, run_id)
        os.close(write)
        _supervisor_to_be(read, {**os.environ, "XL_RUN_ID": run_id})

    @property
    def open(self) -> bool:
        """Neither handed over nor abandoned yet."""
        return self.pipe >= 0

    def hand_over(self, run_dir: str) -> int:
        """The run dir is made: the supervisor-to-be becomes its supervisor. Returns its pid."""
        data = os.fsencode(run_dir)
        while data:
            data = data[os.write(self.pipe, data) :]
        os.close(self.pipe)
        self.pipe = -1
        return self.pid

    def abandon(self) -> None:
        """The run will not start: end both processes (no-op once handed over)."""
        if self.pipe < 0:
            return
        os.close(self.pipe)  # it sees the end of its pipe: it ends the waiting torchrun and exits
        self.pipe = -1
        try:
            os.killpg(self.pid, 9)  # sooner: it and torchrun are a process group (setsid)
        except OSError:
            pass  # not a group leader yet: the closed pipe ends it
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


class Waiting:
    """The supervisor's side: the interpreter waiting to become torchrun (Popen-like: pid,
    returncode; the supervisor reaps it as it reaps torchrun)."""

    def __init__(self, pid: int, pipe: int, room: int, env: dict[str, str]) -> None:
        self.pid, self.pipe, self.room, self.env = pid, pipe, room, env
        self.returncode: int | None = None

    def takes(self, argv: list[str], env: dict[str, str]) -> bool:
        """Whether it can run ``argv`` in ``env``: torchrun under this interpreter, the loader's
        and Python's variables as at its start, the command line within its argv area."""
        if argv[:3] != [sys.executable, "-m", "torch.distributed.run"]:
            return False
        if sum(len(os.fsencode(a)) + 1 for a in argv) > self.room:
            return False
        keys = {k for k in (*env, *self.env) if k.startswith(_AT_START)}
        return all(env.get(k) == self.env.get(k) for k in keys)

    def go(self, argv: list[str], *, cwd: str, env: dict[str, str], log: str, umask: int) -> bool:
        """Make it torchrun: ``argv`` in ``cwd`` with ``env``, its output appended to ``log``.
        False if it is gone (its import of torch failed, say): it is reaped, and the caller
        starts torchrun as before, which meets the same failure and logs it."""
        import json  # noqa: PLC0415 - the supervisor's loop has it loaded by now
        import resource  # noqa: PLC0415 - as json

        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)  # the supervisor raised its own
        msg = {"argv": argv, "cwd": cwd, "env": env, "log": log, "umask": umask, "nofile": list(nofile)}
        data = json.dumps(msg).encode()
        try:
            while data:
                data = data[os.write(self.pipe, data) :]
        except OSError:  # EPIPE: nobody reads
            self.end()
            return False
        os.close(self.pipe)
        self.pipe = -1
        return True

    def end(self) -> None:
        """Not needed after all: end it (and reap it)."""
        if self.pipe >= 0:
            os.close(self.pipe)
            self.pipe = -1
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _supervisor_to_be(read: int, env: dict[str, str]) -> NoReturn:
    """The forked child: its own session, the waiting torchrun, then the run dir or the end."""
    code = 1
    waiting: Waiting | None = None
    try:
        os.setsid()  # the run's session from the start: no terminal, no Ctrl-C from the shell
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        # Nothing of the command stays open here (a caller's pipe would not see its end).
        os.closerange(3, read)
        os.closerange(read + 1, 1 << 16)
        try:
            waiting = _spawn(env)
        except OSError:
            waiting = None  # torchrun starts as before
        # What the supervisor runs loads once the run dir comes, while torchrun still imports
        # torch: loaded now, it would take a core from the command and torchrun on a small machine.
        data = b""
        while chunk := os.read(read, 4096):
            data += chunk
        os.close(read)
        if data:
            from xl.launcher.control import serve  # noqa: PLC0415 - loaded above

            code = serve(os.fsdecode(data), waiting)
        else:
            code = 0  # the launch stopped before its run started
    finally:
        if waiting is not None and waiting.returncode is None and waiting.pipe >= 0:
            waiting.end()
        os._exit(code)


def _spawn(env: dict[str, str]) -> Waiting:
    """Start the interpreter that imports torchrun and waits: its stdin a pipe from here, its
    output kept in an unnamed file until it knows its log."""
    read, write = os.pipe()
    try:
        out = os.open(os.environ.get("TMPDIR") or "/tmp", os.O_TMPFILE | os.O_RDWR, 0o600)
    except (OSError, AttributeError):
        out = os.open(os.devnull, os.O_WRONLY)
    # Its argv area must hold torchrun's command line later (procfs.set_cmdline): room for ours
    # (the script and its arguments) and torchrun's options.
    room = 1024 + len(os.fsencode(" ".join(sys.argv))) + len(os.fsencode(sys.executable))
    argv = [sys.executable, "-c", _BOOT, " " * room]
    try:
        pid = os.posix_spawn(
            sys.executable,
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, read, 0),
                (os.POSIX_SPAWN_DUP2, out, 1),
                (os.POSIX_SPAWN_DUP2, out, 2),
            ],
            setsigdef=(13, 25),  # SIGPIPE, SIGXFSZ: as subprocess.Popen's restore_signals
        )
    finally:
        os.close(read)
        os.close(out)
    return Waiting(pid, write, sum(len(os.fsencode(a)) + 1 for a in argv), env)


def boot() -> None:
    """The waiting interpreter (``python -c`` of _BOOT): import torchrun, wait for what to run,
    take it on, run torchrun's main as ``python -m torch.distributed.run`` would."""
    debug = os.environ.get(envnames.DEBUG_TIMING)  # where the start's time went
    if debug:
        import time  # noqa: PLC0415 - debugging only

        os.write(2, f"{time.time():.3f} waiting torchrun: importing torch\n".encode())
    import torch.distributed.run as torchrun  # noqa: PLC0415 - the 1.5-2 s this module is for

    if debug:
        os.write(2, f"{time.time():.3f} waiting torchrun: torch imported\n".encode())
    data = b""
    while chunk := os.read(0, 65536):
        data += chunk
    if not data:
        os._exit(0)  # the launch stopped before its run started
    import json  # noqa: PLC0415 - torch has loaded it
    import resource  # noqa: PLC0415 - small, and only now needed

    msg = json.loads(data)
    log = os.open(msg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    offset = 0
    try:
        while chunk := os.pread(1, 65536, offset):  # what the import said (a warning) comes first
            os.write(log, chunk)
            offset += len(chunk)
    except OSError:
        pass  # /dev/null where no unnamed file could be made: nothing was kept
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    resource.setrlimit(resource.RLIMIT_NOFILE, tuple(msg["nofile"]))
    os.umask(msg["umask"])
    os.chdir(msg["cwd"])
    os.environ.clear()
    os.environ.update(msg["env"])
    from xl.procfs import set_cmdline  # noqa: PLC0415 - stdlib and ctypes, which torch loaded

    set_cmdline(msg["argv"])
    sys.argv = [torchrun.__file__, *msg["argv"][3:]]
    torchrun.main()
