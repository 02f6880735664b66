"""A rank's last output read as a person reads a log (docs/launch.md, "Why a rank died"). Pure
text, no I/O.

A rank that dies does not always raise into xl's entry: a framework logs the traceback and calls
``sys.exit(1)``, C++ aborts after printing ``what():``, a thread's exception is printed and the
main thread goes on to die of something else, a DataLoader worker is killed. What it left is its
output, with the prefixes torchrun (``[rank1]:``, ``[default1]:``), c10's logging
(``[E1103 04:12:09.774120 9012 ProcessGroupNCCL.cpp:616]``), NCCL (``host:pid:tid [dev]``) and
Python's logging (a timestamp, a level) put on its lines. ``read`` takes those off and keeps two
things a reader of causes may trust:

- ``error``: the last traceback's exception (from its ``Name: message`` line to the block's end,
  less torch's advice under a CUDA error), or without a traceback the last line that names an
  exception, with its continuation lines; its ``headline`` is the line that names it;
- ``library``: the lines libraries print in their own voice, wherever they are: NCCL's ``WARN``
  lines, c10's C++ log lines, C++'s ``terminate called`` and ``what():``, faulthandler's
  ``Fatal Python error``, a kernel's ``Assertion ... failed``, the DataLoader's worker messages,
  Python's ``can't open file``.

A line the script printed in its own words is in neither: it is only the last line, never a kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# torchrun's per-rank prefixes: "[rank1]:", "[default1]:" (--tee), "[1]:"; several may stack
# ("[rank0]:[E1103 ...]").
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)?\d+\]:\s?")
# c10's glog-style C++ lines: "[E1103 04:12:09.774120 9012 ProcessGroupNCCL.cpp:616] " (torch
# 2.4+), "[W socket.cpp:426] " (older), "E1103 04:12:09.774120 9012 file.cpp:1] ".
_GLOG = re.compile(
    r"^\[?[EWIF](?:\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ | )[\w./-]+\.(?:cpp|cc|h|hpp|cu):\d+\]\s?"
)
# NCCL's "host:pid:tid [dev] " before each of its lines.
_NCCL = re.compile(r"^\S+:\d+:\d+ \[\d+\] (?:[\w./-]+:\d+ )?")
_TIME = re.compile(
    r"^\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?\s*[-|]?\s*"
)
# "[__main__]", "[ERROR]", "[train.py:42]" after a timestamp (hydra's and many loggers' format)
_BRACKETS = re.compile(r"^(?:\[[\w.:/ -]+\]\s*)+-?\s*")
_LEVEL = re.compile(
    r"^(?:(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)(?::[\w.]*:|\s*[-:|]\s+|\s+)"
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):)"
)
_TRACEBACK = "Traceback (most recent call last):"
# A line naming an exception: "RuntimeError: ...", "torch.distributed.DistBackendError: ...",
# "ncclSystemError: ..." (a name that says it is an error), never a log line's "Error: ...".
_NAMED = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Fault): ")
# Lines libraries print in their own voice (after their prefixes are taken off).
_LIBRARY = re.compile(
    r"^terminate called after throwing|^\s*what\(\): |^Fatal Python error: "
    r"|Assertion `.*` failed|Unexpected bus error encountered in worker"
    r"|DataLoader worker \(pid\(?s?\)? [\d, ]+\) (?:is killed by signal|exited unexpectedly)"
    r"|^\S*python[\d.]*: can't open file |^slurmstepd: error: "
)
# What torch prints under every CUDA error's own line, whatever the error: advice, not the error
# (a reader takes the error's line for its headline, and its kind from the error's words).
_TRAILER = re.compile(
    r"^(?:CUDA kernel errors might be asynchronously reported at some other API call"
    r"|For debugging consider passing CUDA_LAUNCH_BLOCKING=1"
    r"|Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions"
    r"|Device-side assertions? (?:tracking was not enabled|were explicitly omitted))"
)
_ERROR_LINES = 40  # an exception's text: its line and what follows it in the block, at most


@dataclass(frozen=True)
class Said:
    """What a rank's output says, read: ``error`` (its last exception's text, None when it
    printed none), ``library`` (lines libraries wrote) and ``lines`` (all of it, prefixes off)."""

    error: str | None = None
    library: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def headline(self) -> str | None:
        """The error's line that names its exception (a wrapper's last one: the real error under
        it), else its first line; None when it printed no error."""
        if not self.error:
            return None
        lines = self.error.splitlines()
        named = [ln for ln in lines if _NAMED.match(ln)]
        return named[-1] if named else lines[0]


def clean(line: str) -> tuple[str, bool]:
    """``line`` without torchrun's, c10's, NCCL's and logging's prefixes; and whether one of them
    was C++'s or NCCL's own (the line is a library's)."""
    text = line.rstrip()
    library = False
    for _ in range(4):
        before = text
        text = _RANK_PREFIX.sub("", text)
        glog = _GLOG.match(text)
        if glog:
            text, library = text[glog.end():], True
        nccl = _NCCL.match(text)
        if nccl and "NCCL " in text:
            text, library = text[nccl.end():], True
        stamp = _TIME.match(text)
        if stamp:
            text = _BRACKETS.sub("", text[stamp.end():])
        text = _LEVEL.sub("", text, count=1)
        if text == before:
            break
    if text.startswith("NCCL WARN "):
        text, library = text[len("NCCL WARN "):], True
    elif text.startswith("NCCL INFO "):
        library = False  # NCCL's chatter: no cause in it
    return text, library or bool(_LIBRARY.search(text))


def read(lines: list[str]) -> Said:
    """The rank's last lines, read (see the module's docstring)."""
    texts: list[str] = []
    library_lines: list[str] = []
    for raw in lines:
        text, library = clean(raw)
        texts.append(text)
        if library and text.strip():
            library_lines.append(text.strip())
    return Said(_last_error(texts), library_lines, texts)


def _last_error(lines: list[str]) -> str | None:
    start = next(
        (i for i in range(len(lines) - 1, -1, -1) if lines[i].strip() == _TRACEBACK), None
    )
    if start is not None:
        # The first line after the frames that names an exception: the block's own error (a
        # DataLoader worker's "Original Traceback" and a chained one follow it, in its text).
        at = next((i for i in range(start + 1, len(lines)) if _NAMED.match(lines[i])), None)
        if at is None:
            return None  # cut before its error line
        return _error_text(lines[at:at + _ERROR_LINES])
    at = next((i for i in range(len(lines) - 1, -1, -1) if _NAMED.match(lines[i])), None)
    if at is None:
        return None
    # torch's error and NCCL's code under it ("DistBackendError: ...", "ncclSystemError: ..."):
    # one error, from its first line.
    while at > 0 and _NAMED.match(lines[at - 1]):
        at -= 1
    return _error_text(lines[at:at + _ERROR_LINES // 4])


def _error_text(lines: list[str]) -> str | None:
    """An exception's lines as the script printed them, every one of its own message kept, less
    the advice torch prints under each CUDA error."""
    kept = [ln.strip() for ln in lines if ln.strip() and not _TRAILER.match(ln.strip())]
    return "\n".join(kept) or None
