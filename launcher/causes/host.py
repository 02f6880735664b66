"""What the machine says about a rank's death: the kernel's OOM killer (its log, the memory
cgroup it names), and who holds a port. Read once, when a rank died; bounded reads only.

The supervisor may start no child process (it reaps every child: ``supervisor.ranks.reap``), so
the kernel log is read from /dev/kmsg itself, not through ``dmesg``.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

_KMSG = "/dev/kmsg"
_KMSG_RECORDS = 20000  # the ring buffer's records at most (1 MiB of ~60-byte lines)
# "Memory cgroup out of memory: Killed process 123 (python) total-vm:..kB, anon-rss:..kB,
# file-rss:..kB, shmem-rss:..kB"
# "Out of memory: Killed process 123 (python) ..." (the whole machine)
_KILLED = re.compile(
    r"(Memory cgroup out of memory|Out of memory): Killed process (\d+) \(([^)]*)\) "
    r"total-vm:(\d+)kB, anon-rss:(\d+)kB, file-rss:(\d+)kB, shmem-rss:(\d+)kB"
)
# "oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=/a/b,task_memcg=/a/b,task=python,
#  pid=123,uid=0" (one line in the kernel's log)
_CONSTRAINT = re.compile(r"oom-kill:constraint=(\w+).*?oom_memcg=([^,]*),.*?pid=(\d+),")
# The OOM report's "memory: usage 65536kB, limit 65536kB, failcnt 52" (v1) of the cgroup it fired
# in.
_USAGE = re.compile(r"^memory: usage (\d+)kB, limit (\d+)kB, failcnt (\d+)")
# v1's memory controller, v2's unified tree
_CGROUP_ROOTS = ("/sys/fs/cgroup/memory", "/sys/fs/cgroup")
_NO_LIMIT = 1 << 62  # v1's "unlimited" is PAGE_COUNTER_MAX pages, about 2**63


@dataclass(frozen=True)
class OomKill:
    """The kernel's OOM killer ended ``pid``: in a memory cgroup (``memcg``, its ``limit``) or
    because the whole machine ran out; ``rss`` its resident memory then (bytes)."""

    pid: int
    name: str
    rss: int
    memcg: str | None
    limit: int | None
    line: str


def kernel_lines(path: str = _KMSG) -> list[str]:
    """The kernel log's messages still in its ring buffer ([] when it cannot be read: not root,
    or a container without it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    lines: list[str] = []
    try:
        for _ in range(_KMSG_RECORDS):
            try:
                record = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records overwritten while reading: go on from the next
                break  # EAGAIN: the end
            if not record:
                break
            text = record.decode("utf-8", "replace")
            # "prio,seq,usec,flags;message\n continuation lines"
            lines.append(text.split(";", 1)[-1].split("\n", 1)[0])
    finally:
        os.close(fd)
    return lines


def oom_kill(pids: set[int], lines: list[str] | None = None) -> OomKill | None:
    """The OOM killer's kill of one of ``pids`` (a rank, or a process of it such as a DataLoader
    worker), the newest, from the kernel log."""
    lines = kernel_lines() if lines is None else lines
    memcg: dict[int, tuple[str, str]] = {}
    found: OomKill | None = None
    reported: int | None = None  # the limit the last OOM report gave
    for line in lines:
        u = _USAGE.match(line.strip())
        if u is not None:
            reported = int(u.group(2)) * 1024
            continue
        c = _CONSTRAINT.search(line)
        if c is not None:
            memcg[int(c.group(3))] = (c.group(1), c.group(2))
            continue
        m = _KILLED.search(line)
        if m is None or int(m.group(2)) not in pids:
            continue
        pid = int(m.group(2))
        rss = (int(m.group(5)) + int(m.group(6)) + int(m.group(7))) * 1024
        constraint, group = memcg.get(pid, ("", ""))
        cgroup = (
            group
            if constraint == "CONSTRAINT_MEMCG" or m.group(1).startswith("Memory cgroup")
            else None
        )
        limit = (memory_limit(cgroup) or reported) if cgroup else None
        found = OomKill(
            pid,
            m.group(3),
            rss,
            cgroup or None,
            limit if limit and limit < _NO_LIMIT else None,
            line.strip(),
        )
    return found


def oom_chosen(pids: set[int], lines: list[str]) -> bool:
    """Whether the OOM killer's report names one of ``pids`` as its victim: its one-line summary
    ("oom-kill:constraint=...,pid=N,") is logged before the kill, its "Killed process" after."""
    for line in lines:
        c = _CONSTRAINT.search(line)
        if c is not None and int(c.group(3)) in pids:
            return True
    return False


def memory_limit(cgroup: str) -> int | None:
    """A memory cgroup's limit in bytes (v1 ``memory.limit_in_bytes``, v2 ``memory.max``);
    None when it has none or it is gone."""
    rel = cgroup.lstrip("/")
    for root, name in (
        (_CGROUP_ROOTS[0], "memory.limit_in_bytes"),
        (_CGROUP_ROOTS[1], "memory.max"),
    ):
        try:
            with open(os.path.join(root, rel, name), encoding="ascii") as fh:
                text = fh.read(64).strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _NO_LIMIT:
            return int(text)
    return None


def zombie_exit(pid: int) -> int | None:
    """How ``pid`` ended, while it is a zombie its parent (torchrun) has not reaped yet: the
    exit code as ``subprocess`` gives it (negative: the signal), from /proc/PID/stat's field 52
    (Linux 3.5+); None when it is not a zombie or cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read(4096)
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 50 or fields[0] != b"Z":
        return None
    try:
        return os.waitstatus_to_exitcode(int(fields[49]))
    except ValueError:
        return None


def port_holder(port: int) -> int | None:
    """The pid of a process listening on TCP ``port`` (this user's, or any as root), from
    /proc/net/tcp{,6} and the processes' socket links; None when not found."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as fh:
                rows = fh.read(1 << 20).splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[-1], 16) == port:
                inodes.add(cols[9])
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") in wanted:
                    return int(name)
            except OSError:
                continue
    return None


def process_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            words = fh.read(4096).split(b"\0")
    except OSError:
        return None
    # one line, whatever it was given
    text = " ".join(" ".join(w.decode("utf-8", "replace").split()) for w in words if w)
    return text[:120] or None


def size(n: int) -> str:
    """Bytes for a person: 1.5 GiB, 300 MiB, 64 KiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return (
                f"{value:.1f} {unit}"
                if value < 10 and value != int(value)
                else f"{value:.0f} {unit}"
            )
    return f"{n} B"


def cgroup_oom_kills(cgroup: str) -> int | None:
    """How many processes the kernel's OOM killer ended in memory cgroup ``cgroup`` (a path
    under a cgroup root, or the folder itself): v2's ``memory.events`` and v1's
    ``memory.oom_control`` count them as ``oom_kill N``; None when neither can be read."""
    folders = [cgroup] if os.path.isabs(cgroup) and os.path.isdir(cgroup) else []
    folders += [os.path.join(root, cgroup.lstrip("/")) for root in _CGROUP_ROOTS]
    for folder in folders:
        for name in ("memory.events", "memory.oom_control"):
            try:
                with open(os.path.join(folder, name), encoding="ascii") as fh:
                    text = fh.read(4096)
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
    return None
