"""Every fix a check produces in these tests, in this process, is a command a shell takes
pasted as it is (fakecuda.fix_problem); the reports of real `xl doctor` runs are held to the same
by fakecuda.run_doctor_json."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from fakecuda import fix_problem

from xl.doctor.checks import finding

_judged: dict[str, str | None] = {}


@pytest.fixture(autouse=True)
def _fixes_are_commands(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    made: list[str] = []
    original = finding.Finding.__post_init__

    def record(self: finding.Finding) -> None:
        original(self)
        # Only the doctor's own findings: a test may build one by hand to feed a renderer.
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__") in (finding.__name__, None):
            frame = frame.f_back  # the dataclass's __init__, then fail()/warn()
        caller = frame.f_globals.get("__name__", "") if frame is not None else ""
        if self.fix and caller.startswith("xl.doctor"):
            made.append(self.fix)

    monkeypatch.setattr(finding.Finding, "__post_init__", record)
    yield
    for fix in dict.fromkeys(made):
        if fix not in _judged:
            _judged[fix] = fix_problem(fix)
        assert _judged[fix] is None, f"a fix that is not a command ({_judged[fix]}): {fix!r}"
