"""A real headless Chromium (Debian's `chromium-headless-shell`) driven by Playwright, for `xl
serve`.

Playwright's own browser download is not used: it launches Debian's binary by
``executable_path``, without a sandbox or GPU and with its background networking off, and every
request that is not to loopback is refused (textual-serve's page asks a font site for a font).
``Tab`` keeps what the app sends the page through the websocket, as text without escape codes,
which is what the terminal in the page draws.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psutil

CANDIDATES = ("/usr/lib/chromium/chromium-headless-shell", "chromium-headless-shell")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--disable-domain-reliability",
    "--no-first-run",
    "--metrics-recording-only",
]
ESCAPES = re.compile(
    rb"\x1b(\[[0-9;?$<>=]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[()][0-9A-B]|[=>78])"
)


def chromium() -> str:
    for name in CANDIDATES:
        found = name if os.path.isabs(name) and os.access(name, os.X_OK) else shutil.which(name)
        if found:
            return found
    raise AssertionError(
        "Debian's `chromium-headless-shell` is not installed (the README's test command installs "
        "it)"
    )


class Tab:
    def __init__(self, page: Any) -> None:
        self.page = page
        self.frames: list[bytes] = []
        self.sockets: list[Any] = []
        page.on("websocket", self._socket)

    def _socket(self, ws: Any) -> None:
        self.sockets.append(ws)
        ws.on(
            "framereceived", lambda f: self.frames.append(f if isinstance(f, bytes) else f.encode())
        )

    def mark(self) -> int:
        return len(self.frames)

    def text(self, since: int = 0) -> str:
        return ESCAPES.sub(b"", b"".join(self.frames[since:])).decode("utf-8", "replace")

    def wait_text(self, needle: str, since: int = 0, timeout: float = 60) -> str:
        return self.wait(lambda: needle in self.text(since), f"{needle!r} from the app", timeout)

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            got = predicate()
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {what} after {timeout}s; the app sent: {self.text()[-800:]!r}"
                )
            self.page.wait_for_timeout(100)

    def press(self, key: str) -> int:
        """Type ``key`` into the page's terminal; returns the mark to read the answer from."""
        since = self.mark()
        self.page.focus("textarea.xterm-helper-textarea")  # a click would land on the app
        self.page.keyboard.press(key)
        return since


def _chromiums() -> list[psutil.Process]:
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "chrom" in proc.name() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            continue
    return out


@contextmanager
def browser() -> Iterator[Any]:
    """A browser context; on the way out every Chromium process it started must be gone."""
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 - a test dependency, loaded by the tests that drive a browser

    seen: list[psutil.Process] = []
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium(), args=ARGS, timeout=60_000)
        try:
            context = b.new_context(viewport={"width": 1280, "height": 800})
            context.route(
                "**/*",
                lambda route: (
                    route.continue_()
                    if route.request.url.startswith(("http://127.0.0.1", "ws://127.0.0.1"))
                    else route.abort()
                ),
            )
            seen = _chromiums()
            assert seen, "no Chromium process under this test"
            yield context
        finally:
            b.close()
    _, alive = psutil.wait_procs(seen, timeout=10)
    assert not [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], (
        "Chromium left running"
    )


def png_pixels(data: bytes) -> tuple[int, int, list[bytes], int]:
    """(width, height, rows, bytes per pixel) of an 8-bit RGB/RGBA PNG, as Chromium writes them."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, bpp = 8, b"", 0, 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, rows, bpp
