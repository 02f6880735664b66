"""``xl serve``: the app in a browser, one app process per tab, behind a token (docs/serve.md).

textual-serve does the serving: its aiohttp app gives each websocket its own ``python -m
xl.tui.tabapp`` and ends it when the tab closes. xl wraps that app, without copying it, in one
aiohttp middleware that every request passes:

- the token (``?token=`` or, after the first page load, a cookie) or HTTP 403, for the page,
  its static files, downloads and the websocket alike: an app reachable without it would let any
  local user of a shared login node run code as you;
- the websocket's Origin must be this server's own (or ``--public-url``'s): a page of another
  site the browser has open cannot drive the app with the cookie;
- at most ``--max-tabs`` apps at once (each is a process of ~35 MiB that redraws on its own): the
  next tab gets a page that says so (HTTP 503), and a websocket past the cap is refused, however
  the page was had.

It prints one line on stdout and nothing else there (textual-serve's own logs go to stderr), and
runs until SIGINT/SIGTERM; then every app process it started is ended too, and no run: a run
launched from a tab lives in its own session and outlives the server, as it outlives a terminal.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

import psutil

from xl import envnames
from xl.address import format_address, url_host
from xl.errors import ArgumentParser, UsageError
from xl.listen import (
    add_listen_options,
    is_loopback,
    port_in_use,
    same_token,
    token_from,
    warn_if_exposed,
)

if TYPE_CHECKING:
    from aiohttp import web

PROG = "xl serve"
TOKEN_VAR = envnames.SERVE_TOKEN
# After SIGINT/SIGTERM (all within 2 s): how long the open tabs' connections get to close once
# their apps are ended, then how long an app gets between SIGTERM and SIGKILL.
SHUTDOWN_S = 1.0
KILL_AFTER_S = 0.5
# Tabs (app processes) one server runs at once: a person's few windows, not a viewer's 40 tabs
# (40 apps took 1.1-1.6 GiB and a load of 20 on the login node they shared).
MAX_TABS = 8


def full_page(limit: int) -> str:
    """What a tab past the cap shows instead of the app."""
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>xl serve: all tabs in "
        "use</title></head>"
        f"<body><h1>xl serve: {limit} tab{'s' if limit != 1 else ''} already open</h1>"
        f"<p>This server runs at most {limit} apps at once (<code>xl serve --max-tabs "
        f"{limit}</code>). "
        "Close another tab of it, then reload this page.</p></body></html>\n"
    )


def origins(host: str, port: int, public_url: str | None) -> set[str]:
    """The Origins a websocket may come from: this server's address (every spelling of loopback
    when it is on loopback) and the public URL's origin."""
    hosts = {url_host(host)}
    if is_loopback(host):
        hosts |= {"127.0.0.1", "localhost", "[::1]"}
    out = {f"http://{format_address(h, port)}" for h in hosts}
    if public_url:
        parts = urlsplit(public_url)
        out.add(f"{parts.scheme}://{parts.netloc}".lower())
    return out


class TabServer(Protocol):
    """What `xl serve` uses of the textual-serve server that make_server builds: one app process
    per browser tab, behind the token and the Origin check."""

    port: int
    public_url: str
    allowed: set[str]  # the Origins a websocket may come from

    def initialize_logging(self) -> None: ...

    async def _make_app(self) -> web.Application: ...


def make_server(
    command: str, host: str, port: int, public_url: str | None, token: str, max_tabs: int = MAX_TABS
) -> TabServer:
    from aiohttp import web  # noqa: PLC0415 - an extra (xl-cluster[serve]); main() checked it
    from textual_serve.server import Server  # noqa: PLC0415 - an extra (xl-cluster[serve]); main() checked it

    class TokenServer(Server):
        """textual-serve's server with every request behind the token, the websocket behind the
        Origin check, and nothing of its own on stdout."""

        cookie = f"xl_serve_{os.getpid()}"  # cookies ignore ports: two servers keep theirs apart
        allowed: set[str]  # the Origins a websocket may come from: set once the port is bound
        tabs = 0  # websockets open now: each drives one app process until it closes

        def initialize_logging(self) -> None:
            logging.basicConfig(
                level=logging.WARNING, format="xl serve: %(message)s", stream=sys.stderr
            )

        async def on_startup(self, app: web.Application) -> None:
            pass  # textual-serve prints a banner here; the one line is printed once bound

        async def _make_app(self) -> web.Application:
            app = await super()._make_app()
            app.middlewares.append(self.check_request)
            return app

        @web.middleware
        async def check_request(
            self,
            request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        ) -> web.StreamResponse:
            given = request.query.get("token")
            if not (
                same_token(given, token) or same_token(request.cookies.get(self.cookie), token)
            ):
                raise web.HTTPForbidden(
                    text="xl serve: open the URL that `xl serve` printed (with its ?token=)\n"
                )
            if (
                request.path == "/ws"
                and (request.headers.get("Origin") or "").lower() not in self.allowed
            ):
                raise web.HTTPForbidden(text="xl serve: this page's origin may not open the app\n")
            if request.path in ("/", "/ws") and self.tabs >= max_tabs:
                raise web.HTTPServiceUnavailable(text=full_page(max_tabs), content_type="text/html")
            if request.path == "/ws":
                # The handler returns once the tab is gone and its app has been ended.
                self.tabs += 1
                try:
                    return await handler(request)
                finally:
                    self.tabs -= 1
            if given is not None and request.path == "/":
                # The token moves from the address bar into a cookie the page's requests carry.
                rest = {k: v for k, v in request.query.items() if k != "token"}
                # Relative, under --public-url's path: a proxy's /prefix/ stays, and so does
                # the host the browser used (the cookie is that host's).
                prefix = urlsplit(self.public_url).path.rstrip("/")
                found = web.HTTPSeeOther(prefix + str(request.rel_url.with_query(rest)))
                found.set_cookie(self.cookie, token, httponly=True, samesite="Strict", path="/")
                raise found
            response = await handler(request)
            response.headers.setdefault("Referrer-Policy", "no-referrer")
            return response

    server = TokenServer(command, host=host, port=port, title="xl", public_url=public_url)
    server.allowed = origins(host, port, public_url)
    return server


async def serve(
    server: TabServer, host: str, port: int, public_url: str | None, token: str
) -> int:
    from aiohttp import web  # noqa: PLC0415 - an extra (xl-cluster[serve]); main() checked it

    server.initialize_logging()
    runner = web.AppRunner(
        await server._make_app(), shutdown_timeout=SHUTDOWN_S, handle_signals=False
    )
    await runner.setup()
    site = web.TCPSite(runner, host.strip("[]"), port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        sys.stderr.write(port_in_use(PROG, host, port, exc) + "\n")
        return 1
    bound = int(runner.addresses[0][1])
    server.port = bound
    server.public_url = (public_url or f"http://{format_address(host, bound)}").rstrip("/")
    server.allowed = origins(host, bound, public_url)
    warn_if_exposed(PROG, host)
    # Ready for SIGINT and SIGTERM before the address is said: whoever reads it may stop the
    # server at once, and that stop is the same clean one.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"xl: serving the app at {server.public_url}/?token={token}", flush=True)
    # One line on stdout: what the apps write to stderr, textual-serve copies to stdout.
    sys.stdout = sys.stderr
    await stop.wait()
    # The tabs' apps are ended first, not asked to quit through their pipes: asked, one open tab
    # held `xl serve` 12 s (each app's own exit, then its websocket's close). Ended, each tab's
    # connection closes at once and the server stops in well under a second.
    kids = terminate_children()
    try:
        await asyncio.wait_for(runner.cleanup(), SHUTDOWN_S)
    except asyncio.TimeoutError:
        pass
    end_children(kids)
    return 0


def children() -> list[psutil.Process]:
    """The processes under `xl serve` that are its to end: the tabs' apps and what they run in
    serve's own session. A process in a session of its own is never one of them, nor is anything
    under it: a run's supervisor starts its own session (setsid) because a run outlives the app
    that launched it, and its ranks are in that session or a newer one, never serve's."""
    try:
        own = os.getsid(0)
    except OSError:
        return []
    out = []
    for kid in psutil.Process().children(recursive=True):
        try:
            if os.getsid(kid.pid) == own:
                out.append(kid)
        except OSError:  # gone already
            continue
    return out


def terminate_children() -> list[psutil.Process]:
    """SIGTERM to every process of `xl serve`'s own (the tabs' apps, never a run they
    launched); those processes."""
    kids = children()
    for kid in kids:
        try:
            kid.terminate()
        except psutil.Error:
            pass
    return kids


def end_children(kids: list[psutil.Process]) -> None:
    """Those of ``kids`` (and any process started since) still running after KILL_AFTER_S get
    SIGKILL: none outlives `xl serve`."""
    kids = [*kids, *(k for k in terminate_children() if k not in kids)]
    _, alive = psutil.wait_procs(kids, timeout=KILL_AFTER_S)
    for kid in alive:
        try:
            kid.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=KILL_AFTER_S)


def main(argv: Sequence[str]) -> int:
    p = ArgumentParser(
        prog=PROG, description="Serve the xl app in a browser: one app per tab, behind a token."
    )
    add_listen_options(p, 8765)
    p.add_argument(
        "--public-url",
        metavar="URL",
        help="the URL browsers use, behind an SSH tunnel or a proxy (e.g. https://host/xl)",
    )
    p.add_argument(
        "--read-only", action="store_true", help="for viewers: no Launch screen, no stop"
    )
    p.add_argument(
        "--max-tabs",
        type=int,
        default=MAX_TABS,
        metavar="N",
        help=f"apps (browser tabs) served at once; the next tab is told so (default {MAX_TABS})",
    )
    ns = p.parse_args(list(argv))
    if ns.max_tabs < 1:
        raise UsageError(f"--max-tabs {ns.max_tabs}: at least 1")
    if not 0 <= ns.port <= 65535:
        raise UsageError(f"--port {ns.port} is not a port (0-65535)")
    if ns.public_url and urlsplit(ns.public_url).scheme not in ("http", "https"):
        raise UsageError(f"--public-url {ns.public_url!r} is not an http:// or https:// URL")
    if (
        importlib.util.find_spec("textual_serve") is None
    ):  # an extra: say how to get it, not a traceback
        raise UsageError("needs textual-serve: pip install 'xl-cluster[serve]'")
    token = token_from(TOKEN_VAR)
    os.environ.pop(TOKEN_VAR, None)  # the apps (and the runs they launch) never see it
    command = f"exec {shlex.quote(sys.executable)} -m xl.tui.tabapp" + (
        " --read-only" if ns.read_only else ""
    )
    server = make_server(command, ns.host, ns.port, ns.public_url, token, ns.max_tabs)
    return asyncio.run(serve(server, ns.host, ns.port, ns.public_url, token))
