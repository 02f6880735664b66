"""The doctor's facts and fixes for a cause: the one way a failed run asks
`xl doctor` (docs/launch.md, "Why a rank died").

What "no kernel image" means for this torch wheel and these GPUs, what a GPU's compute mode
allows, how shared memory is grown here, which NCCL settings are traps: the doctor knows it and
prints its fixes, checked before they are printed. A cause asks the doctor's own checks on facts
read now, as the launch's preflight does (``launcher.cli.preflight``), and never words a fix of
its own for these. Only a failure that needs them pays for them: nothing here loads otherwise.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xl.doctor.api import Facts


@dataclass(frozen=True)
class Answer:
    """A doctor's check on the facts of now: ``status`` (ok, warn, fail, skip, error), its
    ``detail`` and its ``fix`` ("" when none)."""

    check: str
    status: str
    detail: str
    fix: str


class Doctor:
    """The doctor's checks on this machine's facts, read on first use. ``facts`` given: those
    (tests, and what-if questions), else read here for the ranks' interpreter ``python``."""

    def __init__(
        self,
        python: str | None = None,
        env: dict[str, str] | None = None,
        facts: Facts | None = None,
    ) -> None:
        self.python = python or sys.executable
        self.env = dict(env or {})
        self._facts = facts

    def facts(self) -> Facts:
        if self._facts is None:
            self._facts = self._read()
        return self._facts

    def _read(self) -> Facts:
        from xl.doctor import api  # noqa: PLC0415 - a failure that needs the doctor only

        return api.failure_facts(self.python, self.env)

    def ask(self, check: str) -> Answer:
        """One doctor check (``torch``, ``arch_list``, ``gpus``, ``shm``, ``nccl``) on the facts."""
        from xl.doctor import api  # noqa: PLC0415 - a failure that needs the doctor only

        finding = api.check(self.facts(), check)
        return Answer(check, finding.status, finding.detail, finding.fix or "")

    def grow_shm(self) -> str:
        """How shared memory is made larger here (a container's --shm-size, or a remount): the
        doctor's own words, also when its check finds the mount large enough."""
        from xl.doctor import api  # noqa: PLC0415 - a failure that needs the doctor only

        return api.grow_shm(self.facts())
