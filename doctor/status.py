"""A check's status: one value that knows its JSON word, how bad it is, and how it is drawn.

The words are a contract (docs/contracts.md, `xl doctor --json`): `Status` is a `str` whose value
is the word, so JSON, comparisons with the word and dict lookups keyed by it keep working for
whoever reads the report without importing this module (the app's doctor screen does).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class Look:
    """How a status is drawn: its glyph and Rich style for a terminal, its plain-text label, and
    the summary's verdict on a report whose worst check has it."""

    glyph: str
    style: str
    label: str
    verdict: str


class Status(str, Enum):
    """Declared mildest first: the report's status is the worst of its checks. `error` (the check
    itself could not run) ranks below `fail` because a found problem is more certain than an
    unknown."""

    OK = "ok"
    SKIP = "skip"
    WARN = "warn"
    ERROR = "error"
    FAIL = "fail"

    def __str__(self) -> str:
        # The word, so f-strings and str() print "fail", never "Status.FAIL".
        return self.value

    @property
    def rank(self) -> int:
        """Higher is worse (the declaration order)."""
        return _ORDER.index(self)

    @property
    def look(self) -> Look:
        return _LOOK[self]

    @property
    def glyph(self) -> str:
        return self.look.glyph

    @property
    def style(self) -> str:
        return self.look.style

    @property
    def label(self) -> str:
        return self.look.label


_ORDER: tuple[Status, ...] = tuple(Status)
_LOOK: dict[Status, Look] = {
    Status.OK: Look("✔", "green", "ok", "ready"),
    Status.SKIP: Look("–", "dim", "skip", "ready"),
    Status.WARN: Look("▲", "yellow", "WARN", "usable, with warnings"),
    Status.ERROR: Look("?", "magenta", "ERROR", "some checks could not run"),
    Status.FAIL: Look("✘", "bold red", "FAIL", "problems found"),
}

# What `--strict` fails on besides `fail`: anything that is neither fine nor not applicable.
NOT_CLEAN = frozenset({Status.WARN, Status.ERROR, Status.FAIL})


def worst(statuses: Iterable[Status | str]) -> Status:
    """The worst of these statuses; `ok` when there are none."""
    return max((Status(s) for s in statuses), key=lambda s: s.rank, default=Status.OK)
