"""Another process's environment, read from /proc (how xl tells which process is which rank)."""

from __future__ import annotations

from collections.abc import Collection


def read_environ(pid: int, keys: Collection[str] | None = None) -> dict[str, str]:
    """``/proc/PID/environ`` as a dict (only ``keys`` when given); {} when it can't be read,
    e.g. a process of another user or one that just exited."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    wanted = None if keys is None else {k.encode() for k in keys}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and (wanted is None or key in wanted):
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env
