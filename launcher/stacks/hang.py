"""Once a stall is diagnosed: capture every rank's stacks once and say who holds up whom.

The diagnoser hands its ``stalled`` events here instead of emitting them (``Diagnoser(on_stall=)``).
The first stall of a hang starts one capture on a thread of its own (the sampler never waits on
it); it writes ``stacks/<t>.json`` and one ``hang`` event naming the culprit(s), then the held
``stalled`` events go out reworded: a culprit's says where it is, a victim's says what it waits in
and for whom (``waiting_on``), so the two read apart. Stalls that come later in the same
hang reuse its verdict. With no usable stacks (ranks not started by xl's entry), the events go out
unchanged. A stall is a hang only by the rule `xl stacks` follows (xl.launcher.telemetry.stall):
while another rank still progresses, the events go out unchanged.

A hang's culprit stalls first; the ranks waiting on it pass their own thresholds a step or so
later, so the first capture often finds them still progressing by the rule. When they are all due
within ``hold_s``, every rank is asked again as the last of them is due, the stalls held
meanwhile: the hang is named within the threshold and a few seconds, its culprit's line first,
never a "made no progress" line a rank before it. A held stall whose rank progresses again is
dropped with its ``recovered`` (``gate``). Stalls said later than they were seen are dated when
said (``said_at``): the events stay in time order.

A capture that names nobody (a rank had begun its collective only a moment before, as a loaded
machine makes it; or no rank answered) is asked again every ``retry_s`` while the stall lasts, a
bounded number of times: the diagnoser says a stall once, so without it such a hang would never
be named. Meanwhile stalls go out as they come; when a retry names the hang, each of them is said
again after the ``hang`` event, reworded (else the victims' events would never say whom they wait
on). ``over`` (no rank stalled any more) and ``join`` (the run's end) end the retries.
A capture that fails with an error says it in supervisor.log (the supervisor's stderr), once per
distinct error: a hang never named would otherwise leave no trace of why.

A mismatch (two ranks in collectives that can never match: xl.launcher.stacks.verdict's
``mismatch``) is certain from one look and needs no stall: once no rank has progressed for a few
seconds (``quiet``: the diagnoser's figure, a few step times at least), every rank is asked once
more each time that quiet spell doubles, for a mismatch only; one found is the hang, named at
once, and the stalls that come later take its verdict.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from enum import Enum
from pathlib import Path

from xl.launcher.rundir.events import Diagnosis, Emit, Event, EventKind, Hang
from xl.launcher.stacks.model import Json, RankStacks, RosterRank, StacksDoc, Target, targets
from xl.launcher.stacks.verdict import busy, doing, position, where
from xl.launcher.telemetry.stall import STALLED, Progress, judge
from xl.launcher.telemetry.thread_errors import ThreadErrors
from xl.units import ranks_text

# The supervisor's roster: its ranks (``remote`` for another node's), as model.targets takes them.
Roster = Callable[[], Sequence[Json | RosterRank | Target]]


RETRY_S = 5.0  # an inconclusive capture is asked again this often while the stall lasts ...
RETRIES = 12  # ... at most this many times (a minute): each asks every rank for its stacks
# The first stall of a hang is its culprit's; the others' come as each passes its own threshold,
# a step or so later. While they are due within this long, their stalls and the culprit's are
# held and every rank is asked again as the last is due: the hang is named within the threshold
# and a few seconds, in one line, instead of a "made no progress" line a rank first.
HOLD_S = 4.0
_DUE_MARGIN_S = 0.25  # asked this long after the last rank is due (the sampler's tick is 1 s)


class Capture(Enum):
    """Where this hang's capture is: IDLE (none; the next stall starts one) -> BUSY (capturing,
    stalls held) -> DONE (this hang's verdict is in), or -> RETRYING (the first capture named
    nobody: stalls go out as they come) -> DONE or IDLE."""

    IDLE = "idle"
    BUSY = "busy"
    DONE = "done"
    RETRYING = "retrying"


class HangCapture:
    def __init__(
        self,
        run_dir: Path,
        emit: Emit,
        ranks: Roster,
        timeout: float | None = None,  # gather.TIMEOUT_S
        *,
        retry_s: float = RETRY_S,
        retries: int = RETRIES,
        hold_s: float = HOLD_S,
    ) -> None:
        self.run_dir = run_dir
        self._emit = emit
        self._ranks = ranks
        self._timeout = timeout
        self._retry_s = retry_s
        self._retries = retries
        self._hold_s = hold_s
        self._lock = threading.Lock()
        self._held: list[Diagnosis] = []
        self._plain: list[Diagnosis] = []  # this hang's stalls sent as they came (RETRYING)
        self._capture = Capture.IDLE
        self.doc: StacksDoc | None = None  # this hang's document, once captured
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()  # this hang's retries end (over, join)
        self._errors = ThreadErrors()
        self._mismatch: StacksDoc | None = None  # a mismatch named in this quiet spell
        self._peeked_at = 0.0  # the quiet seconds at the last look for one (0: none yet)
        self._peeking: threading.Thread | None = None
        self._ended = False  # join(): the run ends, no new look starts

    def on_stall(self, events: list[Diagnosis]) -> None:
        """The diagnoser's stalled events: held until the hang's stacks are in, then sent."""
        with self._lock:
            if self._capture is Capture.IDLE and self._mismatch is not None:
                # the mismatch named before the stall is this hang's verdict
                self._capture = Capture.DONE
                self.doc = self._mismatch
            if self._capture in (Capture.IDLE, Capture.BUSY):
                self._held.extend(events)
                if self._capture is Capture.IDLE:
                    self._capture = Capture.BUSY
                    self._stop = threading.Event()
                    self._thread = threading.Thread(
                        target=self._run,
                        args=(self._stop,),
                        name="xl-hang-capture",
                        daemon=True,
                    )
                    self._thread.start()
                return
            doc = self.doc
            if doc is None:
                self._plain.extend(events)
        self._send(events, doc)

    def gate(self, emit: Emit) -> Emit:
        """``emit`` for the diagnoser's other events: a ``recovered`` of a stall still held here
        (never said, as the hang's verdict is awaited) drops that stall and is dropped itself,
        so no event says a rank recovered from a stall nobody was told of."""

        def gated(event: Event) -> None:
            if (
                isinstance(event, Diagnosis)
                and event.kind is EventKind.RECOVERED
                and event.of is EventKind.STALLED
            ):
                rank = event.rank
                with self._lock:
                    held = [e for e in self._held if e.rank != rank]
                    dropped, self._held = len(held) < len(self._held), held
                if dropped:
                    return
            emit(event)

        return gated

    def over(self) -> None:
        """No rank is stalled any more: the next stall is a new hang, with a capture of its own."""
        with self._lock:
            if self._capture in (Capture.DONE, Capture.RETRYING):
                self._capture, self.doc = Capture.IDLE, None
                self._stop.set()

    def join(self, timeout: float) -> None:
        """The run ends: a capture under way finishes (its events go out), retries do not wait."""
        self._stop.set()
        self._ended = True
        for thread in (self._thread, self._peeking):
            if thread is not None:
                thread.join(timeout)

    def quiet(self, idle_s: float | None, after_s: float) -> None:
        """The diagnoser's word each tick: no rank has progressed for ``idle_s`` (None: one did,
        or none ever reported). From ``after_s`` on, every rank is asked for a mismatch, again
        each time the quiet spell doubles; progress ends the spell."""
        if idle_s is None or idle_s < after_s:
            with self._lock:
                self._peeked_at, self._mismatch = 0.0, None
            return
        with self._lock:
            if (
                idle_s < 2 * self._peeked_at
                or self._capture is not Capture.IDLE
                or self._mismatch is not None
                or self._ended
            ):
                return
            if self._peeking is not None and self._peeking.is_alive():
                return
            self._peeked_at = idle_s
            self._peeking = threading.Thread(
                target=self._peek, name="xl-mismatch-peek", daemon=True
            )
            self._peeking.start()

    def _peek(self) -> None:
        try:
            ranks = targets(self._ranks())
            # Loaded at the first look: every run's start goes without the code that asks ranks.
            from xl.launcher.stacks import gather as capture  # noqa: PLC0415 - see above

            within = self._timeout if self._timeout is not None else capture.TIMEOUT_S
            t, entries = capture.gather(self.run_dir, ranks, timeout=within)
            doc = capture.assemble(self.run_dir, self.run_dir.name, t, entries, Progress(None))
            if not doc.verdict.mismatch:
                return
            doc = replace(doc, file=capture.save(self.run_dir, doc))
        except Exception as exc:  # the stall's own capture comes all the same
            self._errors.say("the look for a collective mismatch failed", exc)
            return
        with self._lock:
            if self._capture is not Capture.IDLE or self._mismatch is not None or self._ended:
                return  # a stall's capture came first: its verdict (the same mismatch) is said
            self._mismatch = doc
        self._say_hang(doc)

    def _run(self, stop: threading.Event) -> None:
        doc, due = self._attempt()
        # The other ranks are not stalled yet, but will be soon if this is a hang: asked again as
        # the last of them is due, the stalls held meanwhile (HOLD_S).
        deadline = time.monotonic() + self._hold_s
        while (
            doc is None
            and due is not None
            and time.monotonic() + due + _DUE_MARGIN_S <= deadline
            and not stop.wait(due + _DUE_MARGIN_S)
        ):
            doc, due = self._attempt()
        with self._lock:
            self.doc = doc
            self._capture = Capture.DONE if doc is not None else Capture.RETRYING
            held, self._held = self._held, []
            self._plain = [] if doc is not None else list(held)
        if doc is not None:
            self._say_hang(doc)
        self._send(held, doc, late=True)
        tries = 0
        while doc is None and tries < self._retries and not stop.wait(self._retry_s):
            tries += 1
            doc, _ = self._attempt()
            with self._lock:
                if stop.is_set():  # over() came while it asked: a later stall asks anew
                    return
                if doc is not None:
                    self.doc, self._capture = doc, Capture.DONE
                    plain, self._plain = self._plain, []
            if doc is not None:
                self._say_hang(doc)
                self._send(plain, doc)  # the stalls said before it, said again with its verdict
        with self._lock:
            # Nobody named after its retries: the next stall asks again.
            if self._capture is Capture.RETRYING and not stop.is_set():
                self._capture = Capture.IDLE

    def _attempt(self) -> tuple[StacksDoc | None, float | None]:
        """Every rank's stacks, once: the hang's document, or None when it names nobody; and
        then, where some ranks still progressed, in how long the last of them is due."""
        try:
            ranks = targets(self._ranks())
            # Loaded at the first look: every run's start goes without the code that asks ranks.
            from xl.launcher.stacks import gather as capture  # noqa: PLC0415 - see above

            within = self._timeout if self._timeout is not None else capture.TIMEOUT_S
            t, entries = capture.gather(self.run_dir, ranks, timeout=within)
            # The rule `xl stacks` follows: a culprit only when no rank progressed for the stall
            # threshold (one rank stalled while the others train on is no hang).
            progress = judge(self.run_dir, capture.rank_ids(ranks), entries, now=t)
            if progress.stalled is False:
                return None, progress.due_s
            if all(e.error for e in entries):
                return None, None
            if progress.stalled is None:  # the files tell nothing: the diagnoser's stall stands
                progress = STALLED
            doc = capture.assemble(self.run_dir, self.run_dir.name, t, entries, progress)
            return replace(doc, file=capture.save(self.run_dir, doc)), None
        except Exception as exc:  # a capture that fails leaves the stall reported as it was
            self._errors.say("the hang capture failed", exc)
            return None, None

    def _say_hang(self, doc: StacksDoc) -> None:
        culprits = list(doc.verdict.ranks)
        entries = doc.ranks
        working = [r for e in entries if (r := e.rank) in culprits and busy(e, entries)]
        # ``busy``: the culprits that were using the CPU: shown as a stall, not a hang.
        rank = culprits[0] if len(culprits) == 1 else None
        said = doc.verdict.message
        self._emit(Hang(doc.t, rank, culprits, said, doc.file or "", working))

    def _send(self, events: list[Diagnosis], doc: StacksDoc | None, *, late: bool = False) -> None:
        """The stalls, reworded with the hang's verdict where there is one. Each is dated when
        it is said, never before the hang it follows (``late``: held until now), so the events
        stay in time order."""
        # Each event's rank found in one index, not by a scan of the capture's entries per event
        # (O(ranks^2) when thousands stall at once).
        entries = _by_rank(doc) if doc is not None else {}
        floor = doc.t if doc is not None else (time.time() if late else None)
        for event in events:
            out = reword(event, doc, entries) if doc is not None else event
            self._emit(said_at(out, floor) if floor is not None else out)


_IDLE = re.compile(r"(no progress for )(\d+)( s)")


def said_at(event: Diagnosis, t: float) -> Diagnosis:
    """A stall said at ``t`` rather than when it was seen (held for the hang's verdict, or said
    again after it): dated ``t``, its idle time and the message's "no progress for N s" grown by
    the wait. An event at ``t`` or later is left as it is."""
    seen = event.t
    if t <= seen:
        return event
    idle = event.idle_s
    if idle is None:
        return replace(event, t=round(t, 6))
    grown = round(idle + (t - seen), 1)
    message = _IDLE.sub(lambda m: f"{m[1]}{grown:.0f}{m[3]}", event.message)
    return replace(event, t=round(t, 6), message=message, extra={**event.extra, "idle_s": grown})


def _by_rank(doc: StacksDoc) -> dict[int, RankStacks]:
    """The capture's entries by rank, the first of each rank's kept (as a scan would find)."""
    out: dict[int, RankStacks] = {}
    for e in doc.ranks:
        if e.rank is not None:
            out.setdefault(e.rank, e)
    return out


def reword(
    event: Diagnosis, doc: StacksDoc, entries: dict[int, RankStacks] | None = None
) -> Diagnosis:
    """A stalled event told with the hang's verdict: the culprit stalled, the others waiting on
    it. ``entries``: the capture's entries by rank (``_by_rank``), when the caller has them."""
    rank = event.rank
    culprits = list(doc.verdict.ranks)
    index = entries if entries is not None else _by_rank(doc)
    entry = index.get(rank) if rank is not None else None
    if entry is None or entry.error or not culprits:
        return event
    if rank in culprits:
        return replace(event, message=f"{event.message}; it is in {doing(entry, doc.ranks)}")
    pos = position(entry)
    what = f"{pos.waiting[2]} #{pos.waiting[1]}" if pos.waiting else where(entry)
    idle = event.idle_s
    since = f" (no progress for {idle:.0f} s)" if idle is not None else ""
    message = f"rank {rank} waits in {what} for {ranks_text(culprits)}{since}"
    return replace(event, message=message, extra={**event.extra, "waiting_on": culprits})
