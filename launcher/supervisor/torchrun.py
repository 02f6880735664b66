"""torchrun, the supervisor's child: its process, its exit code once reaped, the port its store
gets on one node, and what its log says of the ranks (who it closed, how each ended)."""

from __future__ import annotations

import re
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from xl import cgroup as xl_cgroup
from xl.address import LOOPBACK
from xl.launcher import runprocs
from xl.launcher.rundir.lastbytes import last_lines

# torchrun's failure summary: a rank and the exit code it saw.
_SUMMARY = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_CLOSED = re.compile(r"Sending process (\d+) closing signal")
# torchrun's word on the first failure it saw, as it sees it (before its summary, which a stop
# that outlasts the grace may never let it print).
_OBSERVED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: \d+ \(pid: (\d+)\)")


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


@dataclass(frozen=True)
class TorchrunLog:
    """logs/torchrun.log read for what torchrun says of its ranks; read afresh on each ask (it
    grows while the run ends)."""

    path: Path

    def text(self) -> str:
        try:
            return self.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def reported_exits(self, rank_of_pid: dict[int, int]) -> dict[int, int]:
        """Each rank's exit code as torchrun reported it: its summary's, else its first word on a
        failure it saw (which names the pid, ``rank_of_pid`` maps it)."""
        text = self.text()
        found = {int(m.group(1)): int(m.group(2)) for m in _SUMMARY.finditer(text)}
        for m in _OBSERVED.finditer(text):
            rank = rank_of_pid.get(int(m.group(2)))
            if rank is not None:
                found.setdefault(rank, int(m.group(1)))
        return found

    def closed_pids(self) -> frozenset[int]:
        """The pids torchrun itself sent its closing signal (after another rank's failure)."""
        return frozenset(int(m.group(1)) for m in _CLOSED.finditer(self.text()))

    def tail(self, lines: int = 25) -> str | None:
        """Its last non-blank lines (within its last 32 KiB), or None."""
        text = [ln.decode("utf-8", "replace") for ln in last_lines(self.path, 32768)]
        return "\n".join([ln for ln in text if ln.strip()][-lines:]) or None
