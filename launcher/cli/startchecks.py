"""What `xl launch` checks before anything starts, which torch would otherwise tell as 30 lines of
traceback from inside torchrun ("traceback of rank None"):

- the rendezvous port (``--rdzv``, ``--master-port``) is free here, on the node that serves it
  (node 0), as node 0's collector port is checked;
- the interpreter of ``--python`` runs, is Python 3.10 or newer and has torch (``--dry-run``
  too: the command it prints must work).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess

from xl.address import format_address
from xl.errors import UsageError
from xl.launcher.plan import parse_rdzv
from xl.launcher.spec import LaunchSpec

PROBE_TIMEOUT_S = 30.0  # a cold interpreter on a network filesystem takes seconds
_PROBE = (
    "import importlib.util, sys; "
    "print('xl-python', sys.version_info >= (3, 10), importlib.util.find_spec('torch') is not None)"
)


def _free_port(host: str) -> int | None:
    with (
        contextlib.suppress(OSError),
        socket.create_server((host, 0), family=_family(host)) as sock,
    ):
        return int(sock.getsockname()[1])
    return None


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def check_rdzv_port(spec: LaunchSpec) -> None:
    """Node 0 serves the rendezvous store at --rdzv: its port must be free here (UsageError)."""
    if spec.rdzv is None or spec.node_rank != 0:
        return
    from xl.launcher.multinode.join import listen_host  # noqa: PLC0415 - only --rdzv: not a one-node launch's start

    host, port = parse_rdzv(spec.rdzv)
    here = listen_host(host)
    try:
        socket.create_server((here, port), family=_family(here)).close()
    except OSError as exc:
        free = _free_port(here)
        instead = f" (e.g. --rdzv {format_address(host, free)})" if free else ""
        raise UsageError(
            f"rendezvous port {port} is not free on {here} ({exc.strerror or exc}): another run or "
            f"program holds it; give a free port to --rdzv or --master-port{instead}"
        ) from None


def check_python(python: str) -> None:
    """The ranks' interpreter runs, is Python 3.10+ and has torch (UsageError: one line)."""
    try:
        done = subprocess.run(
            [python, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise UsageError(
            f"--python {python}: it did not answer within {PROBE_TIMEOUT_S:g} s"
        ) from None
    except OSError as exc:
        raise UsageError(f"--python {python}: cannot run it ({exc.strerror or exc})") from None
    words = next((ln.split() for ln in done.stdout.splitlines() if ln.startswith("xl-python ")), [])
    if len(words) != 3:
        raise UsageError(
            f"--python {python} is not a working Python interpreter (give another environment's "
            "bin/python)"
        )
    if words[1] != "True":
        raise UsageError(f"--python {python} is older than Python 3.10, which xl's rank code needs")
    if words[2] != "True":
        raise UsageError(
            f"--python {python} has no torch, and the ranks run under it: install torch there "
            f"('{python} -m pip install torch') or give another interpreter"
        )
