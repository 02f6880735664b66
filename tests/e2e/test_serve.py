"""`xl serve`: the app in a real headless Chromium, behind its token (docs/serve.md).

Each test starts `xl serve` as a person does, reads the one line it prints, drives Debian's
chromium-headless-shell through Playwright, and ends it with SIGTERM: the server, every app
process it started and every Chromium process must then be gone (tests/support/servers.py,
tests/support/browser.py). What the app draws is read from what it sends the page.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
from browser import Tab, browser, png_pixels
from procs import (
    XL,
    kill_run,
    run_dirs,
    run_json,
    run_processes,
    wait_for,
    wait_no_processes,
    xl_env,
)
from runfixtures import make_run
from servers import Served, served

from xl.listen import warn_if_exposed
from xl.tui.serve import KILL_AFTER_S, SHUTDOWN_S
from xl.tui.tabapp import READ_ONLY, ReadOnlyBackend

pytestmark = pytest.mark.e2e

LINE = re.compile(
    r"^xl: serving the app at (http://127\.0\.0\.1:(\d+))/\?token=([A-Za-z0-9_-]{20,})$"
)
PAGE_BACKGROUND = (12, 24, 31)  # textual-serve's page around the terminal (#0c181f)


def home_with_runs(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    make_run(home / "runs", "healthy")
    make_run(home / "runs", "failed")
    return home


def apps(server: Served) -> list[psutil.Process]:
    """The app processes `xl serve` runs now, one per open tab."""
    out = []
    for proc in server.family():
        try:
            if "xl.tui.tabapp" in " ".join(proc.cmdline()):
                out.append(proc)
        except psutil.Error:
            continue
    return out


def request(url: str, path: str, headers: dict[str, str] | None = None) -> int:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        return conn.getresponse().status
    finally:
        conn.close()


def ws_upgrade(
    base: str, *, token: str | None, origin: str | None, cookie_name: str | None = None
) -> int:
    headers = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    if origin:
        headers["Origin"] = origin
    path = "/ws" if token is None or cookie_name else f"/ws?token={token}"
    if cookie_name and token:
        headers["Cookie"] = f"{cookie_name}={token}"
    return request(base, path, headers)


def open_tab(context, url: str) -> Tab:
    tab = Tab(context.new_page())
    tab.page.goto(url)
    tab.wait_text("xl — GPUs")
    return tab


def test_the_page_needs_the_token_and_runs_the_app_keys_and_all(tmp_path: Path) -> None:
    home = home_with_runs(tmp_path)
    with served(["serve", "--port", "0"], xl_env(home)) as server, browser() as context:
        found = LINE.match(server.line)
        assert found, server.line
        base, token = found.group(1), found.group(3)
        page = context.new_page()
        # No token, a wrong one: refused, and no app starts.
        assert page.goto(base + "/").status == 403
        assert page.goto(f"{base}/?token={token}x").status == 403
        assert "open the URL" in page.inner_text("body")
        assert apps(server) == []
        tab = Tab(page)
        page.goto(f"{base}/?token={token}")
        assert page.url == base + "/", "the token stays in the address bar"
        tab.wait_text("xl — GPUs")
        (app,) = apps(server)
        assert app.environ().get("TEXTUAL_DRIVER", "").endswith("WebDriver")
        shot_gpus = page.screenshot()
        since = tab.press("4")
        tab.wait_text("20260530-healthy", since)
        tab.wait_text("20260530-failed", since)
        shot_runs = page.screenshot()
        since = tab.press("2")
        tab.wait_text("xl — Doctor", since)
        # What the page shows: the app's screen (not textual-serve's start or "Session ended"
        # dialogs, drawn on its own background), and a new one after a key.
        w, h, gpus, bpp = png_pixels(shot_gpus)
        _, _, runs, _ = png_pixels(shot_runs)
        assert (w, h) == (1280, 800)
        colours = Counter(row[x : x + 3] for row in runs[::8] for x in range(0, w * bpp, 8 * bpp))
        assert colours[bytes(PAGE_BACKGROUND)] < sum(colours.values()) * 0.05, colours.most_common(
            3
        )
        assert len(colours) > 5, "the screen has text and colour"
        changed = sum(a != b for a, b in zip(gpus, runs, strict=True))
        assert changed > h // 10, "the Runs screen looks like the GPUs screen"
        # The cookie carries the token for the page's own requests; Origin is checked too.
        cookie = next(c for c in context.cookies() if c["name"].startswith("xl_serve_"))
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert request(base, "/static/js/textual.js") == 403
        assert (
            request(base, "/static/js/textual.js", {"Cookie": f"{cookie['name']}={token}"}) == 200
        )
        assert ws_upgrade(base, token=None, origin=base) == 403
        assert ws_upgrade(base, token=token, origin="http://evil.example") == 403
        assert ws_upgrade(base, token=token, origin=None) == 403
        assert (
            ws_upgrade(
                base,
                token=token,
                origin=base.replace("127.0.0.1", "localhost"),
                cookie_name=cookie["name"],
            )
            == 101
        )
        page.close()
        wait_for(lambda: not apps(server), timeout=30, what="the closed tab's app to end")


def test_three_tabs_three_apps_a_closed_tab_leaves_none_and_sigterm_ends_all(
    tmp_path: Path,
) -> None:
    home = home_with_runs(tmp_path)
    env = xl_env(home, XL_SERVE_TOKEN="a-token-from-the-environment")
    with served(["serve", "--port", "0"], env) as server, browser() as context:
        assert server.line.endswith("/?token=a-token-from-the-environment"), server.line
        tabs = [open_tab(context, server.url) for _ in range(3)]
        running = wait_for(
            lambda: len(a := apps(server)) == 3 and a, timeout=30, what="three app processes"
        )
        assert len({p.pid for p in running}) == 3
        for app in running:
            assert "XL_SERVE_TOKEN" not in app.environ(), "the apps never see the token"
        tabs[1].page.close()
        left = wait_for(
            lambda: len(a := apps(server)) == 2 and a,
            timeout=30,
            what="the closed tab's app to end",
        )
        assert {p.pid for p in left} < {p.pid for p in running}
        # The other two still answer their own keys.
        for tab in (tabs[0], tabs[2]):
            tab.wait_text("20260530-failed", tab.press("4"))
        # Leaving the block sends SIGTERM with two tabs open: served() checks nothing is left.


def test_read_only_has_no_launch_and_no_stop(tmp_path: Path) -> None:
    home = home_with_runs(tmp_path)
    # the newest: first in Runs
    make_run(home / "runs", "straggler", t0=time.time() - 30, run_id="live-run")
    with (
        served(["serve", "--port", "0", "--read-only"], xl_env(home)) as server,
        browser() as context,
    ):
        tab = open_tab(context, server.url)
        tab.page.wait_for_timeout(500)
        since = tab.press("3")
        tab.page.wait_for_timeout(1500)
        assert "xl — Launch" not in tab.text(since)
        since = tab.press("L")
        tab.wait_text("Read-only", since)
        assert "xl — Launch" not in tab.text(since)
        # Still a viewer: the runs are there and their Monitor opens, with no Stop run to press.
        tab.wait_text("live-run", tab.press("4"))
        since = tab.press("Enter")
        tab.wait_text("Detach", since)
        assert "Stop run" not in tab.text(since)
        since = tab.press("s")
        tab.page.wait_for_timeout(1500)
        assert "Stop run live-run?" not in tab.text(since)
    assert json.loads((home / "runs" / "live-run" / "run.json").read_text())["status"] == "running"
    with pytest.raises(PermissionError, match="read-only"):
        ReadOnlyBackend().stop(home / "runs" / "20260530-healthy")
    assert "--read-only" in READ_ONLY


@contextmanager
def forwarder(listen_port: int) -> Iterator[list[int]]:
    """A TCP tunnel on ``listen_port`` to the port put in the list it yields (as ``ssh -L``)."""
    target: list[int] = []
    lsock = socket.create_server(("127.0.0.1", listen_port))
    lsock.settimeout(0.2)
    stop = threading.Event()

    def pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = lsock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", target[0]))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield target
    finally:
        stop.set()
        thread.join(5)
        lsock.close()


def test_public_url_serves_through_a_tunnel(tmp_path: Path) -> None:
    """Behind a tunnel the browser's address is the tunnel's: --public-url makes the page's
    websocket and the Origin check use it."""
    home = home_with_runs(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        tunnel = s.getsockname()[1]
    public = f"http://127.0.0.1:{tunnel}"
    with (
        forwarder(tunnel) as target,
        served(["serve", "--port", "0", "--public-url", public], xl_env(home)) as server,
        browser() as context,
    ):
        assert server.line.startswith(f"xl: serving the app at {public}/?token="), server.line
        token = server.line.rsplit("=", 1)[1]
        port = int(
            next(
                c.laddr.port
                for c in psutil.Process(server.proc.pid).net_connections("tcp")
                if c.status == "LISTEN"
            )
        )
        target.append(port)
        tab = open_tab(context, server.url)
        tab.wait_text("20260530-healthy", tab.press("4"))
        assert tab.sockets[0].url.startswith(f"ws://127.0.0.1:{tunnel}/ws")
        # Straight to the server, a page of the tunnel's origin is fine; any other is not.
        direct = f"http://127.0.0.1:{port}"
        assert ws_upgrade(direct, token=token, origin="http://127.0.0.1:1") == 403
        tab.page.close()
        wait_for(lambda: not apps(server), timeout=30, what="the tab's app to end")


def test_a_taken_port_is_one_line_and_exposure_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*XL, "serve", "--port", str(port)],
            env=xl_env(tmp_path / "home"),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1 and done.stdout == ""
    assert (
        done.stderr.count("\n") == 1
        and f"cannot listen on 127.0.0.1:{port}" in done.stderr
        and "--port" in done.stderr
    )
    warn_if_exposed("xl serve", "0.0.0.0")
    warn_if_exposed("xl serve", "::1")
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "0.0.0.0" in err


def test_the_served_app_speaks_first_on_stdout_with_no_terminal(tmp_path: Path) -> None:
    """As textual-serve runs it: stdin and stdout are pipes, TEXTUAL_DRIVER names the web driver.
    The app neither refuses (no terminal) nor writes anything before the driver's first line, and
    it quits when told to, as textual-serve tells it when the tab closes."""
    env = xl_env(
        home_with_runs(tmp_path),
        TEXTUAL_DRIVER="textual.drivers.web_driver:WebDriver",
        COLUMNS="100",
        ROWS="30",
    )
    proc = subprocess.Popen(
        [*XL[:1], "-m", "xl.tui.tabapp"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == b"__GANGLION__\n"
        quit_ = json.dumps({"type": "quit"}).encode()
        proc.stdin.write(b"M" + len(quit_).to_bytes(4, "big") + quit_)
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_behind_a_proxy_path_the_page_and_its_websocket_are_under_it(tmp_path: Path) -> None:
    with served(
        ["serve", "--port", "0", "--public-url", "https://proxy.example.org/xl/"],
        xl_env(tmp_path / "home"),
    ) as server:
        assert server.line.startswith(
            "xl: serving the app at https://proxy.example.org/xl/?token="
        ), server.line
        token = server.line.rsplit("=", 1)[1]
        port = int(
            next(
                c.laddr.port
                for c in psutil.Process(server.proc.pid).net_connections("tcp")
                if c.status == "LISTEN"
            )
        )
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("GET", f"/?token={token}&fontsize=14")
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 303 and resp.headers["Location"] == "/xl/?fontsize=14"
            cookie = resp.headers["Set-Cookie"].split(";")[0]
            conn.request("GET", "/", headers={"Cookie": cookie})
            page = conn.getresponse().read().decode()
        finally:
            conn.close()
        assert 'data-session-websocket-url="wss://proxy.example.org/xl/ws"' in page
        assert (
            ws_upgrade(
                f"http://127.0.0.1:{port}",
                token=token,
                origin="https://proxy.example.org",
                cookie_name=cookie.split("=")[0],
            )
            == 101
        )
        assert (
            ws_upgrade(
                f"http://127.0.0.1:{port}",
                token=token,
                origin="https://other.example.org",
                cookie_name=cookie.split("=")[0],
            )
            == 403
        )


def test_tabs_past_the_cap_get_a_page_that_says_so_and_no_app(tmp_path: Path) -> None:
    home = home_with_runs(tmp_path)
    with (
        served(["serve", "--port", "0", "--max-tabs", "2"], xl_env(home)) as server,
        browser() as context,
    ):
        tabs = [open_tab(context, server.url) for _ in range(2)]
        wait_for(lambda: len(apps(server)) == 2, timeout=30, what="two app processes")
        third = context.new_page()
        response = third.goto(server.url)
        assert response is not None and response.status == 503
        assert "2 tabs already open" in third.inner_text(
            "body"
        ) and "--max-tabs 2" in third.inner_text("body")
        # However the page was had, a websocket past the cap starts no app.
        base = server.url.split("/?", 1)[0]
        token = server.url.rsplit("=", 1)[1]
        assert ws_upgrade(base, token=token, origin=base) == 503
        third.wait_for_timeout(1000)
        assert len(apps(server)) == 2
        # A tab closed makes room: the reloaded page runs the app.
        tabs[0].page.close()
        wait_for(lambda: len(apps(server)) == 1, timeout=30, what="the closed tab's app to end")
        third.close()
        tabs.append(open_tab(context, server.url))
        wait_for(lambda: len(apps(server)) == 2, timeout=30, what="the new tab's app")
        tabs[2].wait_text("20260530-failed", tabs[2].press("4"))


def _steps(log: Path, start: int, count: int) -> str:
    """``count`` numbered lines appended to a rank's log; the last one."""
    lines = [f"[rank 0] step {i:06d} loss 2.2470" for i in range(start, start + count)]
    with open(log, "a") as fh:
        fh.write("".join(line + "\n" for line in lines))
    return lines[-1]


def test_the_monitor_in_the_browser_follows_a_log_already_long(tmp_path: Path) -> None:
    """The same app as in a terminal: a rank's log 3,000 lines long when its Monitor opens shows
    its newest line, and the lines it writes next (a view left behind its end never drew them);
    the mouse wheel scrolls it back (its title says so, and new lines leave it where it is), `f`
    follows again."""
    home = home_with_runs(tmp_path)
    run = make_run(home / "runs", "straggler", t0=time.time() - 30, run_id="live-run")
    last = _steps(run / "logs" / "rank-0.log", 0, 3000)
    with served(["serve", "--port", "0"], xl_env(home)) as server, browser() as context:
        tab = open_tab(context, server.url)
        tab.wait_text("live-run", tab.press("4"))
        since = tab.press("Enter")
        tab.wait_text("Log — rank 0 (following)", since)
        tab.wait_text(last, since)
        for start in (3000, 3040):
            since = tab.mark()
            last = _steps(run / "logs" / "rank-0.log", start, 40)
            tab.wait_text(last, since)
        since = tab.mark()
        tab.page.mouse.move(1000, 650)  # over the log pane, in the page's lower right
        tab.page.mouse.wheel(0, -600)
        tab.wait_text("scrolled back: f follows", since)
        since = tab.mark()
        last = _steps(run / "logs" / "rank-0.log", 3080, 40)
        tab.page.wait_for_timeout(3000)  # polls enough to have drawn them, were it following
        assert last not in tab.text(since)
        since = tab.press("f")
        tab.wait_text("Log — rank 0 (following)", since)
        tab.wait_text(last, since)


@pytest.mark.parametrize("tabs", [1, 0], ids=["a tab open", "no tab"])
def test_sigterm_ends_the_server_and_every_app_at_once(tmp_path: Path, tabs: int) -> None:
    """SIGTERM with a tab open: the server and the tab's app are gone within 2 s (asking the app
    to quit took 12 s); with none open, as fast."""
    home = home_with_runs(tmp_path)
    with browser() as context, served(["serve", "--port", "0"], xl_env(home)) as server:
        for _ in range(tabs):
            open_tab(context, server.url)
        wait_for(lambda: len(apps(server)) == tabs, timeout=30, what="the tabs' apps")
        running = apps(server)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=30)
        took = time.monotonic() - started
        assert code == 0
        assert not [p for p in running if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        # The server's own waits add up to 2 s at most (SHUTDOWN_S + 2 x KILL_AFTER_S, checked
        # below); what is over them is a busy machine's scheduling, given a second.
        assert took < 3.0, f"xl serve took {took:.1f} s to end after SIGTERM"
    assert SHUTDOWN_S + 2 * KILL_AFTER_S <= 2.0


# Trains until the test lets it end (the file its first argument names exists), so a loaded
# machine that is slow to show the run's processes cannot see it finish before SIGTERM is sent.
TRAIN = """
import os, sys, time
import xl

step = 0
deadline = time.monotonic() + 300
while step < 40 or not os.path.exists(sys.argv[1]):
    step += 1
    time.sleep(0.25)
    xl.log(step=step, loss=1.0 / step)
    if time.monotonic() > deadline:
        sys.exit("never released")
print("trained to the last step", flush=True)
"""


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def type_text(tab: Tab, text: str) -> None:
    tab.page.focus("textarea.xterm-helper-textarea")
    tab.page.keyboard.type(text)


def test_sigterm_to_serve_leaves_a_run_launched_from_a_tab_training(tmp_path: Path) -> None:
    """A run launched in a browser tab outlives `xl serve` as it outlives a terminal: SIGTERM to
    the server ends the tab's app (and the server), never the run's supervisor or its ranks,
    which train to their last step and leave no process behind."""
    home = tmp_path / "home"
    (tmp_path / "train.py").write_text(TRAIN)
    with browser() as context, served(["serve", "--port", "0"], xl_env(home)) as server:
        tab = open_tab(context, server.url)
        (app,) = apps(server)
        since = tab.press("3")
        tab.wait_text("xl — Launch", since)
        since = tab.mark()
        release = tmp_path / "release"
        type_text(tab, str(tmp_path / "train.py"))  # the Script field has the focus
        tab.press("Tab")
        type_text(tab, str(release))  # Args
        for _ in range(2):  # GPUs, then Processes/node
            tab.press("Tab")
        type_text(tab, "2")
        tab.wait_text("✓ ready: 2 process(es)", since)
        since = tab.press("Control+r")
        run_dir = wait_for(
            lambda: next(iter(run_dirs(home)), None),
            timeout=60,
            what="the tab's run",
            explain=lambda: tab.text()[-3000:],
        )
        try:
            tab.wait_text("rank", since)
            wait_for(
                lambda: (
                    len(run_processes(run_dir)) >= 3
                    and len(rows := run_json(run_dir).get("ranks") or []) == 2
                    and all(r.get("pid") for r in rows)
                ),
                timeout=90,
                what="the run's supervisor and its two ranks, each with its pid in run.json",
                explain=lambda: f"{run_processes(run_dir)}; run.json: {run_json(run_dir)}",
            )
            supervisor = psutil.Process(run_json(run_dir)["supervisor_pid"])
            ranks = [psutil.Process(r["pid"]) for r in run_json(run_dir)["ranks"]]
            assert len(ranks) == 2
            # The case in question: the run's processes are under the tab's app, so under serve.
            under_app = {p.pid for p in app.children(recursive=True)}
            assert {supervisor.pid, *(r.pid for r in ranks)} <= under_app
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(timeout=30) == 0
            psutil.wait_procs([app], timeout=10)
            assert not _running(app), "the tab's app outlived xl serve"
            assert all(_running(p) for p in (supervisor, *ranks)), (
                "SIGTERM to xl serve ended the run"
            )
            release.touch()
            wait_for(
                lambda: run_json(run_dir).get("status") not in (None, "running", "starting"),
                timeout=120,
                what="the run to finish",
            )
            run = run_json(run_dir)
            assert run["status"] == "succeeded", run
            for rank in range(len(ranks)):
                log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
                assert "trained to the last step" in log, log[-500:]
            wait_no_processes(run_dir, timeout=30)
        finally:
            kill_run(run_dir)
