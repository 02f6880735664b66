"""Start `xl serve` / `xl exporter` as a person does, read the one line they print, and stop them
with SIGTERM, checking that nothing of them is left (their children included)."""

from __future__ import annotations

import re
import selectors
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import psutil
from procs import XL

URL = re.compile(r"http://\S+")


@dataclass
class Served:
    proc: subprocess.Popen[str]
    line: str

    @property
    def url(self) -> str:
        found = URL.search(self.line)
        assert found, self.line
        return found.group(0)

    def family(self) -> list[psutil.Process]:
        """Every live process the command started (its children, theirs, ...)."""
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []
        return [k for k in kids if _alive(k)]


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sel.select(timeout=0.2):
            line = proc.stdout.readline()
            assert line, (
                f"the command printed nothing and exited {proc.poll()}: "
                f"{proc.stderr.read() if proc.stderr else ''}"
            )
            return line.rstrip("\n")
        assert proc.poll() is None, (
            f"the command exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
        )
    raise AssertionError(f"no line on stdout after {timeout}s")


@contextmanager
def served(args: Sequence[str], env: Mapping[str, str], *, timeout: float = 60) -> Iterator[Served]:
    """`xl ARGS` running until the block ends; then SIGTERM, and nothing of it may be left."""
    proc = subprocess.Popen(
        [*XL, *args], env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    family: list[psutil.Process] = []
    left: list[psutil.Process] = []
    code: int | None = None
    try:
        run = Served(proc, first_line(proc, timeout))
        yield run
    finally:
        family = Served(proc, "").family()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        _, still = psutil.wait_procs(family, timeout=10)
        left = [p for p in still if _alive(p)]
        for p in left:
            p.kill()
    assert code is not None, "the command did not end within 30 s of SIGTERM"
    assert not left, f"left behind after SIGTERM: {[p.pid for p in left]}"
    assert code == 0, f"exit {code} after SIGTERM: {proc.stderr.read() if proc.stderr else ''}"
