"""Every path of a run directory, named once (docs/contracts.md, "The run directory").

The run dir is the contract between four kinds of process (``xl launch``, the supervisor, the
ranks, the viewers), so its names live here and nowhere else: a module that reads or writes a
file of a run asks :class:`RunLayout` for its path, and a module that lists a folder asks
:func:`log_rank`, :func:`record_rank` or :func:`spool_owner` what a name means. As torch
elastic's ``DefaultLogsSpecs.reify`` hands a worker group every path at once, ``RunLayout(run_dir)``
is one value that knows them all.

Standard library only, plus ``xl.wire`` (itself standard library only): the rank entry imports
this before the user's script, and under ``xl launch --python`` in an interpreter without xl's
dependencies. The spool's name is the one exception to "named here": ``xl.log``'s client writes
the spool and may not import the launcher (docs/architecture.md, "Layers"), so ``xl.wire`` names it
and this module re-exports it.
"""

from __future__ import annotations

import os
from pathlib import Path

from xl import wire

# -- the names (relative to the run dir) --------------------------------------------------
SPOOL = wire.SPOOL_DIR
RUN = "run.json"
EVENTS = "events.jsonl"
METRICS = "metrics.jsonl"
DIGEST = "digest.json"
COLLECTOR = "collector.json"
ESCAPED = "escaped.json"
SUPERVISOR_LOG = "supervisor.log"
STOP = "stop"  # `xl stop` before the supervisor took over (stopmark.py)
SETTLED = ".settled"  # whoever settles a run whose supervisor is gone (settle.py)
RESERVE = ".reserve"  # disk space the supervisor holds for the run's end (supervisor/journal.py)
# Its size: the final run.json and the last events. `xl launch` takes it before anything else of
# the run (control.py), so a disk without it refuses the run instead of losing its end.
RESERVE_BYTES = 1 << 20
LOGS = "logs"
RANKS = "ranks"
STACKS = "stacks"
TORCHRUN_LOG = "torchrun.log"  # in LOGS
NODES_STACKS_SOCKET = "nodes.stacks.json"  # in RANKS, node 0 of a multi-node run

# The folders ``xl launch`` makes with the run dir, before the supervisor starts.
MADE_FOLDERS = (LOGS, RANKS)
# The files it makes empty then, so a reader finds every one from the first poll.
MADE_FILES = (EVENTS, METRICS, SUPERVISOR_LOG)


def rank_log_name(rank: int) -> str:
    return f"rank-{rank}.log"


def rank_record_name(rank: int) -> str:
    return f"rank-{rank}.json"


def _number(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def _between(name: str, suffix: str) -> str:
    """What stands between ``rank-`` and ``suffix`` in ``name`` ("" when it is not such a name)."""
    return name[5 : -len(suffix)] if name.startswith("rank-") and name.endswith(suffix) else ""


def log_rank(name: str) -> int | None:
    """The rank whose log ``name`` (a file in ``logs/``) is; None for any other file."""
    return _number(_between(name, ".log"))


def record_rank(name: str) -> int | None:
    """The rank whose record ``name`` (a file in ``ranks/``) is; None for any other file (the one
    naming its stacks socket, ``rank-<r>.stacks.json``, included)."""
    return _number(_between(name, ".json"))


def spool_owner(name: str) -> tuple[int, int] | None:
    """(rank, pid) of the process that spooled ``name`` (a file in ``spool/``, or one claimed to
    replay); None for any other file."""
    rank, _, pid = _between(name.removesuffix(".replay"), ".jsonl").partition("-")
    owner = _number(rank), _number(pid)
    return (owner[0], owner[1]) if owner[0] is not None and owner[1] is not None else None


class RunLayout:
    """The paths of the run dir ``root``: ``RunLayout(run_dir).rank_log(3)``."""

    __slots__ = ("root",)

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"RunLayout({str(self.root)!r})"

    # -- the run's own files
    @property
    def run(self) -> Path:
        return self.root / RUN

    @property
    def events(self) -> Path:
        return self.root / EVENTS

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def digest(self) -> Path:
        return self.root / DIGEST

    @property
    def collector(self) -> Path:
        return self.root / COLLECTOR

    @property
    def escaped(self) -> Path:
        return self.root / ESCAPED

    @property
    def supervisor_log(self) -> Path:
        return self.root / SUPERVISOR_LOG

    @property
    def stop(self) -> Path:
        return self.root / STOP

    @property
    def settled(self) -> Path:
        return self.root / SETTLED

    # -- folders
    @property
    def logs(self) -> Path:
        return self.root / LOGS

    @property
    def ranks(self) -> Path:
        return self.root / RANKS

    @property
    def spool(self) -> Path:
        return self.root / SPOOL

    @property
    def stacks(self) -> Path:
        return self.root / STACKS

    # -- per rank, per process, per capture
    @property
    def torchrun_log(self) -> Path:
        return self.root / LOGS / TORCHRUN_LOG

    def rank_log(self, rank: int) -> Path:
        """What rank ``rank`` printed (its relay appends here)."""
        return self.root / LOGS / rank_log_name(rank)

    def rank_record(self, rank: int) -> Path:
        """What rank ``rank``'s entry reported of itself: pid, then exit code and traceback."""
        return self.root / RANKS / rank_record_name(rank)

    def rank_stacks_socket(self, rank: int) -> Path:
        """Where rank ``rank``'s stacks socket is described (pid, signal, socket name)."""
        return self.root / RANKS / f"rank-{rank}.stacks.json"

    def rank_stacks_text(self, rank: int) -> Path:
        """The file ``faulthandler`` writes rank ``rank``'s stacks to when Python cannot answer."""
        return self.root / RANKS / f"rank-{rank}.stacks.txt"

    @property
    def nodes_stacks_socket(self) -> Path:
        return self.root / RANKS / NODES_STACKS_SOCKET

    def spool_file(self, rank: int, pid: int) -> Path:
        """Where rank process ``pid`` spools lines while the collector cannot be reached."""
        return Path(wire.spool_file(str(self.root), rank, pid))

    def stacks_capture(self, t: float) -> str:
        """A hang's stacks document, relative to the run dir (events.jsonl's ``hang`` names it
        so)."""
        return f"{STACKS}/{int(t)}.json"

    def life_folders(self) -> tuple[Path, ...]:
        """Where a run leaves signs of life: its own files, and the folders its ranks and relays
        write in (settle.py reads their mtimes)."""
        return (self.root, self.logs, self.ranks, self.spool)
