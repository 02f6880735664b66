"""The rank's output relay: everything a rank writes reaches logs/rank-<r>.log, whatever happens
to the relay itself.

Each test runs a stand-in rank (a real process: the relay takes over its fds 1 and 2) that the
test drives line by line on its stdin; the rank reports its relay's pid and the notes the relay
gave it in a side file, as its stdout is the relay's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from procs import wait_for

from xl.launcher.rundir.tail import writing

RANK = r"""
import atexit, json, os, subprocess, sys
from xl.launcher.rank import relay
log, side = sys.argv[1], sys.argv[2]
notes = []
out = relay.start(log, notes.append)

def report(**what):
    with open(side, "a") as fh:
        fh.write(json.dumps({"relay": out.pid, "notes": notes, **what}) + "\n")

atexit.register(lambda: print("atexit: last words", flush=True))
report()
while True:
    cmd = sys.stdin.readline().strip()
    if cmd in ("", "end"):
        break
    if cmd.startswith("say "):
        print(cmd[4:], flush=True)
        print(cmd[4:] + " (stderr)", file=sys.stderr, flush=True)
        os.write(1, (cmd[4:] + " (fd 1, as C code writes)\n").encode())
    elif cmd == "spawn":  # a child that inherits fds 1 and 2 and outlives the rank
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        report(child=child.pid)
        continue
    report()
out.finish()
"""


class Rank:
    """A stand-in rank whose output goes through the relay into ``log``."""

    def __init__(self, tmp_path: Path) -> None:
        self.log = tmp_path / "logs" / "rank-3.log"
        self.side = tmp_path / "side.jsonl"
        env = {**os.environ, "RANK": "3"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RANK, str(self.log), str(self.side)],
            stdin=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.reports = 0
        self.report()

    def report(self) -> dict[str, Any]:
        """The next line the rank wrote to its side file."""
        want = self.reports + 1

        def written() -> list[str]:
            lines = self.side.read_text().splitlines() if self.side.exists() else []
            return lines if len(lines) >= want and lines[want - 1].endswith("}") else []

        lines = wait_for(written, timeout=30, what=f"the rank's report {want}")
        self.reports = want
        report: dict[str, Any] = json.loads(lines[want - 1])
        return report

    def tell(self, cmd: str) -> dict[str, Any] | None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return None if cmd == "end" else self.report()

    def end(self) -> int:
        self.tell("end")
        return self.proc.wait(30)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def rank(tmp_path: Path) -> Iterator[Rank]:
    r = Rank(tmp_path)
    yield r
    if r.proc.poll() is None:
        os.killpg(r.proc.pid, signal.SIGKILL)
    r.proc.wait(10)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_every_line_reaches_the_log_in_order_up_to_the_rank_s_last_words(rank: Rank) -> None:
    rank.tell("say step 1")
    assert writing(rank.log)  # the relay holds its lock: more may come
    rank.tell("say step 2")
    assert rank.end() == 0
    wait_for(lambda: not writing(rank.log), timeout=30, what="the relay to end with its rank")
    lines = rank.text().splitlines()
    expected = [
        f"step {n}{kind}" for n in (1, 2) for kind in ("", " (stderr)", " (fd 1, as C code writes)")
    ]
    assert lines == [*expected, "atexit: last words"], lines
    assert oct(rank.log.stat().st_mode & 0o777) == oct(0o600)


def test_a_stop_s_sigterm_is_for_the_rank_not_for_its_relay(rank: Rank) -> None:
    relay = rank.tell("say before")
    assert relay is not None
    os.kill(relay["relay"], signal.SIGTERM)
    after = rank.tell("say after the stop's signal")
    assert after is not None and after["relay"] == relay["relay"] and after["notes"] == []
    assert not _gone(relay["relay"])
    rank.end()
    wait_for(lambda: not writing(rank.log), timeout=30, what="the relay to end")
    assert "after the stop's signal (stderr)" in rank.text() and "died" not in rank.text()


def test_a_relay_killed_mid_run_is_replaced_and_nothing_is_lost(rank: Rank) -> None:
    first = rank.tell("say one")
    assert first is not None
    os.kill(first["relay"], signal.SIGKILL)
    wait_for(lambda: _gone(first["relay"]), timeout=10, what="the relay to die")
    rank.tell("say two")  # perhaps written while no relay reads the pipe: it waits there
    rank.tell("say three")
    # Writes are what bring the new relay: "more" until it is there (a busy machine may take
    # several), so "three" is said once however long that takes.
    now = wait_for(
        lambda: (r := rank.tell("say more")) and r["relay"] != first["relay"] and r,
        timeout=30,
        what="another relay",
    )
    note = "rank 3's output relay died (killed by signal 9); another one took over"
    assert now["notes"] == [note]
    rank.end()
    # The new relay is a fresh interpreter: it may still be starting when the rank ends.
    text = wait_for(
        lambda: (t := rank.text()).rstrip().endswith("atexit: last words") and t,
        timeout=30,
        what="the rank's last words",
    )
    for word in ("one", "two", "three"):
        assert text.count(f"{word} (fd 1, as C code writes)\n") == 1, text
    assert f"[xl: {note}]" in text


def test_after_repeated_deaths_the_rank_writes_its_log_itself(rank: Rank) -> None:
    killed: set[int] = set()
    report = rank.tell("say start")
    assert report is not None
    for _ in range(4):  # three relays started again, then no more
        killed.add(report["relay"])
        os.kill(report["relay"], signal.SIGKILL)
        wait_for(lambda pid=report["relay"]: _gone(pid), timeout=10, what="the relay to die")
        report = wait_for(
            lambda: (
                (r := rank.tell("say more"))
                and (r["relay"] not in killed or len(r["notes"]) == 4)
                and r
            ),
            timeout=30,
            what="the rank to take over its output",
        )
    assert (
        report["notes"][-1]
        == "rank 3's output relay died (killed by signal 9); the rank now writes this log itself"
    )
    rank.tell("say on its own")
    rank.end()
    text = rank.text()
    assert "on its own (stderr)" in text and "the rank now writes this log itself]" in text
    assert text.rstrip().endswith("atexit: last words")


def test_a_child_holding_the_rank_s_output_does_not_keep_the_relay(rank: Rank) -> None:
    """A data-loader worker or a stray subprocess inherits fds 1 and 2 and outlives the rank:
    the relay still ends with the rank (readers then know the log is complete)."""
    spawned = rank.tell("spawn")
    assert spawned is not None and spawned["child"]
    try:
        rank.end()
        wait_for(lambda: _gone(spawned["relay"]), timeout=30, what="the relay to end with its rank")
        assert not writing(rank.log) and not _gone(spawned["child"])
        assert rank.text().rstrip().endswith("atexit: last words")
    finally:
        os.kill(spawned["child"], signal.SIGKILL)


def test_the_rank_s_end_and_its_relay_s_count_both_stay_in_its_record(tmp_path: Path) -> None:
    """The relay rewrites the rank's record (how much output a full disk cut) from what it read:
    a rank that records its end meanwhile waits for that rewrite and keeps the relay's count,
    and the relay's rewrite never drops the exit code."""
    import threading  # noqa: PLC0415 - this test only

    from xl.atomic import overwrite_in_place  # noqa: PLC0415 - this test only
    from xl.launcher.rank import relay  # noqa: PLC0415 - this test only
    from xl.launcher.rank.entry import _Record  # noqa: PLC0415 - this test only

    record = _Record(str(tmp_path), 0)
    assert record.path is not None
    record.write_start()
    with relay.record_locked(record.path):  # the relay has read the record
        stale = json.loads(Path(record.path).read_bytes())
        ending = threading.Thread(target=record.write, kwargs={"exit_code": 0, "ended_at": 1.0})
        ending.start()
        ending.join(0.5)
        assert ending.is_alive()  # the rank's end waits for the relay's rewrite
        overwrite_in_place(record.path, json.dumps({**stale, "log_bytes_lost": 4096}).encode())
    ending.join(30)
    assert not ending.is_alive()
    final = json.loads(Path(record.path).read_bytes())
    assert (final["exit_code"], final["log_bytes_lost"]) == (0, 4096)
