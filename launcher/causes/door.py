"""The doctor's facts and fixes for a cause: the one door through which a failed run asks
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
    from xl.doctor.facts import Facts


@dataclass
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
        from xl.doctor.facts import Facts  # noqa: PLC0415 - a failure that needs the doctor only
        from xl.doctor.probes import shm, system  # noqa: PLC0415 - as above
        from xl.doctor.probes.pytorch import probe_torch, probe_torch_here  # noqa: PLC0415 - as above

        facts = Facts(env=self.env, python=self.python)
        facts.shm_total, facts.shm_free, facts.shm_problem = system.shm_size(facts.shm_path)
        facts.shm_segments = shm.segments(facts.shm_path)
        facts.container = system.container_kind()
        facts.net_ifaces = system.net_interfaces() or None
        facts.ib_devices = system.infiniband_devices()
        try:
            inv, facts.health, facts.fabric = system.probe_inventory()
            facts.driver, facts.gpus = inv.driver, tuple(inv.gpus)
        except Exception as exc:  # NVML absent or broken: the GPU facts stay unknown
            facts.nvml_problem = str(exc)
        # The ranks' interpreter: this one is read in-process; another by the doctor's probe.
        facts.torch = (
            probe_torch_here()
            if self.python == sys.executable
            else probe_torch(self.python, self.env or None)
        )
        return facts

    def ask(self, check: str) -> Answer:
        """One doctor check (``torch``, ``arch_list``, ``gpus``, ``shm``, ``nccl``) on the facts."""
        from xl.doctor.checks.archs import check_arch_list  # noqa: PLC0415 - a failure that needs the doctor only
        from xl.doctor.checks.gpu import check_gpus  # noqa: PLC0415 - as above
        from xl.doctor.checks.pytorch import check_torch  # noqa: PLC0415 - as above
        from xl.doctor.checks.system import check_nccl, check_shm  # noqa: PLC0415 - as above

        checks = {
            "torch": check_torch,
            "arch_list": check_arch_list,
            "gpus": check_gpus,
            "shm": check_shm,
            "nccl": check_nccl,
        }
        finding = checks[check](self.facts())
        return Answer(check, finding.status, finding.detail, finding.fix or "")

    def grow_shm(self) -> str:
        """How shared memory is made larger here (a container's --shm-size, or a remount): the
        doctor's own words, also when its check finds the mount large enough."""
        from xl.doctor.checks.system import _grow_shm  # noqa: PLC0415 - a failure that needs the doctor only

        return _grow_shm(self.facts())
