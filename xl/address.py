"""``host:port``, written one way wherever xl writes one: an IPv6 address in brackets
(``[fd00::1]:29500``), as URLs, torchrun's ``--rdzv-endpoint`` and ``XL_COLLECTOR`` take it.

Standard library only and importing nothing: the rank-side client and every layer use it.
"""

from __future__ import annotations

LOOPBACK = "127.0.0.1"


def url_host(host: str) -> str:
    """``host`` as it stands before ``:port`` (an IPv6 address in brackets, once)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def format_address(host: str, port: int | str) -> str:
    """``host:port``, e.g. ``node0:29500`` or ``[fd00::1]:29500``."""
    return f"{url_host(host)}:{port}"


def split_address(raw: str) -> tuple[str, int]:
    """``host:port`` as format_address writes it, back to (host, port): brackets dropped, an
    empty host read as loopback, a port that is not a number as 0 (nothing listens there)."""
    host, _, port = raw.rpartition(":")
    return host.strip("[]") or LOOPBACK, int(port) if port.isdigit() else 0
