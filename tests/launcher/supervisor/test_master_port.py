"""One node's rendezvous: torchrun's static store on a loopback port the supervisor holds
(docs/launch.md, "One node's rendezvous"). The hold: nothing without SO_REUSEADDR can take the
port, while a listener that sets it (as torchrun's TCPStore does) can; and only a one-node plan's
own ``--master-port 0`` is replaced, never a script's argument of the same spelling."""

from __future__ import annotations

import socket

import pytest

from xl.address import LOOPBACK
from xl.launcher.plan import ENTRY_MODULE, HELD_PORT
from xl.launcher.supervisor.torchrun import hold_master_port

PLAN = [
    "py", "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", LOOPBACK,
    "--master-port", HELD_PORT, "--max-restarts", "0", "-m", ENTRY_MODULE, "train.py", "--lr", "1",
]


def test_the_held_port_is_the_stores_and_nobody_elses() -> None:
    argv, sock = hold_master_port(PLAN)
    assert sock is not None
    try:
        port = int(argv[argv.index("--master-port") + 1])
        assert port == sock.getsockname()[1] and port > 0
        assert argv[: argv.index("--master-port")] == PLAN[: PLAN.index("--master-port")]
        assert argv[argv.index("--master-port") + 2 :] == PLAN[PLAN.index("--master-port") + 2 :]
        # A program that does not share (no SO_REUSEADDR) is refused ...
        other = socket.socket(socket.AF_INET)
        with pytest.raises(OSError):
            other.bind((LOOPBACK, port))
        other.close()
        # ... and the store, which shares, binds and listens; a client reaches it.
        store = socket.socket(socket.AF_INET)
        store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        store.bind((LOOPBACK, port))
        store.listen()
        with socket.create_connection((LOOPBACK, port), timeout=5):
            conn, _ = store.accept()
            conn.close()
        store.close()
    finally:
        sock.close()


@pytest.mark.parametrize(
    "argv",
    [
        # restarts and several nodes: c10d, nothing to hold
        [
            "py", "-m", "torch.distributed.run", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            "127.0.0.1:0", "-m", ENTRY_MODULE, "t.py",
        ],
        # the script's own --master-port 0 is its business
        [
            "py", "-m", "torch.distributed.run", "--rdzv-backend", "c10d", "--max-restarts", "1",
            "-m", ENTRY_MODULE, "t.py", "--master-addr", LOOPBACK, "--master-port", "0",
        ],
        # a port already chosen
        [
            "py", "-m", "torch.distributed.run", "--master-addr", LOOPBACK, "--master-port",
            "29500", "-m", ENTRY_MODULE, "t.py",
        ],
    ],
)
def test_other_commands_are_left_as_they_are(argv: list[str]) -> None:
    assert hold_master_port(argv) == (argv, None)
