"""The run's root cause: which rank failed first and why, in run.json's ``failure``.

The first failing rank is the cause; the ranks that die after it (their peers are gone) are not.
Why, best first: the rank's Python traceback (from its record), its error line, else its last
log lines (sys.exit(2) from argparse, os._exit, a C++ abort leave no exception). A rank killed by
a signal gets its exit code from torchrun's own failure summary at the end. ``failure.rank`` is
null when no rank is to blame (torchrun itself died or could not start them). In a multi-node
run the earliest failure of any node wins (see ``hub``); it also names ``node`` and ``node_rank``.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xl.launcher.rundir.lastbytes import last_lines
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.outcome import Failure, rank_outcome
from xl.launcher.rundir.record import RunStatus
from xl.launcher.supervisor.journal import Journal
from xl.launcher.supervisor.ranks import Ranks, RankState, describe_exit, signal_name

_STOP_CODES = (-signal.SIGTERM, -signal.SIGKILL)
# What input() and pdb (breakpoint()) raise in a rank, whose stdin is /dev/null.
NO_STDIN_ERRORS = ("EOFError: EOF when reading a line", "bdb.BdbQuit")
NO_STDIN = "ranks have no stdin: input() and breakpoint() cannot read the terminal under xl launch (docs/launch.md)"
_SUMMARY = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def tail(path: Path, lines: int, limit: int, skip_blank: bool = False) -> list[str]:
    """The last ``lines`` lines of the file within its last ``limit`` bytes ([] when unreadable)."""
    text = [ln.decode("utf-8", "replace") for ln in last_lines(path, limit)]
    if skip_blank:
        text = [ln for ln in text if ln.strip()]
    return text[-lines:]


class RootCause:
    """The run's failure and when it happened (any node's clock, to find the first one)."""

    def __init__(self, run_dir: Path, host: str, node_rank: int, journal: Journal) -> None:
        self.run_dir = run_dir
        self.host = host
        self.node_rank = node_rank
        self.journal = journal
        self.failure: Failure | None = None
        self.at: float | None = None
        self.remote = False  # another node's failure, adopted: not sent back

    def to_json(self) -> dict[str, Any] | None:
        return self.failure.to_json() if self.failure is not None else None

    def local(self, rank: int | None, exit_code: int | None, traceback: str | None, error: str | None, message: str) -> Failure:
        """A failure of this node."""
        return Failure(rank, exit_code, traceback, error, message, self.host, self.node_rank)

    def set(self, failure: Failure, at: float) -> None:
        self.failure, self.at = failure, at
        self.journal.changed()
        if not self.remote:
            self.journal.send({"type": "failure", "failure": failure.to_json(), "at": at})

    def blame_rank(self, st: RankState, drain: Callable[[int], None]) -> Failure:
        """``st`` failed first: it is the run's cause."""
        what = st.error or (describe_exit(st.rank, st.exit_code) if st.exit_code is not None else "died")
        if st.after_script:
            what += " after its script had returned"
        message = f"rank {st.rank} failed first: {what}"
        if st.error in NO_STDIN_ERRORS:
            message += f" ({NO_STDIN})"
        traceback = st.traceback
        if traceback is None and st.error is None:
            # No Python exception to show (sys.exit(2) from argparse, os._exit, a C++ abort):
            # the rank's last words are the best explanation there is (its log, as its relay
            # wrote it).
            drain(st.rank)
            traceback = self._log_tail(st.rank)
            last = traceback.strip().splitlines()[-1].strip() if traceback and traceback.strip() else ""
            if last:
                message += f": {last[:200]}"
        # When it happened, to compare with other nodes' failures: a killed rank died between
        # the last time it was seen running and now.
        at = (st.alive_at if st.vanished else None) or st.ended_at or time.time()
        failure = self.local(st.rank, st.exit_code, traceback, st.error, message)
        self.set(failure, at)
        return failure

    def torchrun_died(self, code: int | None) -> Failure:
        """torchrun ended while ranks ran (killed): no rank to blame."""
        desc = signal_name(code) if code is not None and code < 0 else f"code {code}"
        failure = self.local(None, code, None, None, f"torchrun ended ({desc}) while ranks were running")
        self.set(failure, time.time())
        return failure

    def conclude(
        self, stop_requested: bool, torchrun_code: int | None, barrier_ended: bool, ranks: Ranks, drain: Callable[[int], None] = lambda rank: None
    ) -> RunStatus:
        """The run's final status; a failure nobody explained yet gets its cause here."""
        if stop_requested:
            return RunStatus.STOPPED
        if self.failure is not None:
            return RunStatus.FAILED
        if (torchrun_code == 0 or barrier_ended) and all(st.exit_code in (0, None) for st in ranks):
            return RunStatus.SUCCEEDED
        bad = [st for st in ranks if st.exit_code not in (0, None)]
        first = min(bad, key=lambda s: s.ended_at or 0.0) if bad else None
        if first is not None and first.after_script:
            failure = self.blame_rank(first, drain)
            self.journal.emit({"kind": "failure", "rank": first.rank, "exit_code": first.exit_code, "message": failure.message})
            return RunStatus.FAILED
        self.failure = self.local(
            first.rank if first else None,
            first.exit_code if first else torchrun_code,
            # No rank to blame (e.g. torchrun could not start them): torchrun's own last words.
            first.traceback if first else self._torchrun_tail(),
            first.error if first else None,
            f"torchrun exited with code {torchrun_code} (see logs/torchrun.log)",
        )
        self.at = (first.ended_at if first else None) or time.time()
        return RunStatus.FAILED

    def fill_from_torchrun_log(
        self, ranks: Ranks, emit: Callable[[dict[str, Any]], None], torchrun_code: int | None = None, drain: Callable[[int], None] = lambda rank: None
    ) -> None:
        """Exit codes of ranks killed by a signal, from torchrun's own failure summary; also of a
        rank whose script ended well but whose process did not (``RankState.after_script``)."""
        if torchrun_code == 0 and all(st.exit_code is not None for st in ranks):
            return
        try:
            text = RunLayout(self.run_dir).torchrun_log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return
        found = {int(m.group(1)): int(m.group(2)) for m in _SUMMARY.finditer(text)}
        for rank, code in found.items():
            st = ranks.get(rank)
            if st is None:
                continue
            if st.exit_code is None:
                st.exit_code = code
            elif st.exit_code == 0 and code not in (0, *_STOP_CODES) and not st.after_script:
                # Its script returned (the entry recorded 0), then its process died: an abort in
                # the interpreter's teardown, such as a process group's thread never joined
                # ("terminate called without an active exception"). torchrun saw the real end.
                st.exit_code, st.after_script = code, True
                st.state = rank_outcome(code, stopped=False)
        # torchrun's own "Root Cause" is the first failure *it* observed, often a rank it had
        # just terminated itself; the supervisor's order is kept. Only when the blamed rank
        # turns out to have died of a stop signal is another rank's real failure preferred.
        failure = self.failure
        if failure is None or failure.exit_code is not None or failure.rank is None:
            return
        blamed = ranks.get(int(failure.rank)) if failure.node_rank == self.node_rank else None
        if blamed is None:
            return  # another node's rank: that node explained it
        real = [st for st in ranks if st.exit_code not in (None, 0, *_STOP_CODES)]
        if blamed.exit_code in _STOP_CODES and real:
            blamed.state = rank_outcome(blamed.exit_code, stopped=False, blamed=False)
            blamed = min(real, key=lambda st: st.ended_at or 0.0)
            blamed.state = rank_outcome(blamed.exit_code, stopped=False)
        # The first failure event lacked the signal (or named a rank torchrun had terminated).
        failure = self.blame_rank(blamed, drain)
        emit({"kind": "failure", "rank": blamed.rank, "exit_code": blamed.exit_code, "message": failure.message})

    def _log_tail(self, rank: int, lines: int = 15, limit: int = 8192) -> str | None:
        """The end of logs/rank-<rank>.log (what this supervisor has written of it so far)."""
        found = tail(RunLayout(self.run_dir).rank_log(rank), lines, limit)
        return "\n".join(found) + "\n" if found else None

    def _torchrun_tail(self, lines: int = 25) -> str | None:
        found = tail(RunLayout(self.run_dir).torchrun_log, lines, 32768, skip_blank=True)
        return "\n".join(found) or None
