"""How a rank and a run came out: a rank's ``state``, the one rule that decides it, and the run's
``failure`` (docs/contracts.md, "run.json").

Four parts of xl decide a rank's outcome: the supervisor as each rank ends and as the run ends,
whoever settles a run whose supervisor is gone (``settle``), and the reader that viewers draw from.
They all apply :func:`rank_outcome`, so a rank reads the same in run.json, in the Monitor and in
``xl runs``. Pure, standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum


class RankPhase(str, Enum):
    """A rank's ``state`` in run.json: starting and running while it lives, then its outcome."""

    STARTING = "starting"  # torchrun is starting it; it has not reported itself yet
    RUNNING = "running"  # it reported its pid
    EXITED = "exited"  # its outcome: exit code 0
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def done(self) -> bool:
        """It has its outcome: exited, failed or stopped."""
        return self.value in DONE_STATES


DONE_STATES = frozenset({RankPhase.EXITED.value, RankPhase.FAILED.value, RankPhase.STOPPED.value})
LIVE_STATES = frozenset({RankPhase.STARTING.value, RankPhase.RUNNING.value})


def rank_outcome(
    exit_code: int | None, *, stopped: bool, recorded: object = None, blamed: bool = True
) -> RankPhase:
    """The outcome of a rank that ended, or that the run's end leaves without an end of its own.

    - ``exit_code``: how its process ended (negative: killed by that signal), None when unknown
      (it vanished, or it never started);
    - ``stopped``: xl was stopping it (``xl stop``, Ctrl-C, a signal xl sent it, the run's stop);
    - ``recorded``: the outcome already written for it (run.json's ``state``), if any;
    - ``blamed``: False when another rank is the run's root cause (``failure.rank``), so this one
      was ended because of it.

    The rule, first match wins:

    1. exit code 0: ``exited``, whatever else was said of it;
    2. an outcome already recorded (``exited``, ``failed``, ``stopped``) stands: whoever wrote it
       knew more (the supervisor saw the signal it sent, torchrun's summary);
    3. stopped, or not to blame: ``stopped``;
    4. else ``failed``.

    A rank still running has no outcome: this is only asked once it ended or the run did.
    """
    if exit_code == 0:
        return RankPhase.EXITED
    if isinstance(recorded, str) and recorded in DONE_STATES:
        return RankPhase(recorded)
    if stopped or not blamed:
        return RankPhase.STOPPED
    return RankPhase.FAILED


class CauseKind(str, Enum):
    """Why a rank died: ``failure.cause.kind`` (docs/contracts.md, "The cause object")."""

    MODULE_NOT_FOUND = "module_not_found"
    USAGE_ERROR = "usage_error"
    FILE_NOT_FOUND = "file_not_found"
    CUDA_OOM = "cuda_oom"
    HOST_OOM = "host_oom"
    SHM_FULL = "shm_full"
    SEGFAULT = "segfault"
    KILLED = "killed"
    NCCL_ERROR = "nccl_error"
    COLLECTIVE_TIMEOUT = "collective_timeout"
    NO_KERNEL_IMAGE = "no_kernel_image"
    DEVICE_BUSY = "device_busy"
    CUDA_ERROR = "cuda_error"
    PORT_IN_USE = "port_in_use"
    EXCEPTION = "exception"


@dataclass
class Cause:
    """Why the root-cause rank died, in words a person can act on: ``summary`` one line,
    ``fix`` a command or one exact change (None when none is known: never a guess), ``evidence``
    what it was read from (log lines, the signal, a kernel message)."""

    kind: CauseKind
    summary: str
    fix: str | None = None
    evidence: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "summary": self.summary,
            "fix": self.fix,
            "evidence": list(self.evidence),
        }

    @classmethod
    def from_json(cls, data: object) -> Cause | None:
        """A stored ``cause``; None when it is missing or not one (an unknown kind reads as
        ``exception``: kinds may be added, a reader must not break on them)."""
        if not isinstance(data, Mapping):
            return None
        summary = data.get("summary")
        if not isinstance(summary, str):
            return None
        try:
            kind = CauseKind(data.get("kind"))
        except ValueError:
            kind = CauseKind.EXCEPTION
        fix = data.get("fix")
        evidence = data.get("evidence")
        lines = [str(x) for x in evidence] if isinstance(evidence, list) else []
        return cls(kind, summary, fix if isinstance(fix, str) else None, lines)


@dataclass
class Failure:
    """run.json's ``failure``: the run's root cause, the first rank to fail (``rank`` None when no
    rank is to blame: torchrun died, a node was lost). ``host`` is the machine's name and
    ``node_rank`` xl's number of that node; in JSON the host's key is ``node``."""

    rank: int | None  # None: no rank to blame
    exit_code: int | None  # negative: killed by that signal
    traceback: str | None  # the rank's Python traceback, else its last lines of output
    error: str | None  # the traceback's last line
    message: str  # one line for people
    host: str | None
    node_rank: int | None
    cause: Cause | None = None  # why, in words a person can act on (``xl.launcher.causes``)

    def to_json(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "exit_code": self.exit_code,
            "traceback": self.traceback,
            "error": self.error,
            "message": self.message,
            "node": self.host,
            "node_rank": self.node_rank,
            "cause": self.cause.to_json() if self.cause is not None else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Failure:
        """run.json's (or a node frame's) ``failure``; a value of the wrong type reads as None."""
        ints = {
            k: v if isinstance(v, int) and not isinstance(v, bool) else None
            for k, v in _values(data, "rank", "exit_code", "node_rank")
        }
        texts = {
            k: v if isinstance(v, str) else None
            for k, v in _values(data, "traceback", "error", "node")
        }
        return cls(
            ints["rank"],
            ints["exit_code"],
            texts["traceback"],
            texts["error"],
            str(data.get("message") or ""),
            texts["node"],
            ints["node_rank"],
            Cause.from_json(data.get("cause")),
        )


def _values(data: Mapping[str, object], *keys: str) -> list[tuple[str, object]]:
    return [(k, data.get(k)) for k in keys]
