"""A Linux terminal driver whose input thread sleeps until there is input.

Textual's LinuxDriver reads keys in a thread that wakes every 0.1 s whether or not a key came:
to notice that the app is closing, and to let the key parser time out a lone Escape. Ten
wake-ups a second were about a tenth of the Monitor's CPU in bench_tui. This driver's thread
waits on the terminal and on a pipe instead: the pipe is written when the app asks the thread to
stop, and the wait is bounded only while the parser has a timeout pending (the moment a lone
Escape becomes a key), so it wakes when there is something to do and not otherwise.

Everything else, and every other platform, is Textual's own driver. It leans on a few of
Textual's internals (the key parser, the driver's input loop); a Textual without them fails this
module's import, and the app then uses Textual's driver as it is (XLApp.get_driver_class).
"""

from __future__ import annotations

import os
import selectors
import threading
from codecs import getincrementaldecoder
from typing import Any

from textual._time import get_time
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver

if not all(hasattr(LinuxDriver, name) for name in ("run_input_thread", "process_message", "close")):
    raise ImportError("this Textual's LinuxDriver has no input loop to replace")

# Textual's own poll: how often the thread looks for a parser timeout when it cannot tell when
# the next one is due (a Textual whose parser no longer keeps `_timeout_time`).
FALLBACK_POLL_S = 0.1
_UNKNOWN = object()


class _WakingEvent(threading.Event):
    """The driver's exit event: setting it also wakes the input thread's wait."""

    def __init__(self, wake_fd: int) -> None:
        super().__init__()
        self.wake_fd: int | None = wake_fd

    def set(self) -> None:
        super().set()
        if self.wake_fd is not None:
            try:
                os.write(self.wake_fd, b"x")
            except BlockingIOError:  # the pipe is full: a wake is pending anyway
                pass


class QuietLinuxDriver(LinuxDriver):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._waking_event = _WakingEvent(self._wake_w)
        self.exit_event = self._waking_event

    def run_input_thread(self) -> None:
        fileno = self.fileno
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode

        def timeout() -> float | None:
            due: object = getattr(parser, "_timeout_time", _UNKNOWN)
            if isinstance(due, float):
                return max(0.0, due - get_time())
            return None if due is None else FALLBACK_POLL_S

        def read_keys(final: bool = False) -> bool:
            """Feed what the terminal has to the parser; False once the input has ended."""
            data = decode(os.read(fileno, 4096), final=final)
            if not data:
                return False
            for event in parser.feed(data):
                self.process_message(event)
            return True

        selector = selectors.SelectSelector()
        selector.register(fileno, selectors.EVENT_READ)
        selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self.exit_event.is_set():
                for key, _mask in selector.select(timeout()):
                    if key.fd == self._wake_r:
                        _drain(self._wake_r)
                    elif not read_keys():
                        # stdin ended (a pipe): stop watching it rather than spin on EOF.
                        selector.unregister(fileno)
                for event in parser.tick():
                    self.process_message(event)
            if any(key.fd == fileno for key, _ in selector.select(0)):
                read_keys(final=True)
        finally:
            selector.close()
            try:
                for _event in parser.feed(""):
                    pass
            except Exception:  # the parser's EOF complaints; the app is closing
                pass

    def close(self) -> None:
        super().close()
        self._waking_event.wake_fd = None  # a later set() must not write to a reused fd
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 64):
            pass
    except BlockingIOError:
        pass
