"""``xl exporter``: every live run's ranks on ``/metrics`` for Prometheus (docs/exporter.md).

Loopback by default, and a bearer token on every scrape: the metrics name the runs, hosts, users
and Slurm jobs of this machine. The token is ``$XL_EXPORTER_TOKEN``, else the one kept in
``$XL_HOME/exporter.token`` (made private on the first start and kept, so a Prometheus
``credentials_file`` pointing at it stays right across restarts).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from xl import envnames, paths
from xl.address import format_address
from xl.atomic import write_atomic
from xl.errors import ArgumentParser, UsageError
from xl.launcher.exporter.server import BoundedServer, HeadFirstHandler
from xl.listen import add_listen_options, port_in_use, same_token, token_from, warn_if_exposed

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

PROG = "xl exporter"
TOKEN_VAR = envnames.EXPORTER_TOKEN
TOKEN_FILE = "exporter.token"
# Not 9400 (dcgm-exporter's, on the same GPU nodes) nor any port on Prometheus's list of default
# port allocations (9100-9999 all taken; new exporters get ports counted up from 10000):
# docs/exporter.md, "The port".
DEFAULT_PORT = 19400


def token_file() -> Path:
    return paths.xl_home() / TOKEN_FILE


def load_token() -> tuple[str, str]:
    """(token, where it is): ``$XL_EXPORTER_TOKEN``, else the private token file (made now when
    missing, empty or readable by others)."""
    if os.environ.get(TOKEN_VAR, "").strip():
        return token_from(TOKEN_VAR), f"${TOKEN_VAR}"
    path = token_file()
    try:
        if path.stat().st_mode & 0o077 == 0:
            kept = path.read_text(encoding="utf-8").strip()
            if kept:
                return kept, str(path)
    except OSError:
        pass
    token = token_from(TOKEN_VAR)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(path, token + "\n")  # mkstemp's file: 0600 from the start
    except OSError as exc:
        raise UsageError(
            f"cannot write the token to {path} ({exc.strerror}); set XL_HOME to a writable folder "
            f"or set ${TOKEN_VAR}"
        ) from None
    return token, str(path)


def make_handler(registry: CollectorRegistry, token: str) -> type[HeadFirstHandler]:
    from prometheus_client.exposition import choose_encoder  # noqa: PLC0415 - an extra

    class MetricsHandler(HeadFirstHandler):
        server_version = "xl-exporter"

        def do_GET(self) -> None:
            header = self.headers.get("Authorization", "")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not same_token(given.strip(), token):
                self._reply(
                    403,
                    b"xl exporter: a bearer token is required (see docs/exporter.md)\n",
                    "text/plain; charset=utf-8",
                )
                return
            if self.path.split("?", 1)[0] != "/metrics":
                self._reply(
                    404, b"xl exporter: the metrics are at /metrics\n", "text/plain; charset=utf-8"
                )
                return
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._reply(200, encoder(registry), content_type)

        def _reply(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a line per scrape would fill the terminal; Prometheus shows the target's health

    return MetricsHandler


def main(argv: Sequence[str]) -> int:
    p = ArgumentParser(
        prog=PROG, description="Serve every live run's ranks on /metrics for Prometheus."
    )
    add_listen_options(p, DEFAULT_PORT)
    p.add_argument(
        "--no-gpus",
        action="store_true",
        help="leave out the per-GPU series (dcgm-exporter already has them)",
    )
    p.add_argument(
        "--per-rank",
        action="store_true",
        help="every rank's series also for runs of more than 256 ranks (default: a series set "
        "per node for those; docs/exporter.md)",
    )
    ns = p.parse_args(list(argv))
    if not 0 <= ns.port <= 65535:
        raise UsageError(f"--port {ns.port} is not a port (0-65535)")
    try:
        from prometheus_client import CollectorRegistry  # noqa: PLC0415 - an extra

        from xl.launcher.exporter.metrics import RunsCollector  # noqa: PLC0415 - an extra
    except ImportError:
        raise UsageError("needs prometheus-client: pip install 'xl-cluster[exporter]'") from None
    token, where = load_token()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunsCollector(gpus=not ns.no_gpus, per_rank=ns.per_rank))
    try:
        server = BoundedServer(ns.host.strip("[]"), ns.port, make_handler(registry, token))
    except OSError as exc:
        sys.stderr.write(port_in_use(PROG, ns.host, ns.port, exc) + "\n")
        return 1
    warn_if_exposed(PROG, ns.host)
    port = server.server_address[1]
    print(
        f"xl: exporting metrics at http://{format_address(ns.host, port)}/metrics (bearer token: "
        f"{where})",
        flush=True,
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        server.shutdown()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()
    return 0
