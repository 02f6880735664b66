"""What a check returns: a Finding (status, detail, fix, data), and one constructor per status.

A check decides only status, detail, fix and data; its id, title and area come from the registry
(xl.doctor.checks), so they are written once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xl.doctor.status import Status


@dataclass
class Finding:
    """One check's verdict before the registry names it (see xl.doctor.report.Check)."""

    status: Status
    detail: str  # one line
    fix: str = ""  # a command a shell takes as printed (a Fix's note joins the detail); or empty
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A check may still say the word ("warn"); the finding holds the one value.
        self.status = Status(self.status)
        # A fix is a command only; what it needs said goes beside it, in the detail.
        note = getattr(self.fix, "note", "")
        self.fix = str(self.fix)
        if note:
            self.detail = f"{self.detail}; {note}"


def ok(detail: str, *, data: Mapping[str, object] | None = None) -> Finding:
    return Finding(status=Status.OK, detail=detail, data=dict(data or {}))


def skip(detail: str, *, fix: str = "", data: Mapping[str, object] | None = None) -> Finding:
    return Finding(status=Status.SKIP, detail=detail, fix=fix, data=dict(data or {}))


def warn(detail: str, *, fix: str, data: Mapping[str, object] | None = None) -> Finding:
    return Finding(status=Status.WARN, detail=detail, fix=fix, data=dict(data or {}))


def fail(detail: str, *, fix: str, data: Mapping[str, object] | None = None) -> Finding:
    return Finding(status=Status.FAIL, detail=detail, fix=fix, data=dict(data or {}))


def error(detail: str, *, fix: str, data: Mapping[str, object] | None = None) -> Finding:
    """The check could not decide (a probe failed): less certain than a found problem."""
    return Finding(status=Status.ERROR, detail=detail, fix=fix, data=dict(data or {}))
