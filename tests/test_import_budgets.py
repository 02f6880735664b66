"""Each process of a run imports only what it needs, held to a budget like `import xl`'s.

A launch is `xl launch` (the command and its plain view), the supervisor (forked from it, then
importing its loop) and, in every rank, the rank entry before the user's script: each one's
imports are on the path from the command to the first step, so each has its own budget. The
figures are the modules each adds to a bare interpreter (deterministic) and the CPU time its
imports take beyond a bare interpreter's start (best of three), held to 2.5x the budget (a busy
machine must not fail it). Where
the time goes today is in bench/README.md.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# (statement, modules it may add, budget in CPU ms (today's cost), top-level packages it must never load)
PROCESSES = {
    # `xl launch --no-tui`: dispatch, the command, starting the run, the plain view (no Rich:
    # the end-of-run table is drawn without it).
    "launch": (
        "import xl.cli, xl.tui.commands, xl.launcher.cli.launch, xl.launcher.control, xl.launcher.cli.console",
        158,  # `--slurm`'s job submission (cli.sbatch, multinode.slurm) loads only when asked for
        130,
        ("rich", "textual", "torch", "numpy"),
    ),
    "supervisor": ("import xl.launcher.supervisor.loop", 185, 160, ("rich", "textual", "torch", "numpy")),
    # Every rank, before the user's first line: standard library and xl's own rank code only.
    "rank entry": ("import xl.launcher.rank.entry", 75, 25, ("rich", "textual", "torch", "numpy", "psutil", "orjson")),
}


def _added(statement: str) -> list[str]:
    code = f"import sys\nbefore = set(sys.modules)\n{statement}\nnew = sorted(set(sys.modules) - before)\nimport json\nprint(json.dumps(new))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cpu_ms(statement: str) -> float:
    """CPU time (user + system) of an interpreter that runs ``statement``, best of three: CPU,
    not wall time, so that other load on the machine moves it little."""
    code = (
        "import resource, subprocess, sys\n"
        "best = None\n"
        "for _ in range(3):\n"
        "    before = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "    subprocess.run([sys.executable, '-c', sys.argv[1]], check=True, timeout=120)\n"
        "    after = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "    took = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)\n"
        "    best = took if best is None else min(best, took)\n"
        "print(best * 1000)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, statement], capture_output=True, text=True, timeout=600, check=True)
    return float(out.stdout.strip())


def _import_ms(statement: str) -> float:
    """What ``statement``'s imports cost beyond a bare interpreter's start (CPU ms)."""
    return _cpu_ms(statement) - _cpu_ms("pass")


@pytest.mark.parametrize("process", list(PROCESSES))
def test_each_process_imports_only_what_it_needs(process: str) -> None:
    statement, max_modules, _, never = PROCESSES[process]
    added = _added(statement)
    heavy = sorted({m for m in added if m.split(".")[0] in never})
    assert not heavy, f"{process} loads {heavy}"
    assert len(added) <= max_modules, f"{process} adds {len(added)} modules (budget {max_modules}): {added}"


@pytest.mark.parametrize("process", list(PROCESSES))
def test_each_process_s_imports_stay_within_their_time_budget(process: str) -> None:
    statement, _, budget_ms, _ = PROCESSES[process]
    took = _import_ms(statement)
    assert took < 2.5 * budget_ms, f"{process}: imports took {took:.1f} ms of CPU (budget {budget_ms} ms, bound 2.5x)"


def test_the_budget_counts_what_a_statement_adds() -> None:
    # The counter itself: a heavy import shows up, a module already loaded does not.
    assert "json" in _added("import json") and _added("import sys") == []
    assert _import_ms("import json, decimal, email.parser, http.client") > 1
