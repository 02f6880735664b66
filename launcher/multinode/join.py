"""How a multi-node run is joined: the run's token, node 0's address, the command for other nodes.

The contract (docs/multinode.md, "How the nodes find node 0"):

- ``XL_TOKEN``: the run's secret, the same on every node. Node 0 takes it from its environment
  when set (Slurm passes one to every node), else makes one and prints the command to run on the
  other nodes with it. Every other node needs it.
- ``XL_COLLECTOR_PORT``: the port of node 0's collector, the same on every node; default: the
  ``--rdzv`` port + 1. Node 0's collector listens on the ``--rdzv`` host at that port; the ranks
  of every node send their ``xl.log`` frames there, and the supervisor of every other node sends
  what it records over one connection (xl.launcher.multinode.nodelink).

Everything here runs before a run starts (`xl launch`, the app's Launch), or to find the
addresses again (the supervisor): no thread, no connection kept.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import shlex
import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import replace

from xl import envnames
from xl.address import format_address
from xl.errors import UsageError
from xl.launcher.plan import parse_rdzv
from xl.launcher.spec import LaunchSpec, spec_to_argv

TOKEN_VAR = envnames.TOKEN  # the name the follower says it by (envnames holds every XL_* name)
_TOKEN = re.compile(r"^[A-Za-z0-9._~+/=-]{16,256}$")


def hub_address(rdzv: str, env: Mapping[str, str]) -> tuple[str, int]:
    """(host, port) of node 0's collector: the --rdzv host, XL_COLLECTOR_PORT or rdzv port + 1."""
    host, port = parse_rdzv(rdzv)
    raw = env.get(envnames.COLLECTOR_PORT, "").strip()
    if raw:
        if not (raw.isascii() and raw.isdigit() and 0 < int(raw) < 65536):
            raise UsageError(
                f"{envnames.COLLECTOR_PORT}={raw!r} is not a port; use 1-65535, the same on every "
                "node"
            )
        return host, int(raw)
    if port + 1 > 65535:
        raise UsageError(
            f"--rdzv port {port} leaves no port for node 0's collector (it uses the next one); "
            f"set {envnames.COLLECTOR_PORT} to a free port, the same on every node"
        )
    return host, port + 1


def valid_token(token: str | None) -> bool:
    return bool(token) and _TOKEN.match(token or "") is not None


def token_from_env(env: Mapping[str, str], node_rank: int) -> str | None:
    """The run's token from XL_TOKEN; None on node 0 when unset (it makes one)."""
    token = env.get(envnames.TOKEN, "")
    if not token:
        if node_rank > 0:
            raise UsageError(
                f"--node-rank {node_rank} needs {envnames.TOKEN}, the run's token: run the "
                "command node 0's "
                f"'xl launch' printed (or give every node the same {envnames.TOKEN})"
            )
        return None
    if not valid_token(token):
        raise UsageError(
            f"{envnames.TOKEN} must be 16-256 letters, digits or -_.~+/= (e.g. from 'openssl rand "
            "-hex 16')"
        )
    return token


def listen_host(host: str) -> str:
    """Where node 0's collector binds: the --rdzv host, or every address when that name is a
    loopback alias here (hosts files map the machine's own name to 127.0.1.1), which the other
    nodes could not reach. Frames still need the token."""
    try:
        ipaddress.ip_address(host)
        return host  # an address written out is taken as it is
    except ValueError:
        pass
    try:
        addr = str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError):
        return host
    if host != "localhost" and ipaddress.ip_address(addr.split("%")[0]).is_loopback:
        return "::" if ":" in addr else "0.0.0.0"
    return host


def check_listen(host: str, port: int) -> None:
    """Node 0: fail early, with the fix, when its collector could not listen where nodes dial."""
    host = listen_host(host)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise UsageError(
            f"--rdzv host {host!r} does not resolve here ({exc.strerror or exc})"
        ) from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        raise UsageError(
            f"node 0 cannot listen on {format_address(host, port)} for the run's collector "
            f"({exc.strerror or exc}); run node 0 on the --rdzv host, or set "
            f"{envnames.COLLECTOR_PORT} to a free "
            "port, the same on every node"
        ) from None
    finally:
        sock.close()


def join_command(spec: LaunchSpec, node_rank: int, token: str | None, port_env: str | None) -> str:
    """The command for another node; ``token`` None: the token came from the environment."""
    assigns = [
        f"{envnames.TOKEN}={shlex.quote(token)}"
        if token
        else f'{envnames.TOKEN}="${envnames.TOKEN}"'
    ]
    if port_env:
        assigns.append(f"{envnames.COLLECTOR_PORT}={shlex.quote(port_env)}")
    argv = ["xl", "launch", *spec_to_argv(replace(spec, node_rank=node_rank))]
    return " ".join([*assigns, shlex.join(argv)])


def join_text(spec: LaunchSpec, token: str | None, port_env: str | None) -> str:
    """What node 0's `xl launch` prints for the person starting the other nodes."""
    where = spec.cwd or os.getcwd()
    if spec.nnodes == 2:
        head = f"xl: this is node 0 of 2; on the other node, in {where}, run:"
    else:
        head = (
            f"xl: this is node 0 of {spec.nnodes}; on each other node, in {where}, run this "
            f"with that node's --node-rank (1 to {spec.nnodes - 1}):"
        )
    tail = "" if token else f"\n  (with the same {envnames.TOKEN} as this node)"
    return f"{head}\n  {join_command(spec, 1, token, port_env)}{tail}\n"


def make_token(spec: LaunchSpec, env: MutableMapping[str, str]) -> bool:
    """Node 0's token, made into ``env`` before its plan (the rendezvous id derives from it)
    unless one is there already; True when it was made here. Nothing is checked here: that is
    ``prepare_launch``'s, which is then told ``made``."""
    if spec.node_rank > 0 or env.get(envnames.TOKEN):
        return False
    env[envnames.TOKEN] = secrets.token_hex(16)
    return True


def prepare_launch(
    spec: LaunchSpec, env: MutableMapping[str, str], *, made: bool = False
) -> str | None:
    """`xl launch` of a multi-node run, before anything starts: check the contract (UsageError),
    put the run's token in ``env`` for the supervisor, and return what node 0 prints. ``made``:
    the token in ``env`` is the one ``make_token`` made, printed as a token made here is."""
    host, port = hub_address(spec.rdzv or "", env)
    given = token_from_env(env, spec.node_rank)
    if spec.node_rank > 0:
        return None
    check_listen(host, port)
    token = given or secrets.token_hex(16)
    # The supervisor (forked from this process, or started by it) reads it from there; it never
    # goes to run.json nor to a command line.
    env[envnames.TOKEN] = token
    # A token the person gave is not printed back (it may be in a batch job's log).
    return join_text(spec, None if given and not made else token, env.get(envnames.COLLECTOR_PORT))
