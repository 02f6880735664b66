"""What a dying rank's own words mean: Python's, argparse's, torch's, gloo's and NCCL's messages,
read as they are printed (docs/launch.md, "Why a rank died"). Pure text, no I/O.

Each reader takes the rank's text (its error line, traceback and last log lines together) and
returns what it found, with the line it was read from; ``explain`` turns that into a cause.
The wordings are torch's and NCCL's own: c10's CUDA caching allocator, c10d's ProcessGroupNCCL
and its watchdog, gloo's TCP transport, TCPStore, the DataLoader's workers and libshm.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# A line that names an exception: a (dotted) identifier, a colon, the message.
_EXC_LINE = re.compile(
    r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Quit|Fault)?: \S"
)
_EXC_NAME = re.compile(r"^([A-Za-z_][\w.]*):")


def one_line(error: str | None, limit: int = 300) -> str | None:
    """One line for a person from an exception's text as Python prints it (possibly several
    lines: a worker's "Original Traceback", NCCL's "Last error:"): the last line that names an
    exception (the real error under a wrapper's), else its first line; cut to ``limit``."""
    if not error or not error.strip():
        return None
    lines = [ln.strip() for ln in error.strip().splitlines() if ln.strip()]
    named = [ln for ln in lines if _EXC_LINE.match(ln) and not ln.startswith("File ")]
    line = named[-1] if named else lines[0]
    return line if len(line) <= limit else line[: limit - 1] + "\u2026"


# A rank whose collective or store connection broke because a peer was gone: never the root
# cause while a peer that died first is known (gloo's TCP pair, TCPStore's socket, NCCL's
# remote errors, a watchdog timeout that follows a peer's death).
_PEER_LOSS = re.compile(
    r"Connection reset by peer|Broken pipe|Connection closed by peer|Connection refused"
    r"|ncclRemoteError|remote process exit|remote peer|Socket Timeout|recvValue failed|"
    r"Watchdog caught collective operation timeout|Timed out waiting \d+ms for (?:send|recv)"
    r"|DistNetworkError|failed to recv, got 0 bytes|Transport endpoint is not connected"
    r"|read: Connection timed out|The client socket has failed to connect",
    re.IGNORECASE,
)


def peer_loss(text: str) -> str | None:
    """The line saying this rank lost a peer (its collective or store connection broke)."""
    for line in text.splitlines():
        if _PEER_LOSS.search(line):
            return line.strip()
    return None


@dataclass(frozen=True)
class Found:
    """What a reader found: the kind, what it read (``facts``, for the summary and the fix),
    and the lines it read them from."""

    kind: str
    facts: dict[str, str] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)


def _line_of(text: str, pattern: re.Pattern[str]) -> tuple[re.Match[str], str] | None:
    for line in text.splitlines():
        m = pattern.search(line)
        if m:
            return m, line.strip()
    return None


def _first(kind: str, text: str, pattern: re.Pattern[str], fact: str | None = None) -> Found | None:
    """The first line ``pattern`` matches, found as ``kind``; ``fact`` names what its first group
    caught (none: the line is all there is to say)."""
    hit = _line_of(text, pattern)
    if hit is None:
        return None
    m, line = hit
    return Found(kind, {fact: m.group(1)} if fact else {}, [line])


# ---------------------------------------------------------------- Python's and the shell's
_NO_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([^']+)'")
# transformers' words for a package it needs and does not find, inside its own import.
_NOT_INSTALLED = re.compile(
    r"ImportError: .*?the package (\w+) seems to be not installed"
    r"|ImportError: This modeling file requires the following packages that were not found in "
    r"your environment: ([\w, .-]+?)\. Run"
)
_NO_FILE = re.compile(r"FileNotFoundError: \[Errno 2\] No such file or directory: '([^']*)'")
# Python itself, for a script path that is not there: "python3: can't open file '/a/b.py':
# [Errno 2] No such file or directory" (exit 2).
_NO_SCRIPT = re.compile(r"can't open file '([^']*)': \[Errno 2\]")
_USAGE = re.compile(r"^(?:usage|Usage): ")
_ARGPARSE_ERROR = re.compile(r"^\S+: error: (.+)$")
_CLICK_ERROR = re.compile(r"^Error: (.+)$")
# jsonargparse (LightningCLI) prints argparse's usage, then "error: ..." without the program.
_BARE_ERROR = re.compile(r"^error: (.+)$")
# typer (rich) draws click's error in a box: "╭─ Error ───╮", "│ No such option: --x │".
_BOX_TOP = re.compile(r"^\s*[\u256d\u250c+][\u2500\u2501-]+ Error [\u2500\u2501-]+")
_BOX_ROW = re.compile(r"^\s*[\u2502|]\s?(.*?)\s*[\u2502|]\s*$")
# hydra refuses an override in a few lines ending with how to see its stack, and exits 1.
_HYDRA_FULL = "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."
_HYDRA_OVERRIDE = re.compile(
    r"^(?:Could not override '|Could not append to config|Could not delete from config|Error "
    r"merging override|Error parsing override|mismatched input|no viable alternative at input"
    r"|extraneous input|Key '[^']*' is not in struct|Ambiguous value for argument)"
)
_ADDR_IN_USE = re.compile(r"(?:Address already in use|EADDRINUSE|address already in use)")
# TCPStore's "port: 29500", "[::]:29500", "0.0.0.0:29500", "host:29500" (never a "file.cpp:464")
_PORT = re.compile(r"\bport:? (\d{1,5})\b|(?:\]|\b\d+\.\d+\.\d+\.\d+|\blocalhost):(\d{1,5})\b")


def module_not_found(text: str) -> Found | None:
    found = _first("module_not_found", text, _NO_MODULE, "module")
    if found is not None:
        return found
    hit = _line_of(text, _NOT_INSTALLED)
    if hit is None:
        return None
    m, line = hit
    names = [n.strip() for n in (m.group(1) or m.group(2)).split(",") if n.strip()]
    return Found("module_not_found", {"module": names[0], "modules": " ".join(names)}, [line[:400]])


def file_not_found(text: str) -> Found | None:
    found = _first("file_not_found", text, _NO_SCRIPT, "path")
    if found is not None:
        found.facts["script"] = "1"
        return found
    return _first("file_not_found", text, _NO_FILE, "path")


def usage_error(text: str, exit_code: int | None) -> Found | None:
    """A command line refused: argparse's ``prog: error: ...`` and jsonargparse's ``error: ...``
    after a usage line, click's ``Error: ...`` and typer's boxed error after ``Usage:``, all
    exiting 2; hydra's override errors, exiting 1."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    if exit_code == 1 and _HYDRA_FULL in (ln.strip() for ln in lines):
        end = max(i for i, ln in enumerate(lines) if ln.strip() == _HYDRA_FULL)
        said = [ln.strip() for ln in lines[max(0, end - 8):end]]
        first = next((i for i, ln in enumerate(said) if _HYDRA_OVERRIDE.match(ln)), None)
        if first is None:
            return None
        message = ": ".join(
            ln.rstrip(".") for ln in said[first:] if not ln.startswith(("full_key", "object_type"))
            and not ln.startswith("To append")
        )
        return Found("usage_error", {"message": message[:300]}, [*said[first:], _HYDRA_FULL])
    if exit_code != 2:
        return None
    usage = next((x.strip() for x in lines if _USAGE.match(x)), None)
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        m = _ARGPARSE_ERROR.match(line) or (
            (_CLICK_ERROR.match(line) or _BARE_ERROR.match(line)) if usage else None
        )
        message = line.strip()
        if m is None and usage and _BOX_TOP.match(line):
            rows = [r.group(1) for ln in lines[i + 1:] if (r := _BOX_ROW.match(ln))]
            if rows:
                message = "Error: " + " ".join(r.strip() for r in rows if r.strip())
                m = _CLICK_ERROR.match(message)
        if m and m.re is _BARE_ERROR:
            # jsonargparse's message goes on, indented, on the lines under it
            more = [ln.strip() for ln in lines[i + 1:i + 4] if ln.startswith((" ", "\t"))]
            message = " ".join([message, *more])
        if m:
            return Found(
                "usage_error", {"message": message[:300]}, [x for x in (usage, message) if x]
            )
    return None


def port_in_use(text: str) -> Found | None:
    hit = _line_of(text, _ADDR_IN_USE)
    if hit is None:
        return None
    _, line = hit
    m = _PORT.search(line)
    port = next((g for g in m.groups() if g), "") if m else ""
    return Found("port_in_use", {"port": port} if port else {}, [line])


# ---------------------------------------------------------------- memory
_CUDA_OOM = re.compile(r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMGT]?i?B)")
_OOM_NEW = re.compile(
    r"GPU (\d+) has a total capac(?:i)?ty of ([\d.]+ [KMGT]?i?B) of which ([\d.]+ [KMGT]?i?B|0 "
    r"bytes) is free"
)
_OOM_OLD = re.compile(
    r"\(GPU (\d+); ([\d.]+ [KMGT]?i?B) total capacity; [^;]*; ([\d.]+ [KMGT]?i?B) free"
)
_OOM_SLACK = re.compile(r"([\d.]+ [KMGT]?i?B|0 bytes) is reserved by PyTorch but unallocated")
_SHM = re.compile(
    r"unable to allocate shared memory\(shm\)|unable to write to file </torch_|unable to open "
    r"shared memory object|insufficient shared memory|Couldn't allocate shared memory "
    r"segment|failed to extend /dev/shm"
    r"|/dev/shm/nccl-\S+ .*(?:No space left|failed)|shared memory segment /dev/shm/"
    r"|Unexpected bus error encountered in worker"
    r"|DataLoader worker \(pid\(?s?\)? [\d, ]+\) is killed by signal: Bus error",
)
# The CUDA runtime's own word for an allocation that failed outside torch's allocator (a
# context, cuBLAS's workspace, NCCL's buffers): no figures.
_CUDA_OOM_BARE = re.compile(r"CUDA error: out of memory|Cuda failure '?out of memory'?")


def cuda_oom(text: str) -> Found | None:
    hit = _line_of(text, _CUDA_OOM)
    if hit is None:
        return _first("cuda_oom", text, _CUDA_OOM_BARE)
    m, line = hit
    facts = {"asked": m.group(1)}
    gpu = _OOM_NEW.search(text) or _OOM_OLD.search(text)
    if gpu is not None:
        facts.update(gpu=gpu.group(1), total=gpu.group(2), free=gpu.group(3))
    slack = _OOM_SLACK.search(text)
    if slack is not None:
        facts["unallocated"] = slack.group(1)
    return Found("cuda_oom", facts, [line[:400]])


def shm_full(text: str) -> Found | None:
    return _first("shm_full", text, _SHM)


# ---------------------------------------------------------------- CUDA and NCCL
_NO_KERNEL = re.compile(r"no kernel image is available for execution on the device")
_BUSY = re.compile(
    r"CUDA-capable device\(s\) is/are busy or unavailable|all CUDA-capable devices are busy or "
    r"unavailable"
)
_CUDA_ERROR = re.compile(r"CUDA error: ([^\n]+)")
_DEVICE_ASSERT = re.compile(r"device-side assert triggered")
_NCCL_CODE = re.compile(
    r"\b(nccl(?:UnhandledCuda|System|Internal|InvalidArgument|InvalidUsage|Remote)Error)\b"
)
_NCCL_ERROR = re.compile(
    r"NCCL error in: [^,]*, ([^(\n]+?)(?: \(run with NCCL_DEBUG=INFO for details\))?(?:, NCCL "
    r"version ([\d.]+\S*))?$"
)
_NCCL_LAST = re.compile(r"^Last error:\s*$")
_WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout: Work\w+\(SeqNum=(\d+), "
    r"OpType=(\w+)[^)]*?Timeout\(ms\)=(\d+)\) ran for (\d+) milliseconds"
)
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (send|recv) operation to complete")


def no_kernel_image(text: str) -> Found | None:
    return _first("no_kernel_image", text, _NO_KERNEL)


def device_busy(text: str) -> Found | None:
    return _first("device_busy", text, _BUSY)


def collective_timeout(text: str) -> Found | None:
    hit = _line_of(text, _WATCHDOG)
    if hit is not None:
        m, line = hit
        facts = {
            "seq": m.group(1),
            "op": m.group(2),
            "timeout_s": f"{int(m.group(3)) / 1000:g}",
            "ran_s": f"{int(m.group(4)) / 1000:g}",
        }
        return Found("collective_timeout", facts, [line[:400]])
    gloo = _line_of(text, _GLOO_TIMEOUT)
    if gloo is not None:
        m, line = gloo
        return Found(
            "collective_timeout",
            {"op": m.group(2), "timeout_s": f"{int(m.group(1)) / 1000:g}"},
            [line[:400]],
        )
    return None


def nccl_error(text: str) -> Found | None:
    code = _line_of(text, _NCCL_CODE)
    error = next(
        ((m, ln.strip()) for ln in text.splitlines() if (m := _NCCL_ERROR.search(ln.strip()))), None
    )
    if code is None and error is None:
        return None
    facts: dict[str, str] = {}
    evidence: list[str] = []
    if error is not None:
        facts["what"] = error[0].group(1).strip()
        if error[0].group(2):
            facts["version"] = error[0].group(2)
        evidence.append(error[1][:400])
    if code is not None:
        facts["code"] = code[0].group(1)
        evidence.append(code[1][:400])
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if _NCCL_LAST.match(line.strip()) and lines[i + 1].strip():
            facts["last"] = lines[i + 1].strip()[:300]
            evidence.append(facts["last"])
            break
    return Found("nccl_error", facts, evidence)


def cuda_error(text: str) -> Found | None:
    hit = _line_of(text, _CUDA_ERROR)
    if hit is None:
        return None
    m, line = hit
    facts = {"what": m.group(1).strip()}
    if _DEVICE_ASSERT.search(text):
        facts["assert"] = "1"
        asserted = next(
            (ln.strip() for ln in text.splitlines() if "Assertion" in ln and "failed" in ln), None
        )
        if asserted:
            facts["assertion"] = asserted[:300]
            return Found("cuda_error", facts, [asserted[:300], line[:300]])
    return Found("cuda_error", facts, [line[:400]])


# ---------------------------------------------------------------- a crash
_FATAL = re.compile(
    r"^Fatal Python error: (Segmentation fault|Bus error|Aborted|Floating point exception|Illegal "
    r"instruction)"
)
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)')


def fatal_signal(text: str, skip_files: tuple[str, ...] = ()) -> Found | None:
    """faulthandler's dump (the rank entry turns it on): the signal and the innermost Python
    line of the thread that crashed ("Current thread", most recent call first)."""
    lines = text.splitlines()
    at = next((i for i in range(len(lines) - 1, -1, -1) if _FATAL.match(lines[i].strip())), None)
    if at is None:
        return None
    what = _FATAL.match(lines[at].strip())
    assert what is not None
    facts = {"signal": what.group(1)}
    evidence = [lines[at].strip()]
    current = "Current thread" not in text
    frames: list[tuple[re.Match[str], str]] = []
    for line in lines[at + 1 :]:
        if line.startswith("Current thread"):
            current = True
            continue
        if line.startswith("Thread 0x") and frames:
            break  # the next thread's stack
        m = _FRAME.match(line)
        if m and current and not m.group(1).endswith(skip_files):
            frames.append((m, line.strip()))
    if frames:
        inner = frames[0][0]
        facts.update(file=inner.group(1), line=inner.group(2), function=inner.group(3))
        evidence.append(frames[0][1])
        # The script's own line that called into it: the innermost frame outside Python's
        # library and installed packages.
        own = next(((m, ln) for m, ln in frames if not _LIBRARY.search(m.group(1))), None)
        if own is not None and own[0] is not inner:
            facts.update(
                caller_file=own[0].group(1),
                caller_line=own[0].group(2),
                caller_function=own[0].group(3),
            )
            evidence.append(own[1])
    return Found("segfault", facts, evidence)


_LIBRARY = re.compile(
    r"/lib/python\d[\d.]*/|site-packages|dist-packages|^<frozen "
    r"|/xl/launcher/|/launcher/(?:rank/)?entry\.py$"
)


def exception_name(error: str | None) -> str | None:
    m = _EXC_NAME.match(error or "")
    return m.group(1) if m else None
