"""A run's cgroup on this node at the run's end: ended and removed by whoever ends the run
(docs/launch.md, "A run's cgroup"). The cgroup itself is ``xl.cgroup``'s; ``xl launch`` makes
it (``launcher/control.py``) and the supervisor starts torchrun in it.

Whoever ends a run ends its cgroup: the supervisor in ``finish``; ``xl stop`` or any later xl
command that settles a run whose supervisor is gone (``launcher/rundir/settle.py``). A rank that
settles its own run is inside the cgroup, where it can neither end torchrun (its parent, still
waiting for it) nor remove the cgroup: it starts ``python -m xl.launcher.runcgroup`` outside it,
which waits for that rank and torchrun to be gone and then ends the rest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from xl import cgroup, envnames
from xl.launcher import runprocs
from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.runrecord import RunRecord

# What the launch says where no cgroup could be made: how the run is kept together instead.
FALLBACK = "its processes are followed by their process tree and environment instead"
# the settling rank and torchrun end within this (torchrun: about 3 s on a busy machine)
_FINISHER_WAIT_S = 60.0


def end(rec: RunRecord, grace: float) -> None:
    """End what is left in the run's cgroup (SIGTERM, SIGKILL after ``grace``), remove it, and
    say so in ``rec`` (``ended_in_cgroup``, ``cgroup_memory``). Once: a record that says it
    already is left alone."""
    path = rec.cgroup
    if path is None or "ended_in_cgroup" in rec.data:
        return
    ended = cgroup.end(path, grace)
    used = cgroup.memory(path)  # after the end: what the kernel killed for memory counts too
    cgroup.remove(path)
    rec.update(ended_in_cgroup=ended)
    if used is not None:
        rec.update(cgroup_memory={k: v for k, v in used.items() if k != "current"})


def end_named(run_id: str, grace: float) -> int:
    """A run whose run.json cannot be read: its cgroups (every node's made here) found by name
    where this process would make them, ended and removed; how many processes were ended."""
    parent = cgroup.find_place().parent
    name = cgroup.run_name(run_id)
    if parent is None:
        return 0
    try:
        found = [n for n in os.listdir(parent) if n == name or n.startswith(name + ".node")]
    except OSError:
        return 0
    ended = 0
    for n in found:
        ended += cgroup.end(os.path.join(parent, n), grace)
        cgroup.remove(os.path.join(parent, n))
    return ended


def end_settled(run_dir: Path, rec: RunRecord, grace: float) -> None:
    """The cgroup's end for a run being settled: here, or, when this process is in it (a rank),
    by a process of its own started outside it."""
    path = rec.cgroup
    if path is None or "ended_in_cgroup" in rec.data:
        return
    try:
        if cgroup.holds(path, os.getpid()):
            _finish_later(run_dir, path, rec)
        else:
            end(rec, grace)
    except Exception as exc:  # the run's outcome is what settling is for: written all the same
        rec.update(cgroup_reason=f"its cgroup could not be ended: {exc!r}")


def _finish_later(run_dir: Path, path: str, rec: RunRecord) -> None:
    """Start ``python -m xl.launcher.runcgroup`` outside the cgroup, in a session of its own and
    without the run's variables (no process of the run), to end it after this one."""
    env = {k: v for k, v in os.environ.items() if k not in envnames.RUN_VARS}
    torchrun = rec.data.get("torchrun_pid")
    wait = [str(os.getpid())] + ([str(torchrun)] if type(torchrun) is int else [])
    try:
        subprocess.Popen(
            [sys.executable, "-m", "xl.launcher.runcgroup", str(run_dir), *wait],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            env=env,
            preexec_fn=cgroup.leave(path),  # one write of its pid, no lock taken
        )
    except OSError:
        pass  # the next xl command that reads the run ends it (``end_settled``)


def main(argv: list[str]) -> int:
    """``python -m xl.launcher.runcgroup RUN_DIR PID...``: once the PIDs are gone (the rank
    that settled the run, torchrun), end the run's cgroup and record it."""
    if len(argv) < 1:
        print("usage: python -m xl.launcher.runcgroup RUN_DIR [PID ...]", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    waits = [int(a) for a in argv[1:] if a.isdigit()]
    deadline = time.monotonic() + _FINISHER_WAIT_S
    while any(runprocs.alive(p) for p in waits) and time.monotonic() < deadline:
        time.sleep(0.05)
    rec = record.load(run_dir)
    if rec is None or rec.cgroup is None or "ended_in_cgroup" in rec.data:
        return 0
    end(rec, rec.grace_s if rec.grace_s is not None else 1.0)
    record.save(run_dir, rec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
