"""A run's cgroup: where this machine lets xl make one, making it, starting a process in it, what
it holds and uses, and its end (docs/launch.md, "A run's cgroup").

A process in a cgroup stays in it whatever it does: a new session, a cleared environment, a
double fork. So the processes of a run whose torchrun started in its cgroup are exactly the
cgroup's, and ending the cgroup ends them all; no process tree or environment can say as much.

Where: under the cgroup this process is in (its memory controller's on cgroup v1, where root may
make one; the unified tree's on v2, where a writable, delegated subtree may), or under
``XL_CGROUP_ROOT`` when set. Standard library only: the doctor, the launcher and a rank that
settles its run all use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from xl import envnames

PREFIX = "xl-run-"  # every run cgroup's name starts so: `xl-run-<run id>`, `.node<k>` on nodes > 0
_V1_MEMORY = "memory"
_NO_LIMIT = 1 << 62  # v1's "no limit" is PAGE_COUNTER_MAX pages, about 2**63
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_KILL_ROUNDS_S = 10.0  # SIGKILL again, as a forking process may add one, for at most this long


class CgroupError(Exception):
    """No cgroup for the run; the message is the one line that says why."""


@dataclass(frozen=True)
class Place:
    """Where run cgroups are made on this machine: ``parent`` (None: nowhere, ``reason`` says
    why), on cgroup v2 or v1, and whether the memory controller is there (figures, a limit)."""

    parent: str | None
    v2: bool = False
    memory: bool = False
    reason: str | None = None


def parse_size(text: str) -> int:
    """``64G``, ``512M``, ``1.5GiB``, ``1048576`` -> bytes (K, M, G, T in powers of 1024, as
    ``docker run --memory`` and Slurm's ``--mem`` read them); ValueError for anything else."""
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a size (e.g. 64G, 512M)")
    shift = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2).lower()]
    size = int(float(m.group(1)) * (1 << shift))
    if size <= 0:
        raise ValueError(f"{text!r} is not a size above 0")
    return size


def format_size(size: int) -> str:
    """Bytes as ``--memory-limit`` takes them, exact: 1G, 768M, 1536K."""
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def is_run_cgroup(path: str) -> bool:
    """``path`` (a cgroup's, as the kernel or run.json names it) is a run's cgroup."""
    return os.path.basename(path.rstrip("/")).startswith(PREFIX)


def _mounts(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """(fstype, mount point, the mount's root in its hierarchy, super options) of every cgroup
    mount in /proc/self/mountinfo's text."""
    out = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        cols, rest = left.split(), right.split()
        if sep and len(cols) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            out.append((rest[0], cols[4].replace("\\040", " "), cols[3], rest[2]))
    return out


def _own(cgroup_text: str, v2: bool) -> str | None:
    """This process's path in the v2 tree (``0::/path``) or v1's memory hierarchy."""
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if (v2 and parts[0] == "0" and parts[1] == "") or (
            not v2 and _V1_MEMORY in parts[1].split(",")
        ):
            return parts[2]
    return None


def _read(path: str, limit: int = 4096) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None


def _judge(parent: str, *, said: str) -> Place:
    """A folder run cgroups would be made in, as it is: a cgroup folder, writable."""
    v2 = os.path.exists(os.path.join(parent, "cgroup.controllers"))
    if not os.path.exists(os.path.join(parent, "cgroup.procs")):
        return Place(None, reason=f"{said} {parent} is not a cgroup folder")
    if not os.access(parent, os.W_OK):
        return Place(
            None, v2=v2, reason=f"{said} {parent} is not writable by this user "
            "(a run's cgroup needs root, or a cgroup v2 subtree delegated to you)"
        )
    if v2:
        # A v2 cgroup's children get the memory controller once it is in the parent's
        # subtree_control, which a non-root cgroup holding processes cannot enable.
        offered = (_read(os.path.join(parent, "cgroup.controllers")) or "").split()
        enabled = (_read(os.path.join(parent, "cgroup.subtree_control")) or "").split()
        empty = not (_read(os.path.join(parent, "cgroup.procs")) or "").split()
        memory = "memory" in enabled or ("memory" in offered and empty)
    else:
        memory = os.path.exists(os.path.join(parent, "memory.limit_in_bytes"))
    return Place(parent, v2=v2, memory=memory)


def find_place(
    environ: Mapping[str, str] | None = None,
    *,
    mountinfo: str | None = None,
    own: str | None = None,
) -> Place:
    """Where this process may make run cgroups: ``XL_CGROUP_ROOT`` when set; else under its own
    cgroup, in v1's memory hierarchy (its limits and figures) or else the v2 tree."""
    environ = os.environ if environ is None else environ
    given = environ.get(envnames.CGROUP_ROOT, "").strip()
    if given:
        return _judge(given, said=f"{envnames.CGROUP_ROOT}:")
    mountinfo = _read("/proc/self/mountinfo", 1 << 20) or "" if mountinfo is None else mountinfo
    own = _read("/proc/self/cgroup", 1 << 16) or "" if own is None else own
    mounts = _mounts(mountinfo)
    v1 = [m for m in mounts if m[0] == "cgroup" and _V1_MEMORY in m[3].split(",")]
    v2 = [m for m in mounts if m[0] == "cgroup2"]
    for kind, point, root, _opts in v1 + v2:
        path = _own(own, kind == "cgroup2")
        if path is None:
            continue
        rel = path[len(root):] if root != "/" and path.startswith(root) else path
        return _judge(os.path.normpath(point + "/" + rel.lstrip("/")), said="this process's cgroup")
    return Place(None, reason="no cgroup filesystem with a cgroup of this process is mounted")


def run_name(run_id: str, node_rank: int = 0) -> str:
    """The cgroup's name of a run on one node (two nodes of a run may share a machine)."""
    return f"{PREFIX}{run_id}" + (f".node{node_rank}" if node_rank else "")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def make(place: Place, name: str, limit: int | None = None) -> str:
    """Make the cgroup ``name`` under ``place`` (with ``limit`` bytes of memory, swap
    included); its path. CgroupError says why it could not be."""
    if place.parent is None:
        raise CgroupError(place.reason or "no place for a cgroup")
    if limit is not None and not place.memory:
        raise CgroupError(f"{place.parent} has no memory controller, so no memory limit")
    path = os.path.join(place.parent, name)
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    except OSError as exc:
        raise CgroupError(f"cannot make {path}: {exc.strerror or exc}") from None
    try:
        if place.v2 and place.memory:
            _enable_memory(place.parent, path, needed=limit is not None)
        if limit is not None:
            _set_limit(path, place.v2, limit)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.rmdir(path)
        raise CgroupError(f"cannot set {path}'s memory limit: {exc.strerror or exc}") from None
    return path


def _enable_memory(parent: str, path: str, *, needed: bool) -> None:
    """v2: the memory controller in the run's cgroup (the parent's subtree_control). A parent
    that holds processes may refuse it (EBUSY): the cgroup then only holds the run together."""
    if os.path.exists(os.path.join(path, "memory.max")):
        return
    try:
        _write(os.path.join(parent, "cgroup.subtree_control"), "+memory")
    except OSError:
        if needed:
            raise
    if needed and not os.path.exists(os.path.join(path, "memory.max")):
        raise OSError(errno.EBUSY, "its parent cannot enable the memory controller for it")


def _set_limit(path: str, v2: bool, limit: int) -> None:
    """The limit on memory and swap together: past it the kernel's OOM killer acts, in the run's
    cgroup only (no swapping out of the limit)."""
    if v2:
        _write(os.path.join(path, "memory.max"), str(limit))
        if os.path.exists(os.path.join(path, "memory.swap.max")):
            _write(os.path.join(path, "memory.swap.max"), "0")
        return
    _write(os.path.join(path, "memory.limit_in_bytes"), str(limit))
    memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
    if os.path.exists(memsw):
        with contextlib.suppress(OSError):  # swap accounting may be off
            _write(memsw, str(limit))


def enter(path: str) -> Callable[[], None]:
    """What a child runs between fork and exec (``preexec_fn``) to start in the cgroup: one
    write of its pid, no lock taken, nothing raised (``holds`` tells whether it got in)."""
    procs = os.path.join(path, "cgroup.procs")

    def move() -> None:
        try:
            _write(procs, str(os.getpid()))
        except OSError:
            pass

    return move


def leave(path: str) -> Callable[[], None]:
    """The same, into the cgroup above ``path`` (the one the run's cgroup was made in)."""
    return enter(os.path.dirname(path))


def pids(path: str) -> list[int]:
    """The live processes in the cgroup and in any cgroup made inside it (a process can make
    one), zombies left out; [] when it is gone."""
    found: set[int] = set()
    for folder, _dirs, _files in os.walk(path):
        text = _read(os.path.join(folder, "cgroup.procs"), 1 << 22) or ""
        found.update(int(w) for w in text.split() if w.isdigit())
    return sorted(p for p in found if _proc_state(p) not in (None, "Z", "X"))


def _proc_state(pid: int) -> str | None:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    rest = stat[stat.rfind(")") + 2 :]
    return rest[:1] or None


def holds(path: str, pid: int) -> bool:
    return pid in pids(path)


def end(
    path: str,
    grace: float,
    *,
    spare: Collection[int] = (),
    reap: Callable[[], object] | None = None,
) -> int:
    """End every process in the cgroup but ``spare`` (and this one): SIGTERM, then SIGKILL to
    what is left after ``grace`` seconds, again while any is left. ``reap``: called while
    waiting (a subreaper's children become zombies it must collect). How many were ended."""
    keep = {os.getpid(), *spare}
    ended: set[int] = set()

    def left() -> list[int]:
        if reap is not None:
            reap()
        now = [p for p in pids(path) if p not in keep]
        ended.update(now)
        return now

    for pid in left():
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    deadline = time.monotonic() + _KILL_ROUNDS_S
    while (now := left()) and time.monotonic() < deadline:
        for pid in now:
            _kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    return len(ended)


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def remove(path: str, wait: float = 2.0) -> bool:
    """Remove the cgroup (and any made inside it) once its processes are gone; True when it is
    gone. The kernel refuses (EBUSY) while one is still exiting: tried again for ``wait``."""
    deadline = time.monotonic() + wait
    while True:
        try:
            for folder, _dirs, _files in sorted(os.walk(path), key=lambda w: -len(w[0])):
                os.rmdir(folder)
            return True
        except FileNotFoundError:
            return not os.path.exists(path)
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def _number(path: str) -> int | None:
    text = (_read(path, 64) or "").strip()
    if not text.isdigit():
        return None
    value = int(text)
    return value if value < _NO_LIMIT else None


def _keyed(path: str, key: str) -> int | None:
    for line in (_read(path) or "").splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == key and words[1].isdigit():
            return int(words[1])
    return None


def memory(path: str) -> dict[str, int | None] | None:
    """What the kernel counts for the cgroup's memory, in bytes: ``current``, ``peak`` (v2 on
    Linux 5.19+, v1's max usage), ``limit`` (None: none), ``oom_kills`` (the OOM killer's kills
    in it) and, on v1, ``failcnt`` (times it hit its limit). None without a memory controller."""
    if os.path.exists(os.path.join(path, "memory.current")):
        return {
            "current": _number(os.path.join(path, "memory.current")),
            "peak": _number(os.path.join(path, "memory.peak")),
            "limit": _number(os.path.join(path, "memory.max")),
            "oom_kills": _keyed(os.path.join(path, "memory.events"), "oom_kill"),
        }
    if os.path.exists(os.path.join(path, "memory.usage_in_bytes")):
        return {
            "current": _number(os.path.join(path, "memory.usage_in_bytes")),
            "peak": _number(os.path.join(path, "memory.max_usage_in_bytes")),
            "limit": _number(os.path.join(path, "memory.limit_in_bytes")),
            "oom_kills": _keyed(os.path.join(path, "memory.oom_control"), "oom_kill"),
            "failcnt": _number(os.path.join(path, "memory.failcnt")),
        }
    return None
