"""The run's root cause: which rank died first and why, in run.json's ``failure`` and its one
``failure`` event (docs/launch.md, "Why a rank died").

The first rank to die is the cause; the ranks that die after it (their peers are gone) are not.
A failed rank makes a *suspect* at once (the loop starts the stop), and the cause is *decided*
when the facts are in, within a few seconds:
- a rank gone without a word (killed: no exit record) waits for its signal (its zombie,
  torchrun's first report or its summary): the failure is decided with it, so its one event and
  run.json say the same exit; it died when it was last seen alive, so it beats the ranks whose
  collectives then broke ("Connection reset by peer", gloo's "Connection closed by peer", NCCL's
  remote errors, a watchdog's timeout): such a peer's loss is never the cause while a rank that
  died is known;
- ranks torchrun itself ended ("Sending process N closing signal") and ranks xl stopped are
  not causes.
Why: ``xl.launcher.causes`` reads the rank's error, its last lines, its signal and the kernel's
word into ``cause``. ``failure.rank`` is null when no rank is to blame (torchrun itself died or
could not start them). In a multi-node run the earliest failure of any node wins (see ``hub``);
it also names ``node`` and ``node_rank``. Exactly one ``failure`` event is written per failure,
here (``set``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xl.launcher.multinode.protocol import FailureMessage
from xl.launcher.rundir.events import EventKind, FailureEvent, newest_events
from xl.launcher.rundir.lastbytes import last_lines
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.outcome import Cause, CauseKind, Failure, RankPhase, rank_outcome
from xl.launcher.rundir.runrecord import RunStatus
from xl.launcher.supervisor.journal import Journal
from xl.launcher.supervisor.ranks import RankRow, Ranks, describe_exit, signal_name
from xl.launcher.supervisor.torchrun import TorchrunLog

_STOP_CODES = (-signal.SIGTERM, -signal.SIGKILL)
# What input() and pdb (breakpoint()) raise in a rank, whose stdin is /dev/null.
NO_STDIN_ERRORS = ("EOFError: EOF when reading a line", "bdb.BdbQuit")
NO_STDIN = (
    "ranks have no stdin: input() and breakpoint() cannot read the terminal under xl launch "
    "(docs/launch.md)"
)
# The longest a failure waits for its facts (torchrun's summary, a peer found dead) before it is
# decided with what is known: torchrun reports within its monitor interval (0.1 s) of a rank's
# end, and the stop that the first failure starts ends the others within the stop's grace.
DECIDE_S = 5.0
# The longest a failure waits for the signal of a rank gone without a word, while torchrun lives.
UNKNOWN_EXIT_S = 2 * DECIDE_S


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
        self.torchrun_log = TorchrunLog(RunLayout(run_dir).torchrun_log)
        self.failure: Failure | None = None
        self.at: float | None = None
        self.remote = False  # another node's failure, adopted: not sent back
        self.suspected_at: float | None = None  # a rank failed; the cause is not decided yet
        # Told once the ranks' states are decided, before the failure event (``Lifecycle`` says
        # the ends it held back).
        self.on_decided: Callable[[], None] = lambda: None

    @property
    def deciding(self) -> bool:
        """A rank failed and which rank is the cause is not decided yet."""
        return self.suspected_at is not None and self.failure is None

    def local(self, rank: int | None, exit_code: int | None, traceback: str | None,
              error: str | None, message: str, cause: Cause | None = None) -> Failure:
        """A failure of this node."""
        return Failure(rank, exit_code, traceback, error, message, self.host, self.node_rank, cause)

    def set(self, failure: Failure, at: float) -> None:
        """``failure`` is the run's: recorded, its one ``failure`` event written, and (node > 0)
        sent to node 0."""
        self.failure, self.at = failure, at
        self.suspected_at = None
        self.on_decided()
        self.journal.changed()
        self.journal.emit(FailureEvent(failure))
        if not self.remote:
            self.journal.send(FailureMessage(failure, at))

    # ---------------------------------------------------------------- which rank
    def suspect(self, st: RankRow) -> None:
        """``st`` failed and nothing had before: the run failed (the loop stops it); which rank
        is the cause is ``decide``'s, once the facts are in."""
        if self.failure is None and self.suspected_at is None:
            self.suspected_at = time.monotonic()

    def decide(self, ranks: Ranks, torchrun_code: int | None, drain: Callable[[int], None],
               final: bool = False) -> Failure | None:
        """The root cause among this node's ranks, once it can be told (``final``: now, at the
        run's end); None while it waits, or when nothing is to blame."""
        if self.suspected_at is None or self.failure is not None:
            return None
        self.codes_of_the_gone(ranks)
        closed = self.torchrun_log.closed_pids()
        if not final and not self._ready(ranks, torchrun_code, drain, closed):
            return None
        self.suspected_at = None
        suspects = self._suspects(ranks, closed)
        if not suspects:
            self.on_decided()
            return None
        root = min(suspects, key=lambda st: self._order(st, drain))
        for st in ranks:
            # One rank failed first; the others that ended ended because of it (they lost it,
            # torchrun closed them), unless they failed of their own too (their own error).
            if st is root or st.state is RankPhase.FAILED:
                own = st is root or (
                    any(s is st for s in suspects) and not self.peer_lost(st, drain)
                )
                st.state = rank_outcome(st.exit_code, stopped=False, blamed=own)
        return self.blame_rank(root, drain)

    def _ready(self, ranks: Ranks, torchrun_code: int | None, drain: Callable[[int], None],
               closed: frozenset[int]) -> bool:
        if torchrun_code is not None:
            return True
        waited = time.monotonic() - (self.suspected_at or 0.0)
        suspects = self._suspects(ranks, closed)
        if any(st.exit_code is None for st in suspects):
            # Gone without a word: torchrun's report will name its signal (it reports within
            # its monitor interval, and ends once its ranks have). Decided with its signal, so
            # the failure event and run.json say the same exit.
            return waited >= UNKNOWN_EXIT_S
        if waited >= DECIDE_S:
            return True
        from xl.launcher import runprocs  # noqa: PLC0415 - already loaded by the ranks' table; named here for its alive()

        if any(not st.done and st.pid is not None and not runprocs.alive(st.pid) for st in ranks):
            return False  # a rank died and was not looked at yet: the next turn finds it
        # Only ranks that lost a peer so far: the peer that died is found soon.
        return not suspects or not all(self.peer_lost(st, drain) for st in suspects)

    @staticmethod
    def _suspects(ranks: Ranks, closed: frozenset[int]) -> list[RankRow]:
        """Ranks that ended badly on their own: not ended by xl's stop (it signalled them), nor
        by torchrun's own closing signal, nor never started."""
        return [
            st for st in ranks
            if st.done and st.exit_code != 0 and st.signalled is None and st.pid is not None
            # torchrun's closing signal goes to every rank, ended or not: it explains only a
            # rank that died of a signal, not one that exited on its own before.
            and not (st.pid in closed and (st.exit_code is None or st.exit_code < 0))
            and (st.exit_code is not None or st.vanished)
        ]

    def _order(self, st: RankRow, drain: Callable[[int], None]) -> tuple[bool, bool, float]:
        """Who died first: a rank that lost a peer comes after every rank that died; then by
        time (a killed rank died before the last time it was not seen alive)."""
        when = (st.alive_at if st.vanished else None) or st.ended_at or time.time()
        # SIGTERM is a stop (a scheduler's, a person's): after ranks that died of their own.
        return self.peer_lost(st, drain), st.exit_code == -signal.SIGTERM, when

    def peer_lost(self, st: RankRow, drain: Callable[[int], None]) -> bool:
        from xl.launcher.causes import peer_loss  # noqa: PLC0415 - a failure only: not on the path to torchrun

        if st.error or st.traceback:
            return peer_loss(f"{st.error or ''}\n{st.traceback or ''}") is not None
        if st.exit_code is None or st.exit_code >= 0 or st.exit_code == -signal.SIGABRT:
            drain(st.rank)  # its last words (a watchdog's abort prints why)
            return peer_loss("\n".join(self._log_lines(st.rank))) is not None
        return False

    # ---------------------------------------------------------------- why
    def blame_rank(self, st: RankRow, drain: Callable[[int], None]) -> Failure:
        """``st`` failed first: it is the run's cause."""
        from xl.launcher.causes import one_line, reading  # noqa: PLC0415 - a failure only: not on the path to torchrun

        error = one_line(st.error)
        what = error or (what_of(st) if st.exit_code is not None else "died")
        if st.after_script:
            what += " after its script had returned"
        message = f"rank {st.rank} failed first: {what}"
        if st.error in NO_STDIN_ERRORS:
            message += f" ({NO_STDIN})"
        drain(st.rank)
        lines = self._log_lines(st.rank)
        traceback = st.traceback
        if traceback is None and st.error is None:
            # No Python exception to show (sys.exit(2) from argparse, os._exit, a C++ abort):
            # the rank's last words are the best explanation there is (its log, as its relay
            # wrote it). A rank that exited on its own says its last line; a killed one's last
            # line is only what it printed before the signal, never the cause.
            traceback = "\n".join(lines[-15:]) + "\n" if lines else None
            # Its printed traceback's error line when it printed one (torch's CUDA advice
            # after it is no headline), else its last line.
            last = reading.read(lines).headline or (lines[-1].strip() if lines else "")
            if last and st.exit_code is not None and st.exit_code > 0:
                message += f": {one_line(last) or last}"[:202]
        # When it happened, to compare with other nodes' failures: a killed rank died between
        # the last time it was seen running and now.
        at = (st.alive_at if st.vanished else None) or st.ended_at or time.time()
        cause = self._explain(st, lines)
        failure = self.local(st.rank, st.exit_code, traceback, error, message, cause)
        self.set(failure, at)
        return failure

    def _explain(self, st: RankRow, lines: list[str]) -> Cause | None:
        from xl.launcher.causes import Evidence, explain  # noqa: PLC0415 - a failure only: not on the path to torchrun
        from xl.launcher.causes.doctor_facts import Doctor  # noqa: PLC0415 - as above

        record = self.journal.record
        spec = record.spec or {}
        argv = record.argv
        ev = Evidence(
            rank=st.rank,
            exit_code=st.exit_code,
            error=st.error,
            traceback=st.traceback,
            log_tail=lines,
            pids={st.pid} if st.pid else set(),
            python=str(argv[0]) if argv else "python",
            cwd=record.cwd,
            script=spec.get("script"),
            module=spec.get("module"),
            launch_args=_launch_args(spec),
            hang=latest_hang(self.run_dir),
            vanished=st.vanished,
            cgroup=getattr(record, "cgroup", None),  # the run's own, where one was made
            died_at=(st.alive_at if st.vanished else None) or st.ended_at,
        )
        # The doctor asks about the ranks' interpreter and environment (what xl added to it).
        env = {**os.environ, **record.rank_env}
        try:
            return explain(ev, Doctor(ev.python, env))
        except Exception as exc:  # the failure is recorded all the same, with a cause that says so
            return Cause(
                CauseKind.EXCEPTION, f"{what_of(st)} (xl could not tell why: {exc!r})", None, []
            )

    def torchrun_died(self, code: int | None) -> Failure:
        """torchrun ended while ranks ran (killed): no rank to blame."""
        desc = signal_name(code) if code is not None and code < 0 else f"code {code}"
        cause = Cause(CauseKind.KILLED, f"torchrun itself ended ({desc}) while its ranks ran", None,
                      [f"torchrun's exit: {desc}"])
        message = f"torchrun ended ({desc}) while ranks were running"
        failure = self.local(None, code, None, None, message, cause)
        self.set(failure, time.time())
        return failure

    def conclude(
        self, stop_requested: bool, torchrun_code: int | None, barrier_ended: bool, ranks: Ranks,
        drain: Callable[[int], None] = lambda rank: None,
    ) -> RunStatus:
        """The run's final status; a failure nobody explained yet gets its cause here."""
        if stop_requested:
            return RunStatus.STOPPED
        self.decide(ranks, torchrun_code, drain, final=True)
        if self.failure is not None:
            return RunStatus.FAILED
        if (torchrun_code == 0 or barrier_ended) and all(st.exit_code in (0, None) for st in ranks):
            return RunStatus.SUCCEEDED
        bad = [st for st in ranks if st.exit_code not in (0, None)]
        first = min(bad, key=lambda s: s.ended_at or 0.0) if bad else None
        if first is not None and first.after_script:
            self.blame_rank(first, drain)
            return RunStatus.FAILED
        torchrun_tail = self.torchrun_log.tail()
        failure = self.local(
            first.rank if first else None,
            first.exit_code if first else torchrun_code,
            # No rank to blame (e.g. torchrun could not start them): torchrun's own last words.
            first.traceback if first else torchrun_tail,
            first.error if first else None,
            f"torchrun exited with code {torchrun_code} (see logs/torchrun.log)",
            self._explain(first, self._log_lines(first.rank))
            if first
            else self._torchrun_cause(torchrun_code, torchrun_tail),
        )
        self.set(failure, (first.ended_at if first else None) or time.time())
        return RunStatus.FAILED

    def _torchrun_cause(self, code: int | None, text: str | None) -> Cause | None:
        """Why torchrun gave up with no rank to blame (its store's port taken, its own error)."""
        from xl.launcher.causes import Evidence, explain  # noqa: PLC0415 - a failure only

        lines = (text or "").splitlines()
        named = [ln for ln in lines if ": " in ln and not ln.startswith((" ", "\t"))]
        ev = Evidence(rank=None, exit_code=code, error="\n".join(named[-3:]) or None,
                      log_tail=lines[-15:])
        try:
            return explain(ev)
        except Exception:
            return None

    def fill_from_torchrun_log(self, ranks: Ranks, torchrun_code: int | None = None) -> None:
        """Exit codes of ranks killed by a signal, from torchrun's own failure summary; also of a
        rank whose script ended well but whose process did not (``RankRow.after_script``).
        The cause itself is ``decide``'s."""
        if torchrun_code == 0 and all(st.exit_code is not None for st in ranks):
            return
        self._codes_from_torchrun(ranks)

    def codes_of_the_gone(self, ranks: Ranks) -> None:
        """The signal of a rank gone without an exit record, while it can still be read: its
        zombie (torchrun has not reaped it yet), its exit once this subreaper reaped it
        (torchrun died first), or torchrun's own report of it."""
        from xl.launcher.causes.host import zombie_exit  # noqa: PLC0415 - a failure only: not on the path to torchrun

        for st in ranks:
            if st.vanished and st.exit_code is None and st.pid is not None:
                code = zombie_exit(st.pid)
                st.exit_code = code if code is not None else ranks.reparented.get(st.pid)
        if any(st.vanished and st.exit_code is None for st in ranks):
            self._codes_from_torchrun(ranks)

    def _codes_from_torchrun(self, ranks: Ranks) -> None:
        by_pid = {st.pid: st.rank for st in ranks if st.pid is not None}
        for rank, code in self.torchrun_log.reported_exits(by_pid).items():
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
                if self.failure is None and self.suspected_at is None:
                    self.suspected_at = time.monotonic()

    def _log_lines(self, rank: int, lines: int = 40, limit: int = 16384) -> list[str]:
        """The end of logs/rank-<rank>.log (what this supervisor has written of it so far)."""
        return tail(RunLayout(self.run_dir).rank_log(rank), lines, limit)



def latest_hang(run_dir: Path) -> str | None:
    """xl's own hang verdict, the newest, from events.jsonl (a collective timeout's culprit)."""
    for event in reversed(newest_events(run_dir, 65536)):
        if event.kind is EventKind.HANG and event.message:
            return event.message
    return None


def what_of(st: RankRow) -> str:
    if st.exit_code is None:
        return f"rank {st.rank} died"
    return describe_exit(st.rank, st.exit_code)


def _launch_args(spec: dict[str, Any]) -> list[str] | None:
    """This run's `xl launch` arguments, for a rerun line (None when the spec cannot say)."""
    from xl.launcher.spec import LaunchSpec, spec_to_argv  # noqa: PLC0415 - a failure only

    try:
        return spec_to_argv(LaunchSpec.from_json(spec))
    except Exception:
        return None

