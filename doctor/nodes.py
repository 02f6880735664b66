"""`xl doctor --nodes [HOST ...]`: every node's fingerprint, compared as a multi-node launch
compares them before its ranks start (doctor/fingerprint.py; docs/multinode.md, "One
environment across nodes").

Each host is asked over ssh, non-interactively (``BatchMode``: a host that would ask for a
password or a host key fails at once instead of waiting), with a connection timeout and a
timeout on the whole command: ``ssh HOST PYTHON -m xl doctor --fingerprint``, the interpreter
this `xl` runs under, as `xl sbatch` assumes (a venv on a shared file system is the same path on
every node). Hosts are asked side by side. With no host given, inside a Slurm allocation, its
nodes (``scontrol show hostnames``).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from xl.doctor.fingerprint import Diff, Fingerprint, compare, gather, node_lines
from xl.doctor.probes.commands import run_cmd
from xl.errors import UsageError

SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10")
ASK_TIMEOUT_S = 60.0  # ssh, the remote interpreter's start and its probes
_PARALLEL = 16


@dataclass(frozen=True)
class Asked:
    """One host's answer: its fingerprint, or why there is none."""

    node: int
    host: str
    fingerprint: Fingerprint | None
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "host": self.host, "error": self.error}


def allocation_hosts(env: Mapping[str, str]) -> list[str]:
    """The hosts of the Slurm allocation this runs in; UsageError outside one."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise UsageError(
            "--nodes needs hosts outside a Slurm allocation: xl doctor --nodes HOST [HOST ...]"
        )
    res = run_cmd(["scontrol", "show", "hostnames", nodelist], timeout=10.0)
    hosts = res.stdout.split() if res.ok else []
    if not hosts:
        raise UsageError(
            f"the allocation's nodes could not be listed ({res.problem or 'no hosts'}); "
            "give them: xl doctor --nodes HOST [HOST ...]"
        )
    return hosts


def remote_command(python: str | None) -> str:
    """What runs on each host, one line for its shell."""
    argv = [sys.executable, "-m", "xl", "doctor", "--fingerprint"]
    return shlex.join([*argv, *(["--python", python] if python else [])])


def ask(node: int, host: str, python: str | None) -> Asked:
    """``host``'s fingerprint over ssh; an unreachable host or an answer that is not one is
    said in ``error``."""
    argv = ["ssh", *SSH_OPTIONS, "--", host, remote_command(python)]
    res = run_cmd(argv, timeout=ASK_TIMEOUT_S, label=f"ssh {host}")
    if not res.ok:
        said = (res.stderr.strip().splitlines() or [res.problem or "no answer"])[-1]
        return Asked(node, host, None, f"could not be asked ({said[:300]})")
    try:
        data = json.loads(res.stdout.strip().splitlines()[-1])
        # named as it was asked for (the name a person gave, or the allocation's)
        return Asked(node, host, replace(Fingerprint.from_json(data), host=host))
    except (ValueError, IndexError, AttributeError):
        return Asked(node, host, None, f"answered no fingerprint: {res.first_line()!r}")


def ask_all(hosts: Sequence[str], python: str | None) -> list[Asked]:
    with ThreadPoolExecutor(max_workers=min(_PARALLEL, max(1, len(hosts)))) as pool:
        return list(pool.map(lambda nh: ask(nh[0], nh[1], python), enumerate(hosts)))


def report(asked: list[Asked], diffs: list[Diff]) -> str:
    """The comparison for a person, as a launch prints it: one line a node that differs (what it
    has, what the others have, its fixes), one a host that did not answer, then the verdict."""
    lines = [f"node {a.node} ({a.host}): {a.error}" for a in asked if a.error]
    lines += node_lines(diffs)
    got = [a for a in asked if a.fingerprint is not None]
    if any(d.severity == "stop" for d in diffs):
        lines.append("a run across these nodes cannot work until the differences marked so go")
    elif not diffs and len(got) >= 2:
        lines.append(f"{len(got)} nodes alike in everything a run needs to match")
    elif len(got) < 2:
        lines.append("fewer than two nodes answered: nothing to compare")
    return "\n".join(lines) + "\n"


def main_nodes(hosts: Sequence[str], python: str | None, as_json: bool) -> int:
    """Ask, compare, print; exit 1 when a difference stops a run or a host did not answer."""
    hosts = list(hosts) or allocation_hosts(os.environ)
    asked = ask_all(hosts, python)
    prints = [(a.node, a.fingerprint) for a in asked if a.fingerprint is not None]
    diffs = compare(prints)
    if as_json:
        doc = {"nodes": [a.to_json() for a in asked], "diffs": [d.to_json() for d in diffs]}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(report(asked, diffs))
    failed = any(a.error for a in asked) or any(d.severity == "stop" for d in diffs)
    return 1 if failed else 0


def print_fingerprint(python: str | None) -> int:
    """`xl doctor --fingerprint`: this host's, one JSON line (what --nodes reads over ssh)."""
    got = gather(python or sys.executable, dict(os.environ))
    sys.stdout.write(json.dumps(got.to_json()) + "\n")
    return 0
