"""torchrun, the supervisor's child: its process, its exit code once reaped, and the port its
store gets on one node."""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from xl import cgroup as xl_cgroup
from xl.address import LOOPBACK
from xl.launcher import runprocs


@dataclass
class Torchrun:
    """torchrun, the supervisor's child: its process and, once reaped, its exit code."""

    proc: subprocess.Popen[bytes] | None = None
    code: int | None = None
    held_port: socket.socket | None = None  # its store's port on one node, until the store binds it

    @property
    def running(self) -> bool:
        return self.proc is not None and self.code is None

    def start(
        self,
        argv: list[str],
        *,
        cwd: str | None,
        env: dict[str, str],
        log: Path,
        umask: int,
        cgroup: str | None = None,
    ) -> list[str]:
        """Start it: no stdin, its own output appended to ``log`` (logs/torchrun.log), in the
        run's ``cgroup`` when it has one (entered between fork and exec: nothing of it runs
        outside). Returns the command started: a one-node plan's with the port held for its
        store (hold_master_port)."""
        argv, self.held_port = hold_master_port(list(argv))
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd or None,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                close_fds=True,
                umask=umask,  # the run dir is private; the training's own files are not
                # one write of its pid, no lock taken: safe in a forked child with threads
                preexec_fn=None if cgroup is None else xl_cgroup.enter(cgroup),
            )
        return argv

    def signal(self, sig: int) -> None:
        """Signal it while it runs (after its end the pid may be another process's)."""
        if self.proc is not None and self.code is None:
            runprocs.signal_pid(self.proc.pid, sig)


def hold_master_port(argv: list[str]) -> tuple[list[str], socket.socket | None]:
    """``argv`` with a one-node plan's HELD_PORT replaced by a free loopback port, and the socket
    that holds it (bound with SO_REUSEADDR, never listening: torchrun's store, which sets it too,
    may bind the port; a program without it may not). Other plans: as they are, and None."""
    # torchrun's own options come before --max-restarts (xl.launcher.plan): not the script's.
    own = argv[: argv.index("--max-restarts")] if "--max-restarts" in argv else argv
    if "--master-port" not in own[:-1] or LOOPBACK not in own:
        return argv, None
    i = own.index("--master-port")
    # plan.HELD_PORT (not imported: the plan's imports are not the supervisor's)
    if own[i + 1] != "0":
        return argv, None
    sock = socket.socket(socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((LOOPBACK, 0))
    except OSError:
        sock.close()
        raise
    return [*argv[: i + 1], str(sock.getsockname()[1]), *argv[i + 2 :]], sock
