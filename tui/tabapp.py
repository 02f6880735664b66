"""The app as `xl serve` runs it, once per browser tab: ``python -m xl.tui.tabapp [--read-only]``.

textual-serve starts this with TEXTUAL_DRIVER naming its web driver, stdin and stdout pipes to the
server, and the tab's size in COLUMNS/ROWS. So it never asks whether stdin is a terminal, never
writes to stdout itself (the driver's protocol owns it), and leaves the driver to Textual
(XLApp.get_driver_class uses the one TEXTUAL_DRIVER names).

``--read-only`` (for viewers): no Launch screen and no stop. The backend refuses to start or stop
a run whatever asks it to, so no key, button or screen can get around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from textual.widget import AwaitMount

from xl.errors import ArgumentParser
from xl.tui.app import AppOptions, XLApp, build_app
from xl.tui.backend import LocalBackend

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11

    from xl.launcher.control import RunHandle
    from xl.launcher.plan import Plan
    from xl.launcher.spec import LaunchSpec

READ_ONLY = ("Read-only: this app was served with `xl serve --read-only`; launching and stopping "
    "runs are off")


class ReadOnlyBackend(LocalBackend):
    """This machine's backend, less what changes it: starting and stopping runs."""

    read_only = True

    def start(self, spec: LaunchSpec, plan: Plan | None = None) -> tuple[RunHandle, str | None]:
        raise PermissionError(READ_ONLY)

    def stop(self, run_dir: Path) -> None:
        raise PermissionError(READ_ONLY)


class ViewerApp(XLApp):
    """The app for viewers: the Launch screen is never shown (its key is hidden; the GPUs screen's
    Launch button says why it does nothing)."""

    def __init__(self, **options: Unpack[AppOptions]) -> None:
        super().__init__(ReadOnlyBackend(), **options)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "screen" and parameters[:1] == ("launch",):
            return False
        return super().check_action(action, parameters)

    def switch_mode(self, mode: str) -> AwaitMount:
        if mode == "launch":
            self.notify(READ_ONLY, severity="warning")
            mode = self.current_mode  # switching to the mode shown is a no-op
        return super().switch_mode(mode)


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="xl serve's app", description="The xl app, as `xl serve` runs it for one browser tab."
    )
    parser.add_argument("--read-only", action="store_true", help="no Launch screen, no stop")
    ns = parser.parse_args(list(argv) if argv is not None else None)
    app: XLApp = ViewerApp() if ns.read_only else build_app()
    app.run()
    return app.return_code or 0


if __name__ == "__main__":
    raise SystemExit(main())
