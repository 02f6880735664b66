"""A real Prometheus (Debian's `prometheus`) on loopback for the exporter's tests.

``with prometheus(tmp, "127.0.0.1:9400", token_file) as prom: prom.query("xl_train_step")``
starts it scraping that target every second with the bearer token read from ``token_file``
(as docs/exporter.md tells a person to), waits until it is ready, and on the way out stops it
and checks its process is gone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
from procs import free_port

CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: xl
    scrape_interval: 1s
    scrape_timeout: 1s
    authorization:
      type: Bearer
      credentials_file: {token_file}
    static_configs:
      - targets: ["{target}"]
"""


class Prometheus:
    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.proc = proc
        self.log = log

    def _get(self, path: str, params: dict[str, str]) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body.get("status") == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar) ``expr`` has now: a list of {"metric", "value"}."""
        data = self._get("/api/v1/query", {"query": expr})
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def label_values(self, label: str, match: str) -> list[str]:
        return list(self._get(f"/api/v1/label/{label}/values", {"match[]": match}))

    def targets(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/targets", {})["activeTargets"])

    def wait(self, expr: str, *, timeout: float = 60, check: Any = bool) -> list[dict[str, Any]]:
        """``query(expr)`` once ``check`` accepts it; fails with the last answer and the
        target's health after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if check(result):
                return result
            if time.monotonic() > deadline:
                health = [(t.get("health"), t.get("lastError")) for t in self.targets()]
                raise AssertionError(
                    f"{expr!r} still gives {result!r} after {timeout}s; targets: {health}"
                )
            time.sleep(0.25)


@contextmanager
def prometheus(tmp: Path, target: str, token_file: Path) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    assert binary, (
        "Debian's `prometheus` package is not installed (the README's test command installs it)"
    )
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "prometheus.yml"
    config.write_text(CONFIG.format(token_file=token_file, target=target))
    port = free_port()
    log = tmp / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp,
        )
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"prometheus exited: {log.read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, (
                f"prometheus not ready after 60 s: {log.read_text()[-2000:]}"
            )
            time.sleep(0.2)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        assert (
            not psutil.pid_exists(proc.pid)
            or psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE
        )
