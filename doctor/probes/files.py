"""File-system reads that never block and never raise: the ground every other probe stands on.

A broken machine is what the doctor is for, so a missing, unreadable, looping or special path is
an answer here (False, [], None, or a reason in words), not an exception."""

from __future__ import annotations

import errno
import os
import stat


def is_file(path: str) -> bool:
    try:
        return os.path.isfile(path)
    except (OSError, ValueError):
        return False


def is_dir(path: str) -> bool:
    try:
        return os.path.isdir(path)
    except (OSError, ValueError):
        return False


def listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (OSError, ValueError):
        return []


def read_text(path: str, limit: int = 1 << 20) -> str | None:
    """A regular file's text, or None. Anything else is refused without blocking: opening a FIFO
    (a `version.json` made by mkfifo) for reading waits for a writer forever, and a device such
    as /dev/zero never ends, so the file is opened non-blocking and checked before reading."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            return fh.read(limit).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def real_path(path: str) -> str:
    """The path with its symlinks resolved, or as given when it can't be (a NUL byte in it)."""
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return path


def why_not_a_folder(path: str) -> str:
    """Why `path` can't be used as a folder, in words (for a path that is not one)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "does not exist"
    except NotADirectoryError:
        return "does not exist (a part of the path is a file, not a folder)"
    except (OSError, ValueError) as exc:
        return f"can't be read: {getattr(exc, 'strerror', None) or exc}"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return f"is a dangling symlink (to {target}, which does not exist)"
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return f"is a symlink loop (to {target})"
            return f"is a symlink to {target}, which can't be read: {exc.strerror or exc}"
    if stat.S_ISREG(st.st_mode):
        return "is a file, not a folder"
    if stat.S_ISFIFO(st.st_mode):
        return "is a named pipe (FIFO), not a folder"
    if stat.S_ISDIR(st.st_mode):
        return "is a folder but can't be read"
    return "is not a folder"


def which(name: str, path_value: str | None) -> str | None:
    """shutil.which without its import cost and with unreadable PATH entries tolerated. An unset
    PATH means the system default, as for exec and shutil.which; an empty one means nothing."""
    if path_value is None:
        path_value = os.defpath
    for entry in path_value.split(os.pathsep):
        if not entry:
            continue
        cand = os.path.join(entry, name)
        try:
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand
        except (OSError, ValueError):
            continue
    return None
