"""A small disk for tests of a full disk: a tmpfs mounted for one test (root only; the test is
skipped where mount is refused), and a file that takes every byte left on it."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(mnt: Path, size: str, mode: str | None = None) -> Iterator[Path]:
    """``mnt`` (created) as a tmpfs of ``size`` (e.g. "8m") for the ``with`` block, unmounted
    after it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt.mkdir(exist_ok=True)
    options = f"size={size}" + (f",mode={mode}" if mode else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30, check=False)


def fill(filler: Path) -> Path:
    """``filler`` written until its disk has not one byte left (the last pages too)."""
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 1 << 16, 4096, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                continue
    finally:
        os.close(fd)
    return filler
