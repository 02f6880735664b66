"""A held-out corpus of pasted rank outputs (rank_outputs.txt beside this file: the end of one
rank's log as people paste it into bug reports, prefixes and all), each read as the supervisor
reads a dead rank: its exit, its last lines, and its exception when xl's entry caught one. Each
must get the kind its header names; a script's own words about memory or files stay `exception`.

``python tests/launcher/causes/test_rank_outputs.py`` prints the score and the misses.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from deadrank import PY, make_doctor

from xl.launcher.causes import Evidence, explain
from xl.launcher.causes.doctor_facts import Doctor

CORPUS = Path(__file__).with_name("rank_outputs.txt")
_HEADER = re.compile(r"^=== (\S+)\s+kind=(\w+)\s+exit=(-?\d+)((?:\s+\w+(?:=\w+)?)*)\s*$")
_EXC = re.compile(r"^[A-Za-z_][\w.]*: ")


@dataclass
class Output:
    name: str
    kind: str
    exit_code: int
    caught: bool
    shm_small: bool
    lines: list[str]


def outputs() -> list[Output]:
    found: list[Output] = []
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        m = _HEADER.match(line)
        if m:
            flags = m.group(4).split()
            found.append(Output(m.group(1), m.group(2), int(m.group(3)), "caught" in flags,
                                "shm=small" in flags, []))
        elif found and not line.startswith("#"):
            found[-1].lines.append(line)
    for out in found:
        while out.lines and not out.lines[-1].strip():
            out.lines.pop()
    return found


def _doctor(shm_small: bool) -> Doctor:
    if shm_small:
        return make_doctor(shm_total=64 << 20, shm_free=0)
    return make_doctor()


def evidence(out: Output) -> Evidence:
    """What the supervisor has of this rank: its log's end, its exit, and when xl's entry caught
    the exception, that exception's text as Python formats it (from its last line naming it) and
    its traceback."""
    error = traceback = None
    if out.caught:
        start = max(i for i, ln in enumerate(out.lines) if ln.startswith("Traceback "))
        traceback = "\n".join(out.lines[start:])
        named = max(i for i, ln in enumerate(out.lines) if _EXC.match(ln) and i > start)
        error = "\n".join(out.lines[named:])
    return Evidence(
        rank=1, exit_code=out.exit_code, error=error, traceback=traceback, log_tail=out.lines,
        python=PY, cwd="/home/bo/proj", script="train.py",
        launch_args=["--nproc", "2", "--", "train.py"],
    )


def read(out: Output) -> str:
    return explain(evidence(out), _doctor(out.shm_small), []).kind.value


@pytest.mark.parametrize("out", outputs(), ids=lambda o: o.name)
def test_a_pasted_rank_output_gets_its_kind(out: Output) -> None:
    assert read(out) == out.kind, "\n".join(out.lines)


def test_the_corpus_is_large_and_varied() -> None:
    found = outputs()
    assert len(found) >= 30 and len({o.kind for o in found}) >= 12
    assert sum(not o.caught for o in found) >= 20  # most ranks printed their error and exited


if __name__ == "__main__":
    got = [(o, read(o)) for o in outputs()]
    right = sum(kind == o.kind for o, kind in got)
    print(f"{right} of {len(got)} right")
    for o, kind in got:
        if kind != o.kind:
            print(f"  {o.name}: {kind} (want {o.kind})")
    sys.exit(0 if right == len(got) else 1)
