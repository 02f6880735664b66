"""The app's one way to the domain: GPUs, the doctor, the launcher and the run directories.

Screens never import xl.gpu, xl.doctor or xl.launcher; they ask the app's ``Backend``. The app is
built with ``LocalBackend`` (this machine) by ``xl.tui.app.build_app``; tests hand it a fake, as
harlequin's app knows its database only through an adapter. Every method may block (NVML, files,
subprocesses), so screens call them from thread workers, never on the event loop.

This module is Textual-free: the domain's modules load inside the methods, the first time each is
used, so the app starts fast and each screen pays only for what it shows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from xl import envnames

if TYPE_CHECKING:
    from xl.doctor.report import Report
    from xl.gpu.nvml import Inventory
    from xl.launcher.control import RunHandle
    from xl.launcher.plan import Plan
    from xl.launcher.rundir.runrecord import RunRecord
    from xl.launcher.rundir.store import RunInfo
    from xl.launcher.spec import LaunchSpec
    from xl.launcher.stacks.model import StacksDoc
    from xl.launcher.view.comparison import Comparison
    from xl.launcher.view.reader import RunReader


@dataclass(frozen=True, slots=True)
class OutputPiece:
    """A piece of a rank's output asked of another node: its bytes from the offset asked, and
    the whole output's size as that node saw it."""

    data: bytes
    size: int


class Backend(Protocol):
    """What the app needs from the domain, and nothing more."""

    # True for viewers (`xl serve --read-only`): start and stop refuse, and no screen offers them.
    read_only: bool

    def inventory(self) -> Inventory:
        """This machine's GPUs now, with their processes (never raises for NVML's failures: the
        inventory says what went wrong)."""
        ...

    def doctor_report(self) -> Report:
        """Every doctor check, run now (seconds: it probes the toolkit and torch)."""
        ...

    def plan(self, spec: LaunchSpec) -> Plan:
        """What ``xl launch`` would run for ``spec`` on the GPUs last seen; UsageError when the
        spec cannot run here."""
        ...

    def start(self, spec: LaunchSpec, plan: Plan | None = None) -> tuple[RunHandle, str | None]:
        """Start ``spec``'s run, on ``plan`` when given (the one ``plan(spec)`` made and the
        Launch screen shows: the run is what the person saw): its handle, and what the person
        must still do (node 0's command for the other nodes of a multi-node run) or None."""
        ...

    def runs(self) -> list[RunInfo]:
        """Every run in the run store."""
        ...

    def resolve(self, run: str) -> Path:
        """The run directory of a run id, a unique prefix of one, or a path."""
        ...

    def reader(self, run_dir: Path) -> RunReader:
        """A reader of ``run_dir`` that follows it incrementally (one per Monitor)."""
        ...

    def run_status(self, run_dir: Path) -> str | None:
        """The status run.json holds now (None while it cannot be read)."""
        ...

    def run_record(self, run_dir: Path) -> RunRecord | None:
        """run.json as it is now, typed (None while it cannot be read): the outcome the app
        leaves on the terminal as it closes."""
        ...

    def rank_output(
        self, run_dir: Path, rank: int, node: int, offset: int
    ) -> OutputPiece | None:
        """A piece of another node's rank's output from ``offset`` (at most 64 KiB), asked of
        ``node`` through node 0's supervisor, as ``xl logs RUN --rank R`` does; None when it
        cannot answer (the node is unreachable, the run is over). Waits at most a few seconds."""
        ...

    def stop(self, run_dir: Path) -> None:
        """Stop the run: SIGTERM to every rank, SIGKILL after the grace period."""
        ...

    def stacks(self, run_dir: Path) -> StacksDoc:
        """Ask every rank of the running run where it is now: the stacks document, with the
        whole run's verdict (raises with a one-line message when the run is not running)."""
        ...

    def compare(self, run_a: Path, run_b: Path) -> Comparison:
        """Two finished (or running) runs side by side, as `xl compare` shows them (raises with a
        one-line message for a damaged run, or one run twice)."""
        ...

    def comparison_rows(self, comparison: Comparison) -> list[tuple[str, str, str]]:
        """A comparison's side-by-side table as `xl compare` prints it: (label, A, B) per row;
        a section's title row has empty cells."""
        ...


class LocalBackend:
    """The real backend: this machine's NVML, doctor, launcher and run store."""

    read_only = False

    def __init__(self) -> None:
        # The latest inventory read (the GPUs screen polls every second): Launch validates its
        # form against what the person sees, without an NVML sweep per key pressed.
        self._inventory: Inventory | None = None

    def inventory(self) -> Inventory:
        from xl.gpu.nvml import inventory  # noqa: PLC0415 - NVML loads only once GPUs are asked for

        self._inventory = inventory(processes=True)
        return self._inventory

    def doctor_report(self) -> Report:
        from xl.doctor.run import run_doctor  # noqa: PLC0415 - the doctor's checks load only for its screen

        return run_doctor()

    def plan(self, spec: LaunchSpec) -> Plan:
        from xl.launcher.plan import build_plan  # noqa: PLC0415 - the launcher loads only for the Launch screen

        return build_plan(
            spec, self._inventory if self._inventory is not None else self.inventory()
        )

    def start(self, spec: LaunchSpec, plan: Plan | None = None) -> tuple[RunHandle, str | None]:
        """Node 0 of a multi-node run gets the run's token made here and handed to its supervisor
        through the environment (never a command line, never run.json). Its rendezvous id comes
        from that token (plan.rdzv_id): the plan shown is started with that id put in."""
        from xl.launcher.control import start_run  # noqa: PLC0415 - the launcher loads only once a run starts

        if spec.nnodes < 2:
            return start_run(spec, plan), None
        from xl.launcher.multinode.join import prepare_launch  # noqa: PLC0415 - multi-node runs only
        from xl.launcher.plan import with_token  # noqa: PLC0415 - multi-node runs only

        # The token goes to this run's supervisor only, never into the app's own environment
        # (its later runs, the doctor's probes).
        env = dict(os.environ)
        join = prepare_launch(spec, env)
        if plan is not None and env.get(envnames.TOKEN):
            plan = with_token(plan, env[envnames.TOKEN])
        return start_run(spec, plan, env=env), join.strip() if join else None

    def runs(self) -> list[RunInfo]:
        from xl.launcher.rundir.store import list_runs  # noqa: PLC0415 - the launcher loads only for the Runs screen

        return list_runs()

    def resolve(self, run: str) -> Path:
        from xl.launcher.rundir.store import resolve_run  # noqa: PLC0415 - the launcher loads only for the Runs screen

        return resolve_run(run)

    def reader(self, run_dir: Path) -> RunReader:
        from xl.launcher.view.reader import RunReader  # noqa: PLC0415 - loads only for the Monitor

        return RunReader(run_dir)

    def run_status(self, run_dir: Path) -> str | None:
        from xl.launcher.rundir.runrecord import read_json  # noqa: PLC0415 - read once, as the app exits

        status = read_json(run_dir).get("status")
        return str(status) if status is not None else None

    def run_record(self, run_dir: Path) -> RunRecord | None:
        from xl.launcher.rundir.runrecord import load  # noqa: PLC0415 - read once, as the app exits

        return load(run_dir)

    def rank_output(
        self, run_dir: Path, rank: int, node: int, offset: int
    ) -> OutputPiece | None:
        from xl.launcher.stacks.nodes import ask_logs  # noqa: PLC0415 - remote ranks only

        # Short: the Monitor's poller waits for it (RemoteLog asks a silent node rarely).
        piece = ask_logs(run_dir, rank, node, offset, timeout=2.0)
        if piece is None:
            return None
        size = piece.get("size")
        return OutputPiece(
            # The node sends the bytes as text, undecodable ones as surrogates: the same bytes.
            str(piece.get("data") or "").encode("utf-8", "surrogateescape"),
            size if isinstance(size, int) and not isinstance(size, bool) else 0,
        )

    def stop(self, run_dir: Path) -> None:
        from xl.launcher.control import stop_run  # noqa: PLC0415 - the launcher loads only once a run is stopped

        stop_run(run_dir)

    def stacks(self, run_dir: Path) -> StacksDoc:
        from xl.launcher.stacks.gather import run_document  # noqa: PLC0415 - loads only when stacks are asked for

        # every rank: the verdict is the whole run's, never one rank's
        return run_document(run_dir)

    def compare(self, run_a: Path, run_b: Path) -> Comparison:
        from xl.launcher.view.comparison import compare  # noqa: PLC0415 - loads only when two runs are compared

        return compare(run_a, run_b)

    def comparison_rows(self, comparison: Comparison) -> list[tuple[str, str, str]]:
        from xl.launcher.view.comparison import rows  # noqa: PLC0415 - loaded once a comparison was made

        return rows(comparison)
