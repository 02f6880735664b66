"""torchrun started before its plan is ready (docs/launch.md, "How a launch starts").

torchrun's own start is its interpreter importing torch (~1.5 s); xl's part before it is the
command's imports, the plan, the checks and the run dir (~0.1 s). Done one after the other, xl's
part adds to every launch. So `xl launch` forks its supervisor as soon as it has parsed the
command line, and the supervisor at once starts torchrun's interpreter with ``BOOT``: it imports
torch while the command plans, then waits on a pipe. If the run starts, the supervisor writes it
torchrun's arguments, the run's environment, its folder and umask; it then runs torchrun's main
exactly as ``python -m torch.distributed.run`` would, as the supervisor's child, with its output
in logs/torchrun.log. If the launch stops before (a bad option, a busy port, Ctrl-C), the pipe
closes and the interpreter ends without having run anything.

It started with the environment the run will have, less what only the plan and the supervisor
decide (``LATE``: the GPUs, xl's own variables, which nothing reads while torch imports). When
anything else differs (``--python``'s PYTHONPATH), it is ended and torchrun starts as a new
process, as before. The interpreter is the one the plan names; BOOT uses only the standard
library and torch, so it runs in a ``--python`` environment without xl too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from xl import envnames

TORCHRUN = ("-m", "torch.distributed.run")

# Set once the plan is ready (os.environ, so the ranks torchrun starts get them); read by torch
# at run time only: CUDA_* when CUDA starts, the store switch (xl.launcher.plan.NO_SHARED_STORE)
# at the rendezvous.
LATE = frozenset(
    {
        *envnames.RUN_VARS,
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "ACCELERATE_MIXED_PRECISION",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    }
)

# argv[1] is the pipe's fd. An import that failed is told in logs/torchrun.log once the run
# starts, as `python -m torch.distributed.run` would have told it. Once it runs, ``ps`` shows
# torchrun's command line, written over this one's (as xl.procfs.set_cmdline does).
BOOT = """\
import ctypes, json, os, sys, traceback
ctl = int(sys.argv[1])
failed = None
try:
    import torch.distributed.run
    del sys.modules["torch.distributed.run"]  # loaded again below, as __main__
except BaseException:
    failed = traceback.format_exc()
def retitle(args):
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        start, end = int(fields[45]), int(fields[46])
        raw = b"\\0".join(os.fsencode(a) for a in args)[:end - start - 1]
        ctypes.memmove(start, raw.ljust(end - start, b"\\0"), end - start)
    except (OSError, ValueError, IndexError):
        pass
data = b""
while True:
    chunk = os.read(ctl, 1 << 16)
    if not chunk:
        break
    data += chunk
os.close(ctl)
if not data:
    os._exit(0)
go = json.loads(data)
out = os.open(go["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
os.dup2(out, 1)
os.dup2(out, 2)
os.close(out)
if failed:
    sys.stderr.write(failed)
    sys.stderr.flush()
    os._exit(1)
os.umask(go["umask"])
os.chdir(go["cwd"])
os.environ.clear()
os.environ.update(go["env"])
retitle(go["cmdline"])
sys.argv = [sys.argv[0], *go["args"]]
import runpy
runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
"""


class WarmTorchrun:
    """torchrun's interpreter, importing torch ahead of the run it will be (the supervisor's child)."""

    def __init__(
        self, proc: subprocess.Popen[bytes], ctl: int, python: str, env: Mapping[str, str]
    ) -> None:
        self.proc = proc
        self.ctl = ctl
        self.python = python
        self.env = dict(env)

    @classmethod
    def start(cls, python: str, env: Mapping[str, str]) -> WarmTorchrun | None:
        """None when it cannot start: torchrun then starts the usual way, and says why if it fails too."""
        rfd, wfd = os.pipe()
        try:
            proc = subprocess.Popen(
                [python, "-c", BOOT, str(rfd)],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(rfd,),
            )
        except OSError:
            os.close(wfd)
            return None
        finally:
            os.close(rfd)
        return cls(proc, wfd, python, env)

    def fits(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        """The run's torchrun is this interpreter's, in this environment (less ``LATE``)."""
        if list(argv[:3]) != [self.python, *TORCHRUN]:
            return False
        return all(
            env.get(key) == self.env.get(key) for key in (env.keys() | self.env.keys()) - LATE
        )

    def go(
        self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], log: Path, umask: int
    ) -> subprocess.Popen[bytes]:
        """Run torchrun with ``argv``'s arguments: its process from here on."""
        message = json.dumps(
            {"args": list(argv[3:]), "cmdline": list(argv), "cwd": cwd, "env": dict(env), "log": str(log), "umask": umask}
        ).encode()
        try:
            view = memoryview(message)
            while view:
                view = view[os.write(self.ctl, view) :]
        finally:
            os.close(self.ctl)
            self.ctl = -1
        return self.proc

    def discard(self) -> None:
        """End it unused: it has run nothing but imports."""
        if self.ctl >= 0:
            os.close(self.ctl)
            self.ctl = -1
        with contextlib.suppress(OSError):
            self.proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
