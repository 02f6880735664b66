"""What `xl serve` and `xl exporter` share as servers on a port: loopback by default, a token
that is never optional, and one clear line when the port cannot be had (docs/serve.md,
docs/exporter.md)."""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import sys
from typing import TYPE_CHECKING

from xl.address import format_address

if TYPE_CHECKING:
    from argparse import ArgumentParser

LOOPBACK_NAMES = ("localhost", "ip6-localhost")


def add_listen_options(p: ArgumentParser, port: int) -> None:
    """``--host`` (this machine only unless asked) and ``--port`` (``port``; 0 a free one)."""
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only)",
    )
    p.add_argument(
        "--port", type=int, default=port, help=f"port (default {port}; 0 picks a free one)"
    )


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def token_from(var: str) -> str:
    """``$var`` when set and not blank, else a new random token (32 bytes, URL-safe)."""
    given = os.environ.get(var, "").strip()
    return given or secrets.token_urlsafe(32)


def same_token(given: str | None, expected: str) -> bool:
    """Constant-time: the time taken says nothing about how much of a guess was right."""
    return given is not None and hmac.compare_digest(
        given.encode("utf-8", "replace"), expected.encode("utf-8")
    )


def warn_if_exposed(prog: str, host: str) -> None:
    """A line on stderr when ``host`` is not loopback: others on the network can reach the port."""
    if not is_loopback(host):
        sys.stderr.write(
            f"{prog}: warning: listening on {host}, not loopback: anyone who can reach this port "
            "and has the token gets in; prefer the default 127.0.0.1 and an SSH tunnel\n"
        )


def port_in_use(prog: str, host: str, port: int, exc: OSError) -> str:
    """The one line for a port that cannot be listened on."""
    return (
        f"{prog}: cannot listen on {format_address(host, port)} ({exc.strerror or exc}); "
        "pick another with --port"
    )
