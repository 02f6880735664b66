"""The doctor's verdict as plain data: what the CLI prints, the JSON holds and the TUI renders."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from xl.doctor.status import NOT_CLEAN, Status, worst


class Fix(str):
    """A fix: the command a person pastes into a shell as it is printed, and a note that belongs
    beside it (a downgrade said, which machine runs it, a download it needs first). The finding
    that takes a Fix puts the note in its detail (xl.doctor.checks.finding), so the fix stays a
    command: a note in parentheses would stop bash at the `(`."""

    note: str

    def __new__(cls, command: str, note: str = "") -> Fix:
        made = super().__new__(cls, command)
        made.note = note
        return made

    @classmethod
    def said(cls, text: str) -> Fix:
        """A fix written as "command (note)" (xl.gpu's words, which the launch and the app print
        too), as its command and its note."""
        command, sep, note = text.partition(" (")
        if sep and note.endswith(")"):
            return cls(command, note[:-1])
        return cls(text)

    @classmethod
    def joined(cls, fixes: Iterable[str]) -> Fix:
        """Several fixes as one command line ("; " between them, each once), their notes one."""
        made = [f if isinstance(f, Fix) else cls.said(f) for f in fixes]
        notes = [f.note for f in made if f.note]
        return cls("; ".join(dict.fromkeys(str(f) for f in made)), "; ".join(dict.fromkeys(notes)))


def clean_text(value: str) -> str:
    """Make text printable: environment bytes that were not UTF-8 arrive as lone surrogates."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        try:
            return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        except UnicodeEncodeError:
            return value.encode("utf-8", "replace").decode("utf-8")


def clean(value: object) -> object:
    """clean_text over a JSON-like tree."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(k)): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


@dataclass
class Check:
    id: str
    status: Status
    title: str
    detail: str  # one line
    fix: str = ""  # what to type or change; empty when there is nothing to do
    area: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            self.status = Status(self.status)
        except ValueError:
            raise ValueError(f"unknown check status {self.status!r}") from None
        self.title = clean_text(self.title)
        self.detail = " ".join(clean_text(self.detail).split())
        self.fix = " ".join(clean_text(self.fix).split())
        self.data = {clean_text(str(k)): clean(v) for k, v in self.data.items()}

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "id": self.id,
            "status": self.status.value,
            "title": self.title,
            "detail": self.detail,
            "fix": self.fix,
        }
        if self.data:
            out["data"] = self.data
        return out


@dataclass
class Report:
    checks: list[Check]
    gpus: list[dict[str, Any]] = field(default_factory=list)  # GPU.to_json() of each GPU found
    facts: dict[str, Any] = field(default_factory=dict)  # what the probes saw (secrets redacted)

    @property
    def status(self) -> Status:
        return worst(c.status for c in self.checks)

    def by_area(self) -> list[tuple[str, list[Check]]]:
        """The checks grouped by area (what every renderer shows). Areas come in the order of
        their first check, so the registry's order (xl.doctor.checks.CHECKS) sets both."""
        order = dict.fromkeys(c.area for c in self.checks)
        return [(a, [c for c in self.checks if c.area == a]) for a in order]

    def get(self, check_id: str) -> Check | None:
        return next((c for c in self.checks if c.id == check_id), None)

    def counts(self) -> dict[Status, int]:
        out = dict.fromkeys(Status, 0)  # mildest first: the summary's order
        for c in self.checks:
            out[c.status] += 1
        return out

    def exit_code(self, strict: bool = False) -> int:
        bad = NOT_CLEAN if strict else {Status.FAIL}
        return 1 if any(c.status in bad for c in self.checks) else 0

    def summary(self) -> str:
        counts = self.counts()
        parts = [f"{n} {s}" for s, n in counts.items() if n]
        return f"{len(self.checks)} checks: " + ", ".join(parts)

    def to_json(self) -> dict[str, object]:
        return {
            "status": self.status.value,
            "checks": [c.to_json() for c in self.checks],
            "gpus": clean(self.gpus),
            **{k: clean(v) for k, v in self.facts.items() if k not in ("status", "checks", "gpus")},
        }
