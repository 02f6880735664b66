"""The handshake that opens every connection to a run's collector: both sides prove they hold
the run's token, and the token itself never travels (docs/security.md): a squatter on the port
learns nothing it could replay.

A token carried in clear would be read by whoever listens on the collector's port (another local
user who took it while node 0's collector could not bind), from the first frame. So the collector
speaks first, and nothing of the run is sent before it proved itself:

1. collector -> peer: ``CHALLENGE`` = ``MAGIC`` + a random 16-byte nonce Ns;
2. peer -> collector: ``HELLO`` = role (``r`` a rank, ``n`` a node link) + who (rank or node, 4
   bytes big-endian) + its own random nonce Nc + HMAC-SHA256(token, "xl peer" role who Ns Nc);
3. collector -> peer: HMAC-SHA256(token, "xl collector" role who Ns Nc), or ``REFUSED`` when the
   peer's proof is wrong (then it closes).

A peer sends frames only after step 3 checked out; a listener that cannot answer it (a squatter
on the port) gets a MAC it cannot turn back into the token, and nothing else. Both MACs cover both
nonces, so neither side's answer can be replayed to the other or from an earlier connection.
``REFUSED`` is not authenticated: it can only make a peer stop talking to a listener that could
as well say nothing. The stream after the handshake is neither encrypted nor signed: records of
a run cross its network in clear (docs/security.md).

Stdlib only; imported when a connection is made (hmac costs ~2 ms of ``import xl.client``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct

MAGIC = b"XLH1"
NONCE = 16
MAC = 32
CHALLENGE_SIZE = len(MAGIC) + NONCE
WHO = struct.Struct(">cI")
HELLO_SIZE = WHO.size + NONCE + MAC
REFUSED = b"XL-REFUSED-BAD-TOKEN".ljust(MAC, b"\0")
ROLE_RANK = b"r"
ROLE_NODE = b"n"
ROLES = (ROLE_RANK, ROLE_NODE)

# What client_handshake returns.
OK = "ok"
REFUSED_TOKEN = "refused"  # the collector says our proof was wrong: our token is not the run's
UNVERIFIED = "unverified"  # the listener did not prove it holds the token (or went away)


def _mac(token: bytes, label: bytes, role: bytes, who: int, ns: bytes, nc: bytes) -> bytes:
    return hmac.new(token, label + WHO.pack(role, who) + ns + nc, hashlib.sha256).digest()


def challenge() -> tuple[bytes, bytes]:
    """(nonce, the bytes the collector sends first)."""
    nonce = os.urandom(NONCE)
    return nonce, MAGIC + nonce


class Hello:
    """A peer's HELLO as the collector read it."""

    __slots__ = ("answer", "ok", "role", "who")

    def __init__(self, ok: bool, role: bytes, who: int, answer: bytes) -> None:
        self.ok, self.role, self.who, self.answer = ok, role, who, answer


def check_hello(token: bytes, nonce: bytes, hello: bytes) -> Hello:
    """The collector's step 3: whether ``hello`` (HELLO_SIZE bytes) proves ``token``, and the
    bytes to answer."""
    role, who = WHO.unpack_from(hello, 0)
    nc = hello[WHO.size : WHO.size + NONCE]
    proof = hello[WHO.size + NONCE :]
    good = role in ROLES and hmac.compare_digest(
        proof, _mac(token, b"xl peer", role, who, nonce, nc)
    )
    if not good:
        return Hello(False, role, who, REFUSED)
    return Hello(True, role, who, _mac(token, b"xl collector", role, who, nonce, nc))


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def client_handshake(sock: socket.socket, token: bytes, role: bytes, who: int) -> str:
    """The peer's side, on a blocking socket with a timeout: OK, REFUSED_TOKEN or UNVERIFIED."""
    try:
        first = _recv_exact(sock, CHALLENGE_SIZE)
        if len(first) != CHALLENGE_SIZE or not first.startswith(MAGIC):
            return UNVERIFIED
        ns, nc = first[len(MAGIC) :], os.urandom(NONCE)
        sock.sendall(WHO.pack(role, who) + nc + _mac(token, b"xl peer", role, who, ns, nc))
        answer = _recv_exact(sock, MAC)
    except OSError:  # a timeout too
        return UNVERIFIED
    if hmac.compare_digest(answer, _mac(token, b"xl collector", role, who, ns, nc)):
        return OK
    return REFUSED_TOKEN if answer == REFUSED else UNVERIFIED
