"""Readers of /proc: another process's environment, name, process state, start, CPU and memory, PID
namespaces and open devices.

How xl tells which process is which rank (its RANK / LOCAL_RANK / XL_RUN_ID), and how a PID
that another PID namespace reported (NVML inside or beside a container) is found here. Every
reader takes the /proc root so tests can hand it a fabricated tree; none raises: a process of
another user, or one that just exited, reads as "unknown".
"""

from __future__ import annotations

import os
from collections.abc import Collection

PROC = "/proc"


def read_environ(pid: int, keys: Collection[str] | None = None, proc: str = PROC) -> dict[str, str]:
    """``/proc/PID/environ`` as a dict (only ``keys`` when given); {} when it can't be read,
    e.g. a process of another user or one that just exited."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as fh:
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


def read_comm(pid: int, proc: str = PROC) -> str | None:
    """The process's short name (``/proc/PID/comm``), None when unreadable."""
    try:
        with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


def parse_nspid(status: str) -> tuple[int, ...]:
    """The ``NSpid:`` line of a /proc/PID/status text: the process's PID in each PID namespace,
    from the one /proc belongs to (first) down to its own (last); () when absent (kernel < 4.1)."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            try:
                return tuple(int(v) for v in line[6:].split())
            except ValueError:
                return ()
    return ()


def _pids(proc: str) -> list[str]:
    """Every process's folder name under ``proc`` (its PID as text); [] when /proc cannot be
    read."""
    try:
        return [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return []


def nspid_index(proc: str = PROC) -> dict[int, list[int]]:
    """PID in an inner namespace -> the PIDs here of the processes that have it there.

    Only processes living in a nested namespace appear (NSpid with more than one level). One scan
    of /proc; several containers each have their own PID 1, hence lists.
    """
    index: dict[int, list[int]] = {}
    for name in _pids(proc):
        try:
            with open(f"{proc}/{name}/status", encoding="utf-8", errors="replace") as fh:
                levels = parse_nspid(fh.read())
        except OSError:
            continue
        for inner in levels[1:]:
            index.setdefault(inner, []).append(levels[0])
    return index


def _stat_fields(path: str) -> list[bytes]:
    """A /proc/PID/stat line's fields after COMM (STATE, PPID, the rest), [] when unreadable. Read
    through os.read (a line is < 1 KiB): 3 system calls instead of open()'s 7 (no fstat, isatty,
    seek), which counts where it is read for every process or every tick."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            stat = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return []
    # "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses; the last ")" ends it.
    return stat[stat.rfind(b")") + 2 :].split(b" ", 2) if stat else []


def proc_state(pid: int, proc: str = PROC) -> str | None:
    """The process's state letter (``R``, ``S``, ``Z`` a zombie, ...), None when there is no such
    process (or it cannot be read)."""
    fields = _stat_fields(f"{proc}/{pid}/stat")
    if not fields or not fields[0]:
        return None
    return fields[0][:1].decode("ascii", "replace")


def _stat_rest(pid: int, proc: str) -> list[bytes]:
    """Fields 5 on of /proc/PID/stat (``rest[i]`` is field ``i + 5``, man 5 proc), [] when gone."""
    fields = _stat_fields(f"{proc}/{pid}/stat")
    return fields[2].split() if len(fields) == 3 else []


_boot: dict[str, float] = {}


def _boot_time(proc: str) -> float | None:
    """When the machine booted (``btime`` in /proc/stat), seconds since the epoch."""
    if proc not in _boot:
        try:
            with open(f"{proc}/stat", "rb") as fh:
                for line in fh:
                    if line.startswith(b"btime "):
                        _boot[proc] = float(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            return None
    return _boot.get(proc)


def create_time(pid: int, proc: str = PROC) -> float | None:
    """When the process started, in seconds since the epoch: the boot time plus its start (field
    22, in clock ticks), as psutil computes it. None when there is no such process."""
    figures = cpu_rss(pid, proc)
    boot = _boot_time(proc)
    if figures is None or boot is None:
        return None
    return boot + figures[0] / os.sysconf("SC_CLK_TCK")


def cpu_rss(pid: int, proc: str = PROC) -> tuple[int, float, int] | None:
    """(its start in clock ticks since boot, which tells a reused PID; the CPU seconds it used so
    far, user and system; its resident memory in bytes), None when there is no such process.
    One read of /proc/PID/stat: what the sampler asks of every rank's process every second."""
    rest = _stat_rest(pid, proc)
    if len(rest) < 20:
        return None
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        return (
            int(rest[17]),
            (int(rest[9]) + int(rest[10])) / ticks,
            int(rest[19]) * os.sysconf("SC_PAGE_SIZE"),
        )
    except ValueError:
        return None


def pss(pid: int, proc: str = PROC) -> int | None:
    """The process's proportional set size in bytes: its private pages plus its share of each
    page it shares (a page three processes map counts a third to each), from
    ``/proc/PID/smaps_rollup`` (Linux >= 4.14). Summed over processes that share pages (a
    DataLoader worker forked from its rank), it counts each page once, where RSS counts it once per
    process. None when it cannot be read: no such process, another user's, or an older kernel."""
    try:
        fd = os.open(f"{proc}/{pid}/smaps_rollup", os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = os.read(fd, 8192)
        finally:
            os.close(fd)
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(b"Pss:"):
            try:
                return int(line.split()[1]) * 1024  # the kernel writes kB
            except (IndexError, ValueError):
                return None
    return None


def process_tree(proc: str = PROC) -> dict[int, list[int]]:
    """Parent PID -> its children's PIDs, for every process, in one scan of /proc (a process that
    ends during the scan is left out). One scan serves every rank of a sample: asking each rank
    for its descendants the way psutil does scans all of /proc once per rank."""
    tree: dict[int, list[int]] = {}
    for name in _pids(proc):
        fields = _stat_fields(f"{proc}/{name}/stat")
        if len(fields) >= 2 and fields[1].isdigit():
            tree.setdefault(int(fields[1]), []).append(int(name))
    return tree


def descendants(pid: int, tree: dict[int, list[int]]) -> list[int]:
    """``pid``'s children, theirs and so on (nearest first), from a ``process_tree``."""
    found: list[int] = []
    seen = {pid}
    todo = list(tree.get(pid, ()))
    while todo:
        child = todo.pop(0)
        if child in seen:
            continue  # a PID reused during the scan cannot loop this
        seen.add(child)
        found.append(child)
        todo.extend(tree.get(child, ()))
    return found


def has_open(pid: int, prefix: str, proc: str = PROC) -> bool | None:
    """Whether the process has a file under ``prefix`` open (e.g. "/dev/nvidia"); None when its
    descriptors cannot be read (another user's process without privileges, or gone)."""
    fd_dir = f"{proc}/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    # Devices are opened early (CUDA opens /dev/nvidiactl at init): low numbers first stops soon.
    for fd in sorted(fds, key=lambda s: int(s) if s.isdigit() else 0):
        try:
            if os.readlink(f"{fd_dir}/{fd}").startswith(prefix):
                return True
        except OSError:
            continue
    return False


def set_cmdline(args: list[str], proc: str = PROC) -> bool:
    """Replace what ``ps`` shows as this process's command line (``/proc/self/cmdline``).

    The kernel reads it from the argv area of this process's own memory (``arg_start`` to
    ``arg_end``, fields 48-49 of /proc/self/stat); writing there, as setproctitle does, changes
    it in place. The new line is cut to the old one's length and the rest zeroed: nothing of the
    old arguments (e.g. a secret given with --env) stays readable. False when it could not."""
    import ctypes  # noqa: PLC0415 - only the forked supervisor and `xl launch` need it; `import xl` stays light

    try:
        with open(f"{proc}/self/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48, 49 counted from pid = 1
    except (OSError, ValueError, IndexError):
        return False
    size = end - start
    if size <= 0:
        return False
    raw = b"\0".join(a.encode("utf-8", "replace") for a in args)[: size - 1]
    try:
        ctypes.memmove(start, raw.ljust(size, b"\0"), size)
    except (OSError, ValueError):
        return False
    return True


def hide_values(args: list[str], flag: str) -> list[str]:
    """``args`` with the value of every ``flag K=V`` / ``flag=K=V`` shown as ``K=***``."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            out.append(arg.partition("=")[0] + "=***")
            hide_next = False
        elif arg == flag:
            out.append(arg)
            hide_next = True
        elif arg.startswith(flag + "="):
            out.append(flag + "=" + arg[len(flag) + 1 :].partition("=")[0] + "=***")
        else:
            out.append(arg)
    return out
