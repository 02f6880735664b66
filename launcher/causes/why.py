"""A dead rank's evidence (its exit, its error, its last lines, the kernel's word) as a cause:
``kind``, a one-line ``summary``, a ``fix`` that works or None, and the evidence it was read from.

The evidence is everything the rank left: the exception xl's entry caught, and its last output
read as a person reads a log (``reading``): the last traceback's error, and the lines libraries
print in their own voice (NCCL, c10's C++ logging, C++'s ``what():``, the DataLoader's workers).
The first reading that fits wins, most specific first: a signal is read with what explains it
(the OOM killer, faulthandler's dump, a watchdog's abort, Slurm's time limit); an exit by the
error's own words (``no kernel image``, ``busy or unavailable`` and ``out of memory`` before any
``CUDA error``); anything else is the script's own ``exception``, with its last error line and no
fix. A pattern is only looked for where its author writes it: a line the script printed, or a
script's own exception that merely mentions memory or files, stays an ``exception``.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import signal
import time

from xl.cgroup import format_size, is_run_cgroup
from xl.launcher.causes import host, reading, words
from xl.launcher.causes.distributions import DISTRIBUTIONS
from xl.launcher.causes.doctor_facts import Doctor
from xl.launcher.causes.evidence import Evidence, cause, signame
from xl.launcher.causes.gpu import gpu_cause, shm_cause, shm_small
from xl.launcher.rundir.outcome import Cause, CauseKind

_SIGNALS = {-signal.SIGSEGV: "Segmentation fault", -signal.SIGBUS: "Bus error"}
# A SIGKILL the kernel's log has no word of: how long after the death its OOM killer's line is
# looked for (a rate-limited OOM killer skips its report and logs only the kill, right after it).
OOM_LOG_S = 0.3
# A SIGKILL whose rank the OOM killer's report names as its victim (the report is logged before
# the signal is sent): the longest its "Killed process" line is waited for, on a busy machine.
OOM_CHOSEN_S = 15.0
# Most specific first: a CUDA error's own words before the generic one, NCCL's shared memory and
# CUDA failures before NCCL's error.
_GPU_READERS = (
    words.cuda_oom,
    words.no_kernel_image,
    words.device_busy,
    words.shm_full,
    words.collective_timeout,
    words.nccl_error,
    words.cuda_error,
)
# Exceptions libraries wrap others' words in: the lines libraries printed are read with them.
# A script's own exception type (ValueError, KeyError, its own) is its own words alone.
_WRAPPERS = re.compile(r"^(?:RuntimeError|SystemExit|Exception|OSError|torch\.[\w.]+|c10::\w+):")


def explain(ev: Evidence, doctor: Doctor | None = None, kernel: list[str] | None = None) -> Cause:
    """Why ``ev``'s rank died. ``doctor``: the doctor's checks (read here when a GPU kind needs
    them); ``kernel``: the kernel log's lines (read here when a signal needs them)."""
    doctor = doctor or Doctor(ev.python, {})
    log = reading.read(ev.log_tail)
    said = trusted(ev, log)
    killed = ev.exit_code is None or ev.exit_code < 0
    if killed:
        return _signal(ev, said, log, doctor, kernel)
    found = words.usage_error(log.text, ev.exit_code) if not ev.traceback else None
    if found is not None:
        return cause(
            found, f"the script refused its command line: {found.facts['message']}", _help(ev)
        )
    python = _python_kinds(ev, said, doctor, kernel)
    if python is not None:
        return python
    for read in _GPU_READERS:
        hit = read(said)
        if hit is not None:
            return gpu_cause(hit, ev, doctor, None)
    return _exception(ev, log)


def trusted(ev: Evidence, log: reading.Said) -> str:
    """The text kinds are read from: the exception xl caught (else the last one the log shows),
    and, when it is a wrapper of others' words or there is none, the lines libraries printed."""
    caught = ev.error or "\n".join((ev.traceback or "").strip().splitlines()[-5:])
    if caught.startswith("SystemExit"):
        caught = ""  # sys.exit("..."): the words before it are the rank's
    own = caught or log.error or ""
    if own and not _WRAPPERS.match(own):
        return own
    return "\n".join([own, *log.library]).strip()


# ---------------------------------------------------------------- signals
def _signal(
    ev: Evidence, said: str, log: reading.Said, doctor: Doctor, kernel: list[str] | None
) -> Cause:
    code = ev.exit_code
    name = signame(code)
    read_here = kernel is None and code in (None, -signal.SIGKILL)
    kernel = host.kernel_lines() if read_here else kernel
    if code in (None, -signal.SIGKILL):
        oom = host.oom_kill(ev.pids, kernel) if ev.pids else None
        # A rank gone before its exit code is known (torchrun reaped it and has not reported
        # yet, as on a busy machine) may be the OOM killer's too: its report says so.
        if oom is None and read_here and ev.pids:
            oom = _oom_logged(ev, kernel or [])
        if oom is not None:
            return _host_oom(oom, ev)
    # A C++ abort after a watchdog's or NCCL's own message, a CUDA error: their words first.
    for read in _GPU_READERS:
        found = read(said)
        if found is not None:
            return gpu_cause(found, ev, doctor, name)
    crash = words.fatal_signal(log.text)
    if code == -signal.SIGABRT or (crash is not None and crash.facts.get("signal") == "Aborted"):
        return _aborted(crash, log.lines)
    if crash is not None or code in _SIGNALS:
        if code == -signal.SIGBUS and shm_small(doctor):
            return shm_cause(
                words.Found(
                    "shm_full",
                    {},
                    [f"killed by SIGBUS ({crash.evidence[0] if crash else 'bus error'})"],
                ),
                doctor,
            )
        return _segfault(crash, code)
    who = _who(log.text)
    if who is not None:
        return Cause(CauseKind.KILLED, f"killed by {name}: {who[0]}", who[1], [who[2]])
    if code is None:
        return Cause(
            CauseKind.KILLED,
            "ended without a word (no exit code, no Python error): killed by a signal, or os._exit",
            None,
            ["no exit record; torchrun did not say how it ended"],
        )
    # SIGKILL is also the OOM killer's: say so when its log was read and it was not it.
    unlogged = (
        " (the kernel's OOM killer did not log it)" if kernel and code == -signal.SIGKILL else ""
    )
    return Cause(
        CauseKind.KILLED,
        f"killed by {name} from outside xl{unlogged}",
        None,
        [f"exit code {code} ({name})"],
    )


def _oom_logged(ev: Evidence, kernel: list[str]) -> host.OomKill | None:
    """The OOM killer's kill of ``ev``'s SIGKILLed rank once the kernel's log says it. The killer
    sends its SIGKILL before it logs "Killed process", so on a busy machine the rank can be dead
    and reaped first: its line is waited for while the killer's report names the rank as its
    victim (up to OOM_CHOSEN_S), else until OOM_LOG_S after the death (a death found later costs
    no wait: the run's end waits for this)."""
    quiet_until = (ev.died_at or time.time()) + OOM_LOG_S
    chosen_until = time.monotonic() + OOM_CHOSEN_S
    while True:
        chosen = host.oom_chosen(ev.pids, kernel)
        if time.time() >= quiet_until and (not chosen or time.monotonic() >= chosen_until):
            return None
        time.sleep(0.1)
        kernel = host.kernel_lines()
        oom = host.oom_kill(ev.pids, kernel)
        if oom is not None:
            return oom


def _who(tail: str) -> tuple[str, str | None, str] | None:
    """Who sent the signal, when the log says: Slurm's time limit."""
    for line in reversed(tail.splitlines()):
        if "DUE TO TIME LIMIT" in line or "DUE TO TIME LIMIT".lower() in line.lower():
            return (
                "Slurm ended the job at its time limit",
                "give the job a longer time limit (sbatch --time=HH:MM:SS)",
                line.strip(),
            )
    return None


def _host_oom(oom: host.OomKill, ev: Evidence | None = None) -> Cause:
    held = f"it held {host.size(oom.rss)} when it died"
    if oom.memcg is not None and oom.limit and is_run_cgroup(oom.memcg):
        return _over_memory_limit(oom, oom.limit, held, ev)
    if oom.memcg is not None:
        limit = f"a limit of {host.size(oom.limit)}" if oom.limit else "its limit"
        summary = (
            f"killed by the kernel's OOM killer: its memory cgroup {oom.memcg} has {limit}; {held}"
        )
        fix = (
            (
                f"give the ranks more memory than {host.size(oom.limit)} (docker run --memory, "
                "Slurm --mem) or use less per rank (fewer DataLoader workers, a smaller batch)"
            )
            if oom.limit
            else None
        )
    else:
        summary = f"killed by the kernel's OOM killer: the machine ran out of memory; {held}"
        fix = (
            "use less host memory per rank (fewer DataLoader workers, a smaller batch) or fewer "
            "ranks on this machine"
        )
    pid = f" (pid {oom.pid}, {oom.name})"
    return Cause(CauseKind.HOST_OOM, summary + pid, fix, [oom.line])


def _over_memory_limit(oom: host.OomKill, limit: int, held: str, ev: Evidence | None) -> Cause:
    """The run's own cgroup (xl.cgroup) and its `--memory-limit`: the same launch with twice
    the limit is the fix."""
    summary = (
        f"killed by the kernel's OOM killer: the run's --memory-limit of {host.size(limit)} "
        f"(its cgroup {oom.memcg}); {held} (pid {oom.pid}, {oom.name})"
    )
    bigger = format_size(2 * limit)
    args = list(ev.launch_args) if ev is not None and ev.launch_args is not None else None
    if args is None:
        fix = f"launch it again with --memory-limit {bigger}, or use less memory per rank"
    else:
        while "--memory-limit" in args:
            i = args.index("--memory-limit")
            del args[i : i + 2]
        fix = shlex.join(["xl", "launch", "--memory-limit", bigger, *args])
    return Cause(CauseKind.HOST_OOM, summary, fix, [oom.line])


def _aborted(crash: words.Found | None, lines: list[str]) -> Cause:
    """SIGABRT: C++'s std::terminate, a failed C assert, os.abort(); what it printed before."""
    before = [ln.strip() for ln in lines if ln.strip()]
    if crash is not None:
        at = max(i for i, ln in enumerate(before) if ln.startswith("Fatal Python error"))
        before = before[:at]
    said = words.one_line(before[-1]) if before else None
    where = (
        f" in {crash.facts['file']}:{crash.facts['line']}"
        if crash is not None and "file" in crash.facts
        else ""
    )
    summary = f"aborted (SIGABRT){where}" + (f" after: {said}" if said else "")
    return Cause(
        CauseKind.EXCEPTION,
        summary,
        None,
        ([said] if said else []) + (crash.evidence if crash else []),
    )


def _segfault(crash: words.Found | None, code: int | None) -> Cause:
    what = (crash.facts.get("signal") if crash else None) or _SIGNALS.get(
        code or 0, "Segmentation fault"
    )
    if crash is not None and "file" in crash.facts:
        f = crash.facts
        where = f"{f['file']}:{f['line']} in {f['function']}"
        if "caller_file" in f:  # the script's own line first, then where in the library it crashed
            where = (
                f"{f['caller_file']}:{f['caller_line']} in {f['caller_function']} (inside {where})"
            )
        return Cause(
            CauseKind.SEGFAULT,
            f"{what.lower()} in native code called from {where}",
            None,
            crash.evidence,
        )
    return Cause(
        CauseKind.SEGFAULT,
        f"{what.lower()} in native code (no Python line was printed)",
        None,
        crash.evidence if crash else [f"exit code {code} ({signame(code)})"],
    )


# ---------------------------------------------------------------- Python's own errors
def _python_kinds(
    ev: Evidence, said: str, doctor: Doctor, kernel: list[str] | None
) -> Cause | None:
    found = words.module_not_found(said)
    if found is not None:
        return _module(ev, found)
    worker = _worker(ev, said, doctor, kernel)
    if worker is not None:
        return worker
    found = words.shm_full(said)
    if found is not None:
        return shm_cause(found, doctor)
    found = words.port_in_use(said)
    if found is not None:
        return _port(found)
    found = words.file_not_found(said)
    if found is not None:
        return _file(ev, found)
    return None


def _module(ev: Evidence, found: words.Found) -> Cause:
    module = found.facts["module"]
    top = module.split(".")[0]
    local = _local(ev, top)
    if local is not None:
        return cause(
            found, f"no module named '{module}' on the ranks' sys.path, though {local} exists", None
        )
    # A library that names several (transformers' "requires the following packages"): all.
    names = found.facts.get("modules", module).split()
    dists = [
        DISTRIBUTIONS.get(m) or DISTRIBUTIONS.get(m.split(".")[0])
        or (m if "." not in m else None)
        for m in names
    ]
    fix = None
    if all(dists):
        fix = shlex.join([ev.python, "-m", "pip", "install", *(d for d in dists if d)])
    said = f"'{module}'" if len(names) == 1 else ", ".join(f"'{m}'" for m in names)
    plural = "module" if len(names) == 1 else "modules"
    return cause(found, f"the ranks' Python ({ev.python}) has no {plural} named {said}", fix)


def _local(ev: Evidence, name: str) -> str | None:
    """A file or folder of the script's own named ``name``: a path problem, not a package."""
    places = [ev.cwd] if ev.cwd else []
    if ev.script:
        places.append(os.path.dirname(os.path.join(ev.cwd or "", ev.script)))
    for place in places:
        for candidate in (
            os.path.join(place, name + ".py"),
            os.path.join(place, name, "__init__.py"),
        ):
            if os.path.isfile(candidate):
                return candidate
    return None


def _file(ev: Evidence, found: words.Found) -> Cause:
    path = found.facts["path"]
    script = os.path.abspath(os.path.join(ev.cwd or "", ev.script)) if ev.script else None
    if found.facts.get("script") or (script is not None and os.path.abspath(path) == script):
        return _no_script(ev, found, path)
    where = f" (relative to {ev.cwd})" if ev.cwd and not os.path.isabs(path) else ""
    fix = None
    if script is not None and not os.path.isabs(path):
        beside = os.path.dirname(script)
        args = ev.launch_args
        if (beside != os.path.abspath(ev.cwd or ".") and os.path.exists(os.path.join(beside, path))
                and args is not None and ev.script in args):
            # the same launch from the script's folder, where the file is
            args = [script if a == ev.script else a for a in args]
            fix = f"cd {shlex.quote(beside)} && {shlex.join(['xl', 'launch', *args])}"
    return cause(found, f"no such file: {path}{where}", fix)


def _no_script(ev: Evidence, found: words.Found, path: str) -> Cause:
    """The script itself is not there: its path, where the ranks ran, and the launch again with
    the file of that folder whose name is closest, when one is close."""
    ran = f" (the ranks ran in {ev.cwd})" if ev.cwd else ""
    folder = os.path.dirname(os.path.abspath(os.path.join(ev.cwd or "", path)))
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".py")]
    except OSError:
        names = []
    close = difflib.get_close_matches(os.path.basename(path), names, n=1, cutoff=0.8)
    fix = None
    if close and ev.launch_args is not None and ev.script in ev.launch_args:
        other = os.path.join(os.path.dirname(ev.script or ""), close[0])
        args = list(ev.launch_args)
        args[args.index(ev.script or "")] = other
        fix = shlex.join(["xl", "launch", *args])
    return cause(found, f"the script {path} does not exist{ran}", fix)


def _port(found: words.Found) -> Cause:
    port = found.facts.get("port")
    holder = host.port_holder(int(port)) if port and port.isdigit() else None
    who = f", held by pid {holder} ({host.process_name(holder) or '?'})" if holder else ""
    return cause(
        found,
        f"port {port} is already in use{who}" if port else "an address is already in use",
        None,
    )


_WORKER = re.compile(
    r"DataLoader worker \(pid\(?s?\)? ([\d, ]+)\) (?:exited unexpectedly|is killed by signal: "
    r"Killed)"
)


def _worker(ev: Evidence, said: str, doctor: Doctor, kernel: list[str] | None) -> Cause | None:
    """A DataLoader worker that died without a word of its own ("DataLoader worker (pid(s) 123)
    exited unexpectedly" / "is killed by signal: Killed"): the OOM killer when the kernel log
    names it or the run's cgroup counted a kill; else shared memory, when /dev/shm is small or
    full (a worker dies of it writing a batch there); else the script's own ``exception``."""
    m = _WORKER.search(said)
    if m is None:
        return None
    pids = {int(p) for p in re.findall(r"\d+", m.group(1))}
    oom = host.oom_kill(pids, kernel)
    if oom is not None:
        return _host_oom(oom, ev)
    line = m.group(0)
    kills = host.cgroup_oom_kills(ev.cgroup) if ev.cgroup else None
    if kills:
        limit = host.memory_limit(ev.cgroup or "")
        of = f" (its limit {host.size(limit)})" if limit else ""
        return Cause(
            CauseKind.HOST_OOM,
            f"killed by the kernel's OOM killer: a DataLoader worker, in the run's memory cgroup "
            f"{ev.cgroup}{of}, which counted {kills} OOM kill{'s' if kills > 1 else ''}",
            "use less host memory per rank (fewer DataLoader workers, a smaller batch)",
            [line, f"{ev.cgroup}: oom_kill {kills}"],
        )
    if shm_small(doctor):
        return shm_cause(words.Found("shm_full", {}, [line]), doctor)
    return None


# ---------------------------------------------------------------- the rest
def _exception(ev: Evidence, log: reading.Said) -> Cause:
    # The exception xl caught, else the last one the log shows; sys.exit("...")'s only when
    # there is no other.
    named = [words.one_line(x) for x in (ev.error, ev.traceback, log.error)]
    real = [x for x in named if x and not x.startswith("SystemExit")]
    line = real[0] if real else next((x for x in named if x), None)
    if line is not None:
        return Cause(CauseKind.EXCEPTION, line, None, [line])
    last = next((ln.strip() for ln in reversed(log.lines) if ln.strip()), None)
    summary = f"exited with code {ev.exit_code}" + (
        f" after: {words.one_line(last)}" if last else " without a Python error"
    )
    return Cause(
        CauseKind.EXCEPTION, summary, None, [last] if last else [f"exit code {ev.exit_code}"]
    )


def _help(ev: Evidence) -> str | None:
    """The command that shows the script's options, as the ranks would run it."""
    if ev.module:
        return shlex.join([ev.python, "-m", ev.module, "--help"])
    if ev.script:
        return shlex.join(
            [ev.python, os.path.join(ev.cwd, ev.script) if ev.cwd else ev.script, "--help"]
        )
    return None
