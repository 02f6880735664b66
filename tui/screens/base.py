"""The base of the app's screens: the app and its backend, typed, in one place."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual.screen import Screen

if TYPE_CHECKING:
    from xl.tui.app import XLApp
    from xl.tui.backend import Backend


class XLScreen(Screen[None]):
    """A screen of ``XLApp``: screens read the domain through ``backend`` and call the app's own
    methods (open a run, detach) through ``xl``; they never set the app's attributes."""

    @property
    def xl(self) -> XLApp:
        """The app, typed (Textual's ``self.app`` is any App)."""
        return cast("XLApp", self.app)

    @property
    def backend(self) -> Backend:
        """The app's way to GPUs, the doctor, the launcher and the run store (may block: call it
        from a thread worker)."""
        return self.xl.backend
