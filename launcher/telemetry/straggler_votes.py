"""Naming a straggler over ticks: a vote each tick from the best evidence the ranks give, and a
rank named (and cleared again) only after ``straggler_sustain`` votes in a row.

The diagnoser (diagnose.py) holds the ranks' records and hands each tick's ``Evidence``; this
module owns the votes and the spells, and gives back the diagnoses they make. Loaded at the first
tick with evidence from two ranks, as straggler.py: not on every supervisor's start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from xl.launcher.rundir.events import EventKind
from xl.launcher.telemetry import straggler
from xl.launcher.telemetry.diagnosis import (
    BlameFields,
    Diagnosis,
    Evidence,
    GpuPart,
    Lasting,
    Recovered,
    StepTimeBlame,
    Straggler,
    WaitBlame,
)
from xl.stats import median, median_low

if TYPE_CHECKING:
    from xl.launcher.telemetry.diagnose import Thresholds

# A spell held this many straggler windows in a row is chronic; a second ``straggler`` event
# for the rank says so, with how long.
CHRONIC_WINDOWS = 6


class _Votes:
    __slots__ = ("clear", "named", "straggle")

    def __init__(self) -> None:
        self.named = False
        self.straggle = 0  # votes in a row that it is the straggler
        self.clear = 0  # votes in a row, once named, that it is not


class Stragglers:
    """Each tick, a vote for each rank the evidence covers: from their step split (the rule of
    straggler.judge), else their waits at the all-reduce, else their step times."""

    def __init__(self, th: Thresholds) -> None:
        self.th = th
        self.spells = Spells(th.straggler_sustain, th.straggler_window_s)

    def named(self) -> set[int]:
        """The ranks named stragglers and not cleared since."""
        return self.spells.named()

    def check(self, now: float, evidence: Evidence) -> list[Diagnosis]:
        """The diagnoses of this tick: spells grown chronic, ranks named, ranks cleared."""
        out = self.spells.tick(now, evidence)
        if len(evidence.splits) >= 2:
            blame = straggler.judge(
                evidence.splits,
                min_wait_s=self.th.straggler_min_wait_s,
                wait_ratio=self.th.straggler_wait_ratio,
                min_share=self.th.straggler_min_share,
                step_ratio=self.th.step_time_ratio,
            )
            blamed: dict[int, BlameFields] = {blame.rank: blame} if blame is not None else {}
            ranks = list(evidence.splits)
        elif len(evidence.waits) >= 2:
            blamed, ranks = self._by_wait(evidence.waits), list(evidence.waits)
        elif len(evidence.steps) >= 2:
            blamed, ranks = self._by_step_time(evidence.steps), list(evidence.steps)
        else:
            return out
        for rank in ranks:
            out += self.spells.vote(rank, now, blamed.get(rank), evidence)
        return out

    def _by_wait(self, waits: Mapping[int, float]) -> dict[int, BlameFields]:
        """The rank that waits least, when the others wait much for it."""
        culprit = min(waits, key=lambda r: waits[r])
        victims_wait = median([w for r, w in waits.items() if r != culprit])
        if (
            victims_wait < self.th.straggler_min_wait_s
            or waits[culprit] > self.th.straggler_wait_ratio * victims_wait
        ):
            return {}
        victims = tuple(r for r in waits if r != culprit)
        return {culprit: WaitBlame(culprit, waits[culprit], victims, victims_wait)}

    def _by_step_time(self, steps: Mapping[int, float]) -> dict[int, BlameFields]:
        """Every rank whose step takes ``step_time_ratio`` times the median or more."""
        typical = median_low(list(steps.values()))
        if typical <= 0:
            return {}
        ratio = self.th.step_time_ratio
        return {r: StepTimeBlame(r, s, typical) for r, s in steps.items() if s >= ratio * typical}


class Spells:
    """Naming a straggler from the 1 Hz votes, and its spells: a rank is named (a ``straggler``
    diagnosis) after ``sustain`` votes in a row and cleared (``recovered``) after as many
    against. ``Lasting`` says ``transient`` until the spell has held ``CHRONIC_WINDOWS`` windows,
    when a second ``straggler`` says ``chronic``; ``since_s``: the spell's length from its first
    vote; ``spells``: how often the rank was named in the run, this time included, over
    ``spells_since_s``; and its GPU's part (``straggler.explain_gpu``)."""

    def __init__(self, sustain: int, window_s: float) -> None:
        self.sustain = sustain
        self.chronic_s = CHRONIC_WINDOWS * window_s
        self._votes: dict[int, _Votes] = {}
        self._began: dict[int, float] = {}  # rank -> first vote of its current run of votes
        self._named: dict[int, list[float]] = {}  # rank -> when each of its spells began
        # rank -> its spell in force: the diagnosis said, and whether it was said chronic
        self._said: dict[int, Straggler] = {}

    def named(self) -> set[int]:
        return {rank for rank, v in self._votes.items() if v.named}

    def vote(
        self, rank: int, now: float, blame: BlameFields | None, evidence: Evidence
    ) -> list[Diagnosis]:
        """A vote on ``rank`` (``blame``: it is the straggler; None: it is not). A rank with no
        votes and not named has nothing to count (most ranks, every tick)."""
        v = self._votes.get(rank)
        if blame is None:
            if v is None or not (v.straggle or v.named):
                return []
            return self._against(rank, v)
        if v is None:
            v = self._votes[rank] = _Votes()
        self._began.setdefault(rank, now)
        v.clear = 0
        v.straggle += 1
        if v.named or v.straggle < self.sustain:
            return []
        v.named = True
        began = self._began[rank]
        self._named.setdefault(rank, []).append(began)
        said = Straggler(
            rank,
            blame.message(),
            blame,
            _gpu(rank, blame.phase, now, evidence),
            self._lasting(rank, now, chronic=False),
        )
        self._said[rank] = said
        return [said]

    def _against(self, rank: int, v: _Votes) -> list[Diagnosis]:
        v.straggle = 0
        if not v.named:
            self._began.pop(rank, None)
            return []
        v.clear += 1
        if v.clear < self.sustain:
            return []
        v.named, v.clear = False, 0
        self._said.pop(rank, None)
        self._began.pop(rank, None)
        message = f"rank {rank} is no longer a straggler"
        return [Recovered(rank, message, EventKind.STRAGGLER)]

    def tick(self, now: float, evidence: Evidence) -> list[Diagnosis]:
        """A second ``straggler`` for each spell that has just become chronic, with its GPU's
        part as it stands now."""
        out: list[Diagnosis] = []
        for rank, said in list(self._said.items()):
            if said.lasting.chronic or now - self._began.get(rank, now) < self.chronic_s:
                continue
            gpu = _gpu(rank, said.blame.phase, now, evidence)
            chronic = Straggler(
                rank, said.message, said.blame, gpu, self._lasting(rank, now, chronic=True)
            )
            self._said[rank] = chronic
            out.append(chronic)
        return out

    def _lasting(self, rank: int, now: float, *, chronic: bool) -> Lasting:
        times = self._named.get(rank, [])
        return Lasting(
            chronic,
            round(now - self._began.get(rank, now), 1),
            len(times),
            round(now - times[0], 1) if times else 0.0,
        )


def _gpu(rank: int, phase: str | None, now: float, evidence: Evidence) -> GpuPart:
    return straggler.explain_gpu(evidence.gpu_seen.get(rank), phase, now)
