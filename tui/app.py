"""The xl Textual app: GPUs (home), Doctor, Launch, Runs, and the Monitor of one run.

``main(argv)`` is the bare ``xl`` command; ``run_monitor(run_dir)`` opens the Monitor alone (for
``xl attach`` / ``xl demo`` / ``xl launch`` in a terminal). Both build the app with ``build_app``.
The app reaches GPUs, the doctor, the launcher and the run store only through its ``backend``
(tui/backend.py): ``LocalBackend`` for people, a fake for tests. Screens are imported when first
shown, so ``xl attach`` pays only for the Monitor.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypedDict

from rich.console import RenderableType
from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.driver import Driver
from textual.screen import Screen

from xl.errors import EXIT_USAGE, ArgumentParser
from xl.launcher.rundir.runrecord import RunRecord, exit_code_for, is_final
from xl.tui import fmt
from xl.tui.backend import Backend, LocalBackend
from xl.tui.run_outcome import FINISHED, outcome_text
from xl.tui.selection import DeviceSelection
from xl.tui.terminal import NOT_A_TERMINAL, interactive

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11

    from xl.tui.screens.monitor import MonitorScreen

# After Ctrl-C in `xl launch` / `xl demo`: how long the app waits for the run to end (the
# supervisor's SIGTERM grace, then SIGKILL) before it closes and leaves the run stopping.
STOP_WAIT_S = 60.0
# `xl launch` / `xl demo`: how long the Monitor shows the outcome of the run they started before it
# closes, as torchrun returns when its run ends (a key pressed meanwhile keeps it open).
CLOSE_AFTER_END_S = 3.0
# The screen keys, one group in the footer ("1234 Screens") so `? Help` and `q Quit` fit at 80
# columns.
SCREENS = Binding.Group("Screens", compact=True)


class XLApp(App[None]):
    CSS_PATH = "xl.tcss"
    TITLE = "xl"
    # The GPUs screen is a mode like the others, so `1` can switch back to it (Textual's own
    # "_default" mode cannot be switched to once left). `xl attach` adds no modes: it starts on
    # get_default_screen(), the Monitor.
    DEFAULT_MODE = "gpus"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        # Priority: taken in the order typed, before the keys after them go anywhere (a key
        # bound lower down is resolved only once it came back up from the focused widget, by
        # which time the keys typed after `3` had gone to the old screen). A text field with the
        # focus still gets its digits: Textual leaves out the bindings of keys a field types.
        Binding("1", "screen('gpus')", "GPUs", group=SCREENS, priority=True),
        Binding("2", "screen('doctor')", "Doctor", group=SCREENS, priority=True),
        Binding("3", "screen('launch')", "Launch", group=SCREENS, priority=True),
        Binding("4", "screen('runs')", "Runs", group=SCREENS, priority=True),
        Binding("question_mark,f1", "help", "Help"),
        Binding("q", "quit", "Quit"),
        # Priority: a form field would take it for "copy" and Textual's own binding only says
        # "press ctrl+q"; people press Ctrl-C to end what they started (action_interrupt).
        Binding("ctrl+c", "interrupt", "Quit", show=False, priority=True),
    ]

    def get_driver_class(self) -> type[Driver]:
        """Textual's driver for this terminal, except that on Linux the input thread sleeps until
        there is input (tui/driver.py) instead of waking ten times a second. A driver named in
        TEXTUAL_DRIVER is used as is."""
        driver_class = super().get_driver_class()
        if driver_class.__module__ == "textual.drivers.linux_driver" and not os.environ.get(
            "TEXTUAL_DRIVER"
        ):
            try:
                from xl.tui.driver import QuietLinuxDriver  # noqa: PLC0415 - Linux only; may fail (below)
            except ImportError:  # a Textual whose internals moved: its own driver still works
                return driver_class
            return QuietLinuxDriver
        return driver_class

    def __init__(
        self,
        backend: Backend,
        *,
        monitor_run_dir: Path | None = None,
        attach_only: bool = True,
        clock: fmt.Clock | None = None,
        poll_interval: float = 1.0,
        notice: str | None = None,
        close_after_end_s: float | None = None,
    ) -> None:
        super().__init__()
        # What the app leaves on the terminal as it closes (a command to paste, a traceback) is
        # printed as it is, for the terminal to wrap: never cut into lines at its width.
        self.error_console.soft_wrap = True
        self.backend = backend
        # Set for `xl launch` / `xl demo` (run_monitor): the Monitor of their run closes the app
        # this long after it showed the run's end.
        self.close_after_end_s = close_after_end_s
        self.monitor_run_dir = Path(monitor_run_dir) if monitor_run_dir is not None else None
        # What a person must still do for a run (node 0's command for the other nodes), by run
        # dir: shown on every Monitor of that run until the Monitor sees it done. In memory only
        # (the command carries the run's token).
        self.notices: dict[Path, str] = {}
        if notice is not None and self.monitor_run_dir is not None:
            self.notices[self.monitor_run_dir] = notice
        # Monitor-only: `xl attach` shows one run and nothing else.
        self.attach_only = attach_only and self.monitor_run_dir is not None
        self.clock: fmt.Clock = clock or fmt.default_clock
        self.poll_interval = poll_interval
        # The one GPU selection: the picker and the Launch form's GPUs field both edit it. It
        # starts empty: a script's remembered GPUs are its own, brought back with it by the
        # Launch form, never picked at start for whatever is launched next.
        self.selection = DeviceSelection()
        self._interrupted = False
        # Set when the app closes before the stopped run ended: the thread waiting for it quits.
        self._leave = threading.Event()
        # Status of the run the app was opened on (monitor_run_dir) as its Monitor last showed it
        # when the person left; exit_code() turns it into the command's exit code.
        self.run_outcome: str | None = None
        if not self.attach_only:
            from xl.tui.screens.doctor import DoctorScreen  # noqa: PLC0415 - not for `xl attach`
            from xl.tui.screens.gpus import GPUsScreen  # noqa: PLC0415 - not for `xl attach`
            from xl.tui.screens.launch import LaunchScreen  # noqa: PLC0415 - not for `xl attach`
            from xl.tui.screens.runs import RunsScreen  # noqa: PLC0415 - not for `xl attach`

            self.add_mode("gpus", lambda: GPUsScreen(self.selection, interval=self.poll_interval))
            self.add_mode("doctor", DoctorScreen)
            self.add_mode("launch", lambda: LaunchScreen(self.selection))
            self.add_mode("runs", RunsScreen)

    def get_default_screen(self) -> Screen:
        if self.attach_only:
            from xl.tui.screens.monitor import MonitorScreen  # noqa: PLC0415 - only once a run is shown

            assert self.monitor_run_dir is not None
            return MonitorScreen(
                self.monitor_run_dir,
                standalone=True,
                interval=self.poll_interval,
                notice=self.notices.get(self.monitor_run_dir),
            )
        from xl.tui.screens.gpus import GPUsScreen  # noqa: PLC0415 - not for `xl attach`

        return GPUsScreen(self.selection, interval=self.poll_interval)

    def on_mount(self) -> None:
        if os.environ.get("NO_COLOR") and "ansi-dark" in self.available_themes:
            # Textual already strips colour under NO_COLOR; the ANSI theme keeps the contrast.
            self.theme = "ansi-dark"
        if self.monitor_run_dir is not None and not self.attach_only:
            self.open_monitor(self.monitor_run_dir)
        self.call_after_refresh(_freeze_startup_objects)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Over a dialog (help, a confirmation, stacks) the screen keys are the dialog's to take.
        return not (action == "screen" and (self.attach_only or self.screen.is_modal))

    # -- navigation --------------------------------------------------------------------------

    async def action_screen(self, mode: str) -> None:
        # Awaited, from a priority binding: the keys typed right after `3` wait until the screen
        # is mounted and its field has the focus; not awaited, they would reach the screen being
        # left, which drops them (or takes a `q` among them for quit).
        await self.switch_mode(mode)

    def action_help(self) -> None:
        from xl.tui.screens.help import HelpScreen, help_for  # noqa: PLC0415 - Markdown loads only for help

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(
                HelpScreen(help_for(self.screen, owns_run=self._own_monitor() is not None))
            )

    def open_monitor(self, run_dir: Path | str, notice: str | None = None) -> None:
        from xl.tui.screens.monitor import MonitorScreen  # noqa: PLC0415 - only once a run is shown

        run_dir = Path(run_dir)
        if notice is not None:
            self.notices[run_dir] = notice
        notice = self.notices.get(run_dir)
        self.push_screen(
            MonitorScreen(run_dir, standalone=False, interval=self.poll_interval, notice=notice)
        )

    @property
    def owns_run(self) -> bool:
        """The app was opened by `xl launch` / `xl demo` on the run they started (not `xl attach`,
        not the bare app): Ctrl-C stops that run, `d` on its Monitor closes the app."""
        return self.monitor_run_dir is not None and not self.attach_only

    def closes_on_detach(self, run_dir: Path) -> bool:
        """Leaving this run's Monitor with `d` ends the app: the run the command is about. Any
        other Monitor (opened from Runs or Launch) just goes back, as escape does."""
        return run_dir == self.monitor_run_dir

    def closes_when_done(self, run_dir: Path) -> float | None:
        """Seconds after which the Monitor of ``run_dir`` closes the app once the run ended: set
        for the run `xl launch` / `xl demo` started, None for any other."""
        return self.close_after_end_s if self.owns_run and run_dir == self.monitor_run_dir else None

    def _own_monitor(self) -> MonitorScreen | None:
        """The Monitor of the run `xl launch` started, when it is the screen shown (under any
        dialog)."""
        from xl.tui.screens.monitor import MonitorScreen  # noqa: PLC0415 - only once a run is shown

        screen = next((s for s in reversed(self.screen_stack) if not s.is_modal), None)
        if (
            self.owns_run
            and isinstance(screen, MonitorScreen)
            and screen.run_dir == self.monitor_run_dir
        ):
            return screen
        return None

    def _left(self, run_dir: Path, status: str | None) -> None:
        # Only the run the command is about decides its exit code, not one opened from Runs.
        if run_dir == self.monitor_run_dir:
            self.run_outcome = status

    def detach(self, run_dir: Path, status: str | None) -> None:
        self._left(run_dir, status)
        self.leave(run_dir, status)

    def leave(self, run_dir: Path, status: str | None) -> None:
        """Close the app, leaving on the terminal what became of ``run_dir``: how to come back
        to it while it runs; once it ended, its outcome (with the root cause of a failure),
        which the full-screen app would otherwise take with it."""
        if status not in FINISHED:
            message = (f"Detached: run {run_dir.name} keeps running. Reopen it with: xl attach "
                f"{run_dir.name}")
            self.exit(return_code=0, message=message)
            return
        try:
            record = self.backend.run_record(run_dir)
        except Exception:  # an unreadable run.json still has a status to say
            record = None
        if record is None:
            record = RunRecord.from_json({}, run_dir.name)
        self.exit(
            return_code=0, message=outcome_text(record, run_dir.name, str(status), self.clock())
        )

    def on_monitor_screen_notice_done(self, message: MonitorScreen.NoticeDone) -> None:
        # Every node joined or the run ended: the next Monitor of that run shows no notice.
        self.notices.pop(message.run_dir, None)

    async def action_quit(self) -> None:
        from xl.tui.screens.monitor import MonitorScreen  # noqa: PLC0415 - only once a run is shown

        screen = self.screen
        own = self.monitor_run_dir
        if isinstance(screen, MonitorScreen):
            self._left(screen.run_dir, screen.status)
            if screen.run_dir == own or (own is None and screen.status not in FINISHED):
                self.detach(screen.run_dir, screen.status)
                return
        if own is not None:
            # Left from another screen: say what became of the run the command is about.
            self.leave(own, self.backend.run_status(own))
            return
        self.exit(return_code=0)

    def exit(
        self, result: None = None, return_code: int = 0, message: RenderableType | None = None
    ) -> None:
        self._leave.set()  # however the app closes, nothing waits on a run that is stopping
        super().exit(result, return_code, message)

    def on_unmount(self) -> None:
        self._leave.set()  # closed without exit() (its driver or a test harness ended it): the same

    async def action_interrupt(self) -> None:
        """Ctrl-C. In the Monitor of the run `xl launch` / `xl demo` started: stop that run, as
        torchrun and the plain view do, and close once it has ended (exit 1, like the plain
        view); a second Ctrl-C closes at once and leaves it stopping. Everywhere else (any other
        screen, even in `xl launch`): the same as `q`."""
        run_dir = self.monitor_run_dir
        monitor = self._own_monitor()
        if run_dir is None or not (
            self._interrupted or (monitor is not None and monitor.status not in FINISHED)
        ):
            await self.action_quit()
            return
        if self._interrupted:
            self.exit(
                return_code=130,
                message=f"Left run {run_dir.name} stopping; `xl runs` shows its status.",
            )
            return
        self._interrupted = True
        self.notify(
            f"Stopping run {run_dir.name}: Ctrl-C again leaves it stopping in the background",
            timeout=30,
        )
        self._stop_own_run(run_dir)

    @work(thread=True, exclusive=True, group="interrupt")
    def _stop_own_run(self, run_dir: Path) -> None:
        try:
            self.backend.stop(run_dir)
        except Exception as exc:  # say why, and let Ctrl-C try again
            self.call_from_thread(self._stop_failed, f"Could not stop the run: {exc}")
            return
        deadline = time.monotonic() + STOP_WAIT_S
        status = self.backend.run_status(run_dir)
        while status not in FINISHED and time.monotonic() < deadline:
            if self._leave.wait(0.2):
                return  # the app closed: it must not wait for this thread
            status = self.backend.run_status(run_dir)
        self.call_from_thread(self._stopped_own_run, run_dir, status)

    def _stop_failed(self, message: str) -> None:
        self._interrupted = False
        self.notify(message, severity="error")

    def _stopped_own_run(self, run_dir: Path, status: str | None) -> None:
        if status not in FINISHED:
            self.exit(
                return_code=130,
                message=f"Left run {run_dir.name} stopping; `xl runs` shows its status.",
            )
            return
        self.run_outcome = status
        self.leave(run_dir, status)


def _freeze_startup_objects() -> None:
    """Take everything made so far (Textual, Rich, the screens: ~10^5 long-lived objects) out of
    the garbage collector's sight, so that a full collection does not walk them all again while
    the Monitor makes thousands of short-lived objects a second; measured in bench_tui's setup,
    it takes the Monitor's CPU down by about 15% (1.75% -> 1.5% of a core)."""
    gc.collect()
    gc.freeze()


class AppOptions(TypedDict, total=False):
    """XLApp's options past its backend (XLApp.__init__ says each)."""

    monitor_run_dir: Path | None
    attach_only: bool
    clock: fmt.Clock | None
    poll_interval: float
    notice: str | None
    close_after_end_s: float | None


def build_app(backend: Backend | None = None, **options: Unpack[AppOptions]) -> XLApp:
    """The one factory the CLI and the tests use: this machine's backend unless one is given."""
    return XLApp(backend if backend is not None else LocalBackend(), **options)


def exit_code(app: XLApp) -> int:
    """The exit code of `xl launch` / `xl demo` / `xl attach` after the monitor closes.

    The run record's rule, as the console view's (record.exit_code_for): 0 the run succeeded, 1
    it failed or was stopped (docs/contracts.md, "Exit codes"); 0 when the person detached
    from a run that is still going. The outcome is what the Monitor showed when the person left;
    if they left from another screen, run.json says it.
    """
    if app.return_code:
        return app.return_code
    if app.monitor_run_dir is None:
        return 0
    status = app.run_outcome
    if status is None:
        status = app.backend.run_status(app.monitor_run_dir)
    return exit_code_for(status) if is_final(status) else 0


def run_monitor(run_dir: Path, *, attach_only: bool = True, notice: str | None = None) -> int:
    """Open the Monitor on ``run_dir``; returns the exit code the calling command should use.

    ``attach_only=True`` shows that run alone (``xl attach``); ``False`` opens it over the full
    app (``xl launch`` / ``xl demo``), where escape leads to the other screens.
    """
    close = (
        None if attach_only else CLOSE_AFTER_END_S
    )  # as torchrun, `xl launch` returns when its run ends
    app = build_app(
        monitor_run_dir=Path(run_dir),
        attach_only=attach_only,
        notice=notice,
        close_after_end_s=close,
    )
    app.run()
    return exit_code(app)


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="xl",
        description="The xl app: GPUs and device picker, doctor, launch, live monitor, runs.",
    )
    parser.parse_args(list(argv or []))
    if not interactive():
        # Textual would write escape codes into the file or pipe and wait for keys that never come.
        sys.stderr.write(NOT_A_TERMINAL + "\n")
        return EXIT_USAGE
    app = build_app()
    app.run()
    return app.return_code or 0
