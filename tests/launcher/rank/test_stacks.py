"""Inside a rank: where it is, when asked (the socket door and the signal door of rank.stacks).

A stand-in rank (a real process: the doors are per process) installs them as the rank entry
does, then waits in a function of its own while the test asks, as `xl stacks` would.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import wait_for

from xl.launcher.rank import stacks

RANK = r'''
import json, os, sys, threading, time
from xl.launcher.rank import stacks
ok = stacks.install(sys.argv[1], 2)  # before user code, as the rank entry does
again = stacks.install(sys.argv[1], 2)
if os.environ.get("WITH_TORCH"):
    import torch, torch.distributed as dist
    dist.init_process_group(
        "gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=0, world_size=1
    )
    for _ in range(3):
        dist.all_reduce(torch.ones(1))
threading.Thread(target=time.sleep, args=(60,), name="loader", daemon=True).start()

def waiting_in_train_step():
    print(json.dumps({"ok": ok, "again": again}), flush=True)
    sys.stdin.readline()

waiting_in_train_step()
print("alive", flush=True)
'''


class Rank:
    def __init__(self, run_dir: Path, **env: str) -> None:
        self.run_dir = run_dir
        # Where the rank says its doors are open, and where faulthandler writes (docs/contracts.md).
        self.door, self.text = (
            run_dir / "ranks" / "rank-2.stacks.json",
            run_dir / "ranks" / "rank-2.stacks.txt",
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RANK, str(run_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        assert self.proc.stdout is not None
        self.installed: dict[str, bool] = json.loads(self.proc.stdout.readline())

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = json.loads(self.door.read_text())
        return info

    def ask(self) -> dict[str, Any]:
        """What the socket door answers, from the socket its info file names (as `xl stacks`)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect("\0" + self.info()["socket"])
            assert stacks.peer_is(sock, self.proc.pid)
            data = b""
            while chunk := sock.recv(1 << 16):
                data += chunk
        doc: dict[str, Any] = json.loads(data)
        return doc

    def go_on(self) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        assert self.proc.wait(30) == 0
        return line


@pytest.fixture
def rank(tmp_path: Path) -> Iterator[Rank]:
    r = Rank(tmp_path / "run")
    yield r
    r.proc.kill()
    r.proc.wait(10)


def test_the_socket_door_says_where_every_thread_is(rank: Rank) -> None:
    assert rank.installed == {"ok": True, "again": False}  # one set of doors per rank
    info = rank.info()
    assert info["pid"] == rank.proc.pid and info["signal"] == int(stacks.SIGNAL)
    assert oct(rank.door.stat().st_mode & 0o777) == oct(0o600)
    doc = rank.ask()
    assert doc["pid"] == rank.proc.pid
    main, *others = doc["threads"]
    assert (
        main["name"] == "MainThread" and main["frames"][-1]["function"] == "waiting_in_train_step"
    )
    assert main["frames"][0]["function"] == "<module>"  # outermost first, innermost last
    assert "loader" in [t["name"] for t in others]
    # the door's own thread is no news
    assert "xl-stacks" not in [t["name"] for t in doc["threads"]]
    assert (
        doc["collectives"] == [] and doc["collectives_note"] == "torch is not loaded in this rank"
    )
    rank.ask()  # and again: the door stays open
    assert rank.go_on() == "alive"


def test_the_signal_door_writes_the_stacks_and_the_rank_lives_on(rank: Rank) -> None:
    """A rank whose C code holds the GIL cannot answer on the socket; faulthandler still writes
    where it is on the signal, and the signal (whose default action would end it) does not."""
    os.kill(rank.proc.pid, rank.info()["signal"])
    dumped = wait_for(
        lambda: "waiting_in_train_step" in rank.text.read_text() and rank.text.read_text(),
        timeout=20,
        what="the stacks dump",
    )
    assert "Current thread" in dumped or "Thread 0x" in dumped, dumped
    assert rank.go_on() == "alive"


def test_a_rank_whose_run_dir_cannot_take_the_doors_runs_on_untouched(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "ranks").write_text("a file where the folder should be")
    r = Rank(run_dir)
    try:
        assert r.installed == {"ok": False, "again": False}
        assert r.go_on() == "alive"
    finally:
        r.proc.kill()
        r.proc.wait(10)
    assert stacks.install(None, 0) is False  # no run dir (not under xl): nothing at all


def test_each_rank_s_socket_name_is_its_own_and_unpredictable() -> None:
    a, b = stacks.socket_name(1234), stacks.socket_name(1234)
    assert a != b and a.startswith("\0xl-stacks-1234-") and len(a) - len("\0xl-stacks-1234-") == 32


def test_a_socket_bound_by_another_process_is_not_believed(tmp_path: Path) -> None:
    name = stacks.socket_name(os.getpid())
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client,
    ):
        server.bind(name)
        server.listen(1)
        client.connect(name)
        assert stacks.peer_is(client, os.getpid())
        # the pid the info file named is not who bound it
        assert not stacks.peer_is(client, os.getpid() + 1)


@pytest.mark.e2e
def test_a_rank_with_torch_tells_its_last_collectives(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = Rank(tmp_path / "run", WITH_TORCH="1", PORT=str(port))
    try:
        doc = r.ask()
        assert "collectives_note" not in doc, doc
        ops = [(c["op"], c["state"]) for c in doc["collectives"]]
        assert ops == [("all_reduce", "completed")] * 3, doc["collectives"]
        assert all(isinstance(c["t"], float) for c in doc["collectives"] if "t" in c)
        assert r.go_on() == "alive"
    finally:
        r.proc.kill()
        r.proc.wait(10)
