"""A dead rank's evidence (its exit, its error, its last lines, the kernel's word) as a cause:
``kind``, a one-line ``summary``, a ``fix`` that works or None, and the evidence it was read from.

The first reading that fits wins, most specific first: a signal is read with what explains it
(the OOM killer, faulthandler's dump, a watchdog's abort, Slurm's time limit); an exit with a
Python error by that error's own words; anything else is the script's own ``exception``, with its
last line and no fix. A pattern is only looked for where its author writes it (torch's messages
in the error, argparse's in the last lines): a script's own error that merely mentions memory
stays an ``exception``.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import time
from dataclasses import dataclass, field

from xl.launcher.causes import host, words
from xl.launcher.causes.distributions import DISTRIBUTIONS
from xl.launcher.causes.door import Doctor
from xl.launcher.rundir.outcome import Cause, CauseKind

_SIGNALS = {-signal.SIGSEGV: "Segmentation fault", -signal.SIGBUS: "Bus error"}


@dataclass
class Evidence:
    """What is known of a rank that died, for ``explain``."""

    rank: int | None
    exit_code: int | None  # negative: the signal; None: unknown (it vanished)
    error: str | None = None  # its exception as Python prints it (possibly several lines)
    traceback: str | None = None
    log_tail: list[str] = field(default_factory=list)  # its last lines of output
    pids: set[int] = field(default_factory=set)  # the rank's process (and its children, when known)
    python: str = "python"  # the ranks' interpreter
    cwd: str | None = None  # where the ranks ran
    script: str | None = None  # the script as given, or None for -m
    module: str | None = None  # -m MODULE
    launch_args: list[str] | None = None  # this run's `xl launch` arguments (for a rerun line)
    hang: str | None = None  # xl's own hang verdict, when it said one
    vanished: bool = False  # gone without a word (a signal xl did not send)


def explain(ev: Evidence, doctor: Doctor | None = None, kernel: list[str] | None = None) -> Cause:
    """Why ``ev``'s rank died. ``doctor``: the doctor's checks (read here when a GPU kind needs
    them); ``kernel``: the kernel log's lines (read here when a signal needs them)."""
    doctor = doctor or Doctor(ev.python, {})
    tail = "\n".join(ev.log_tail)
    # The rank's own exception: torch's and NCCL's words are in it (its traceback's end when
    # no error line was recorded).
    said = ev.error or "\n".join((ev.traceback or "").strip().splitlines()[-5:])
    killed = ev.exit_code is None or ev.exit_code < 0
    if killed:
        return _signal(ev, tail, doctor, kernel)
    found = words.usage_error(tail, ev.exit_code) if not ev.traceback else None
    if found is not None:
        return _cause(
            found, f"the script refused its command line: {found.facts['message']}", _help(ev)
        )
    for reader in (_python_kinds, _gpu_kinds):
        cause = reader(ev, said, doctor, kernel)
        if cause is not None:
            return cause
    return _exception(ev, tail)


# ---------------------------------------------------------------- signals
def _signal(ev: Evidence, tail: str, doctor: Doctor, kernel: list[str] | None) -> Cause:
    code = ev.exit_code
    name = _signame(code)
    read_here = kernel is None and code in (None, -signal.SIGKILL)
    kernel = host.kernel_lines() if read_here else kernel
    if code in (None, -signal.SIGKILL):
        oom = host.oom_kill(ev.pids, kernel) if ev.pids else None
        # The OOM killer sends its SIGKILL before it logs "Killed process": on a busy machine the
        # rank can be dead and reaped first. A SIGKILL the log does not explain yet is looked
        # for again for a second before it is called a kill from outside.
        for _ in range(5 if read_here and code == -signal.SIGKILL and ev.pids else 0):
            if oom is not None:
                break
            time.sleep(0.2)
            oom = host.oom_kill(ev.pids, host.kernel_lines())
        if oom is not None:
            return _host_oom(oom)
    # A C++ abort after a watchdog's or NCCL's own message, a CUDA error: their words first.
    for read in (
        words.collective_timeout,
        words.nccl_error,
        words.cuda_oom,
        words.cuda_error,
        words.shm_full,
    ):
        found = read(tail)
        if found is not None:
            return _gpu(found, ev, doctor, name)
    crash = words.fatal_signal(tail)
    if code == -signal.SIGABRT or (crash is not None and crash.facts.get("signal") == "Aborted"):
        return _aborted(crash, ev.log_tail)
    if crash is not None or code in _SIGNALS:
        if code == -signal.SIGBUS and _shm_small(doctor):
            return _shm(
                words.Found(
                    "shm_full",
                    {},
                    [f"killed by SIGBUS ({crash.evidence[0] if crash else 'bus error'})"],
                ),
                doctor,
            )
        return _segfault(crash, code)
    who = _who(tail)
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


def _host_oom(oom: host.OomKill) -> Cause:
    held = f"it held {host.size(oom.rss)} when it died"
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
        crash.evidence if crash else [f"exit code {code} ({_signame(code)})"],
    )


# ---------------------------------------------------------------- Python's own errors
def _python_kinds(
    ev: Evidence, said: str, doctor: Doctor, kernel: list[str] | None
) -> Cause | None:
    found = words.module_not_found(said)
    if found is not None:
        return _module(ev, found)
    worker = _worker_oom(ev, said, kernel)
    if worker is not None:
        return worker
    found = words.shm_full(said)
    if found is not None:
        return _shm(found, doctor)
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
        return _cause(
            found, f"no module named '{module}' on the ranks' sys.path, though {local} exists", None
        )
    dist = DISTRIBUTIONS.get(module) or DISTRIBUTIONS.get(top) or (top if module == top else None)
    fix = f"{shlex.quote(ev.python)} -m pip install {shlex.quote(dist)}" if dist else None
    return _cause(found, f"the ranks' Python ({ev.python}) has no module named '{module}'", fix)


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
    where = f" (relative to {ev.cwd})" if ev.cwd and not os.path.isabs(path) else ""
    fix = None
    if ev.script and not os.path.isabs(path):
        beside = os.path.dirname(os.path.abspath(os.path.join(ev.cwd or "", ev.script)))
        if beside != os.path.abspath(ev.cwd or ".") and os.path.exists(os.path.join(beside, path)):
            fix = f"launch from {beside} (cd {shlex.quote(beside)}), where {path} exists"
    return _cause(found, f"no such file: {path}{where}", fix)


def _port(found: words.Found) -> Cause:
    port = found.facts.get("port")
    holder = host.port_holder(int(port)) if port and port.isdigit() else None
    who = f", held by pid {holder} ({host.process_name(holder) or '?'})" if holder else ""
    return _cause(
        found,
        f"port {port} is already in use{who}" if port else "an address is already in use",
        None,
    )


def _worker_oom(ev: Evidence, said: str, kernel: list[str] | None) -> Cause | None:
    """A DataLoader worker the OOM killer ended ("DataLoader worker (pid(s) 123) exited
    unexpectedly" / "is killed by signal: Killed"): host memory, when the kernel says so."""
    if "DataLoader worker" not in said:
        return None
    pids = {
        int(p) for p in re.findall(r"\b(\d{2,9})\b", said.split("DataLoader worker", 1)[1][:200])
    }
    oom = host.oom_kill(pids, kernel) if pids else None
    return _host_oom(oom) if oom is not None else None


# ---------------------------------------------------------------- the GPU's and NCCL's
def _gpu_kinds(ev: Evidence, said: str, doctor: Doctor, kernel: list[str] | None) -> Cause | None:
    tail = "\n".join(ev.log_tail)
    for read in (
        words.cuda_oom,
        words.no_kernel_image,
        words.device_busy,
        words.collective_timeout,
        words.nccl_error,
        words.cuda_error,
    ):
        # A device-side assert's own line (which assert, where) is printed by the kernel to the log.
        found = read(f"{said}\n{tail}" if read is words.cuda_error else said)
        if found is not None:
            return _gpu(found, ev, doctor, None)
    return None


def _gpu(found: words.Found, ev: Evidence, doctor: Doctor, signame: str | None) -> Cause:
    f = found.facts
    by = f" (then {signame})" if signame else ""
    if found.kind == "cuda_oom":
        return _cuda_oom(found, ev)
    if found.kind == "shm_full":
        return _shm(found, doctor)
    if found.kind == "no_kernel_image":
        for check in ("torch", "arch_list"):
            answer = doctor.ask(check)
            if answer.status in ("fail", "warn") and answer.fix:
                return _cause(
                    found, answer.detail, answer.fix, [f"xl doctor ({check}): {answer.detail}"]
                )
        return _cause(found, "the GPU has no kernel of this build for its architecture", None)
    if found.kind == "device_busy":
        answer = doctor.ask("gpus")
        if answer.status in ("fail", "warn") and answer.fix:
            return _cause(
                found,
                f"the GPU is busy or unavailable: {answer.detail}",
                answer.fix,
                [f"xl doctor (gpus): {answer.detail}"],
            )
        return _cause(
            found,
            "the GPU is busy or unavailable (exclusive-process mode held by another process, or "
            "Prohibited)",
            "nvidia-smi -q -d COMPUTE,PIDS",
        )
    if found.kind == "collective_timeout":
        op = f"{f.get('op', 'a collective')}" + (f" #{f['seq']}" if "seq" in f else "")
        summary = f"{op} timed out after {f.get('timeout_s', '?')} s{by}"
        if ev.hang:
            summary += f"; xl's hang verdict: {ev.hang}"
        return _cause(found, summary, None)
    if found.kind == "nccl_error":
        what = f.get("what") or "error"
        summary = (
            f"NCCL {what}"
            + (f" ({f['code']})" if "code" in f else "")
            + (f": {f['last']}" if "last" in f else "")
            + by
        )
        answer = doctor.ask("nccl")
        facts = _network_facts(doctor)
        if answer.status in ("fail", "warn") and answer.fix:
            return _cause(found, f"{summary}; xl doctor: {answer.detail}", answer.fix, facts)
        return _cause(found, summary, _rerun(ev, "NCCL_DEBUG=INFO"), facts)
    what = f.get("what", "?")
    if "assert" in f:
        return _cause(
            found,
            f"a device-side assert failed{by}: {f.get('assertion', what)}",
            _rerun(ev, "CUDA_LAUNCH_BLOCKING=1"),
        )
    return _cause(
        found,
        f"CUDA error: {what}{by}",
        _rerun(ev, "CUDA_LAUNCH_BLOCKING=1") if "launch" in what else None,
    )


def _cuda_oom(found: words.Found, ev: Evidence) -> Cause:
    f = found.facts
    summary = f"CUDA out of memory: asked for {f['asked']}"
    if "gpu" in f:
        summary = (
            f"GPU {f['gpu']} out of memory: asked for {f['asked']} with {f['free']} free of "
            f"{f['total']}"
        )
    slack = _bytes(f.get("unallocated"))
    if slack:
        summary += f"; {f['unallocated']} reserved by PyTorch but unallocated"
    if slack and slack >= (_bytes(f["asked"]) or 0):
        fix = _rerun(ev, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    else:
        fix = (
            "halve the per-GPU batch size and double the gradient accumulation steps (the same "
            "global batch), or checkpoint activations (torch.utils.checkpoint)"
        )
    return _cause(found, summary, fix)


def _bytes(text: str | None) -> float | None:
    if not text:
        return None
    if text == "0 bytes":
        return 0.0
    number, unit = text.split()
    return float(number) * {
        "B": 1,
        "KiB": 1 << 10,
        "MiB": 1 << 20,
        "GiB": 1 << 30,
        "TiB": 1 << 40,
    }.get(unit, 1)


def _shm_small(doctor: Doctor) -> bool:
    return doctor.ask("shm").status in ("warn", "fail")


def _shm(found: words.Found, doctor: Doctor) -> Cause:
    facts = doctor.facts()
    total, free = facts.shm_total, facts.shm_free
    size = f" ({host.size(total)}, {host.size(free or 0)} free now)" if total is not None else ""
    answer = doctor.ask("shm")
    fix = answer.fix or doctor.grow_shm()
    summary = (
        f"shared memory {facts.shm_path}{size} is too small: DataLoader workers hand batches over "
        "through it (fewer workers, or torch.multiprocessing.set_sharing_strategy('file_system') "
        "for many tensors, also help)"
    )
    return _cause(
        found, summary, fix, [f"xl doctor (shm): {answer.detail}"] if answer.detail else []
    )


def _network_facts(doctor: Doctor) -> list[str]:
    facts = doctor.facts()
    said = []
    if facts.net_ifaces is not None:
        said.append(f"network interfaces: {', '.join(facts.net_ifaces) or 'none'}")
    if facts.ib_devices is not None:
        said.append(f"InfiniBand devices: {', '.join(facts.ib_devices) or 'none'}")
    nccl = {k: v for k, v in facts.env.items() if k.startswith("NCCL_")}
    if nccl:
        said.append("NCCL variables: " + " ".join(f"{k}={v}" for k, v in sorted(nccl.items())))
    return said


# ---------------------------------------------------------------- the rest
def _exception(ev: Evidence, tail: str) -> Cause:
    line = words.one_line(ev.error) or words.one_line(ev.traceback)
    if line is not None:
        return Cause(CauseKind.EXCEPTION, line, None, [line])
    last = next((ln.strip() for ln in reversed(ev.log_tail) if ln.strip()), None)
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


def _rerun(ev: Evidence, env: str) -> str | None:
    """The same launch again with ``env`` set (``xl launch --env K=V ...``)."""
    if ev.launch_args is None:
        return None
    return shlex.join(["xl", "launch", "--env", env, *ev.launch_args])


def _signame(code: int | None) -> str:
    if code is None:
        return "a signal"
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _cause(
    found: words.Found, summary: str, fix: str | None, more: list[str] | None = None
) -> Cause:
    return Cause(CauseKind(found.kind), summary, fix, [*found.evidence, *(more or [])])
