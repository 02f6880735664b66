"""`xl serve` and `xl exporter` against the attacks that held when first tried, done again for
real so they keep holding (docs/security.md): a forged Host, paths out of the served files and
the token in a Referer against the real `xl serve`; a run name that tries to add labels and
series to the real exporter, scraping a real run. Every request goes over a real socket, its
path on the wire exactly as written; every server is ended with SIGTERM and checked gone
(tests/support/servers.py).
"""

from __future__ import annotations

import http.client
import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from procs import end_run, wait_ranks_running, wait_run, xl, xl_env
from runfixtures import make_run
from servers import served

pytestmark = pytest.mark.e2e

# argv: GO_FILE. Prints, then waits for the go file (at most two minutes: never outlives a test).
WAIT_FOR_GO = """
import os, sys, time
print("ready", flush=True)
deadline = time.time() + 120
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.05)
"""


def _get(base: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """One raw request: the path goes on the wire exactly as given (no client normalising)."""
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        for key, value in headers.items():
            conn.putheader(key, value)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_serve_takes_no_forged_host_no_path_out_of_its_files_and_keeps_its_token_out_of_referers(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    make_run(home / "runs", "healthy")
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the browser\n")
    with served(["serve", "--port", "0"], xl_env(home)) as server:
        base = server.url.split("/?")[0]
        token = server.url.split("token=")[1]
        port = urlsplit(base).port
        here = f"127.0.0.1:{port}"
        # The token moves into a cookie the page's scripts cannot read and other sites do not
        # send, and off the address bar, so no link the page follows can carry it.
        status, headers, _ = _get(base, f"/?token={token}", {"Host": here})
        assert status == 303 and "token" not in headers["location"], headers
        cookie = headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie, cookie
        jar = cookie.split(";")[0]
        status, headers, body = _get(base, "/", {"Host": here, "Cookie": jar})
        assert status == 200 and token.encode() not in body
        assert headers.get("referrer-policy") == "no-referrer", headers
        # A forged Host (a DNS rebinding page): without the token nothing, and the websocket
        # is judged by its Origin against the address it was bound to, not the Host it names.
        evil = f"evil.example:{port}"
        assert _get(base, "/", {"Host": evil})[0] == 403
        upgrade = {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        }
        assert (
            _get(base, "/ws", {**upgrade, "Host": evil, "Origin": f"http://{evil}", "Cookie": jar})[
                0
            ]
            == 403
        )
        assert (
            _get(base, "/ws", {**upgrade, "Host": here, "Origin": f"http://{evil}", "Cookie": jar})[
                0
            ]
            == 403
        )
        # Paths out of the served files, with the token: never a byte of a file outside.
        rel = os.path.relpath(secret, "/")
        for path in (
            f"/static/../../../../../../../../{rel}",
            f"/static/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/{rel}",
            f"/static/..%2f..%2f..%2f..%2f..%2f..%2f..%2f..%2f{rel.replace('/', '%2f')}",
            "/static/../../../../../../../../etc/passwd",
            f"/static//{secret}",
        ):
            status, _, body = _get(base, path, {"Host": here, "Cookie": jar})
            assert b"not for the browser" not in body and b"root:" not in body, (path, status)
            assert status in (400, 403, 404), (path, status)
        # The cookie's token is what opens it: the same requests without it are refused.
        assert _get(base, "/static/js/textual.js", {"Host": here})[0] == 403
        assert _get(base, "/static/js/textual.js", {"Host": here, "Cookie": jar})[0] == 200


def test_a_run_name_cannot_inject_labels_or_series_into_the_exporter(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415 - a test extra

    home = tmp_path / "home"
    env = xl_env(home, XL_EXPORTER_TOKEN="t0k")
    (tmp_path / "train.py").write_text(WAIT_FOR_GO)
    go = tmp_path / "go"
    name = 'evil"} xl_forged{run_id="x"} 1\n# TYPE xl_forged gauge\\'
    done = xl(
        ["launch", "--detach", "--name", name, "--nproc", "1", "train.py", str(go)],
        env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = wait_run(home)
    try:
        wait_ranks_running(run_dir, 1, timeout=90)
        with served(["exporter", "--port", "0"], env) as ex:
            parts = urlsplit(ex.url)
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
            conn.request("GET", parts.path, headers={"Authorization": "Bearer t0k"})
            resp = conn.getresponse()
            text = resp.read().decode()
            conn.close()
            assert resp.status == 200
            samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
            assert not [s for s in samples if "forged" in s.name], text[:2000]
            (info,) = [s for s in samples if s.name == "xl_run_info"]
            assert info.labels["name"] == name and info.labels["run_id"] == run_dir.name, (
                info.labels
            )
            assert {s.labels.get("run_id") for s in samples if "run_id" in s.labels} == {
                run_dir.name
            }
    finally:
        go.touch()
        end_run(None, run_dir, timeout=60)
