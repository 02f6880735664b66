"""Atomic file writes: a reader never sees half a file, a crash never leaves one."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder and a rename."""
    target = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = _new_beside(target)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _new_beside(target: Path) -> tuple[int, str]:
    """A new, empty, private (0600) file next to ``target``, opened for writing, as
    ``tempfile.mkstemp`` makes one, without its imports (random, shutil: ~4 ms of every
    process's start, a rank's included)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = os.path.join(target.parent, f".{target.name}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue


def write_json_atomic(path: str | os.PathLike[str], obj: object) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_unsynced(path: str, data: bytes) -> None:
    """Replace ``path`` atomically with a private (0600) file holding ``data``, without waiting for
    the disk: a rank's start files (its PID, its stacks socket) say how to reach a live process,
    which no power cut outlives; an fsync here held every rank's start 5-12 ms on a busy
    machine."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def overwrite_in_place(path: str, raw: bytes) -> bool:
    """Write ``raw`` over ``path`` where it lies, padded with spaces to the file's size, when it
    fits: no new disk space is needed (a full disk refuses every new file). False when it does
    not fit or the file cannot be written. A JSON file stays JSON (trailing spaces)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        if size < len(raw):
            return False
        os.pwrite(fd, raw.ljust(size), 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def makedirs_private(path: str | os.PathLike[str]) -> None:
    """``os.makedirs`` where every folder it creates is 0700, the missing parents too (a run dir
    removed while its ranks write is made again private, not with the umask's 0755)."""
    target = os.path.abspath(path)
    missing: list[str] = []
    while not os.path.isdir(target):
        missing.append(target)
        parent = os.path.dirname(target)
        if parent == target:
            break
        target = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            continue
        os.chmod(folder, 0o700)  # whatever the umask took away from 0700
