"""What is known of a dead rank (``Evidence``), and what every cause is made of: the reading's
kind as a ``Cause``, and the same launch again with a variable set (docs/launch.md, "Why a rank
died")."""

from __future__ import annotations

import shlex
import signal
from dataclasses import dataclass, field

from xl.launcher.causes import words
from xl.launcher.rundir.outcome import Cause, CauseKind


@dataclass(frozen=True)
class Evidence:
    """What is known of a rank that died, for ``explain``."""

    rank: int | None
    exit_code: int | None  # negative: the signal; None: unknown (it vanished)
    error: str | None = None  # its exception as Python prints it (possibly several lines)
    traceback: str | None = None
    log_tail: list[str] = field(default_factory=list)  # its last lines of output
    pids: set[int] = field(default_factory=set)  # the rank's process (and its children, when known)
    python: str = "python"  # the ranks' interpreter
    cwd: str | None = None  # where the ranks ran
    script: str | None = None  # the script as given, or None for -m
    module: str | None = None  # -m MODULE
    launch_args: list[str] | None = None  # this run's `xl launch` arguments (for a rerun line)
    hang: str | None = None  # xl's own hang verdict, when it said one
    vanished: bool = False  # gone without a word (a signal xl did not send)
    cgroup: str | None = None  # the run's memory cgroup, when it has one (its OOM kills)
    died_at: float | None = None  # unix time it was last seen alive (None: now)


def rerun(ev: Evidence, env: str) -> str | None:
    """The same launch again with ``env`` set (``xl launch --env K=V ...``)."""
    if ev.launch_args is None:
        return None
    return shlex.join(["xl", "launch", "--env", env, *ev.launch_args])


def signame(code: int | None) -> str:
    if code is None:
        return "a signal"
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def cause(
    found: words.Found, summary: str, fix: str | None, more: list[str] | None = None
) -> Cause:
    """The kind ``found`` as a cause: its lines, then ``more``."""
    return Cause(CauseKind(found.kind), summary, fix, [*found.evidence, *(more or [])])
