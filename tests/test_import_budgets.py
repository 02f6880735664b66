"""Each process of a run imports only what it needs, held to a budget like `import xl`'s.

A launch is `xl launch` (the command and its plain view), the supervisor (forked from it, then
importing its loop) and, in every rank, the rank entry before the user's script: each one's
imports are on the path from the command to the first step, so each has its own budget. The
supervisor's is what it imports before it starts torchrun; the rest of its loop loads while
torchrun starts. The
test holds each to the modules it adds to a bare interpreter: a count, the same on a busy machine
as on an idle one. The CPU those imports take is a benchmark's, not a test's
(bench/bench_imports.py prints it beside each process's ``cpu_ms``); where the time goes today is
in bench/README.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import NamedTuple

import pytest


class Budget(NamedTuple):
    statement: str  # what the process imports
    modules: int  # how many modules it may add
    cpu_ms: int  # the CPU its imports took when last measured (bench/bench_imports.py)
    never: tuple[str, ...]  # top-level packages it must never load
    after: str = "pass"  # what the process already has: counted neither in modules nor in time


# `xl launch`'s own imports, up to the fork of its supervisor.
LAUNCH = "import xl.cli, xl.tui.commands, xl.launcher.cli.launch, xl.launcher.control"
UI = ("rich", "textual", "torch", "numpy")
# What only an unusual launch needs (--python's environment hash, a mistyped option's suggestion,
# --rdzv's token) or a crash (traceback): never on every launch's path to torchrun.
RARE = ("hashlib", "secrets", "difflib", "tempfile")
PROCESSES = {
    # A training script's `import xl` (tests/test_boundaries.py holds which modules those are):
    # the package root exports its names lazily, so the script pays for what it calls.
    "import xl": Budget("import xl", 15, 3, (*UI, *RARE, "psutil", "pynvml", "orjson")),
    # `xl launch --no-tui`: dispatch, the command, starting the run, the plain view (no Rich:
    # the end-of-run table is drawn without it).
    "launch": Budget(
        LAUNCH + ", xl.launcher.cli.console",
        # `--slurm`'s job submission, `--rdzv`'s and `--python`'s code load only when asked for;
        # xl.cgroup makes the run's cgroup before the fork; the plain view's rank cells are
        # endtable's (the live table and the end table are one row format) and the run's
        # figures take their medians from xl.stats; the plain view's reader is a package of its
        # own (xl.launcher.view) and parses events and metrics lines into typed values
        # (rundir/events.py, rundir/metrics.py)
        108,
        90,
        # psutil once torchrun runs; pynvml only where libnvidia-ml loads; orjson for big polls
        # only, and statistics (fractions, decimal, random) never: xl.stats has the medians.
        (*UI, *RARE, "psutil", "pynvml", "orjson", "statistics"),
    ),
    # The supervisor up to torchrun's start, in a fresh interpreter (the app starts it so):
    # telemetry, the digest and provenance load once torchrun runs, the hub and the follower on
    # several nodes only (launcher/supervisor/loop.py, Supervisor.start); xl.cgroup starts
    # torchrun in the run's cgroup.
    "supervisor": Budget(
        # (events.py parses its lines with the run dir's one JSONL decoder, rundir/jsonl.py)
        "import xl.launcher.supervisor.loop", 77, 40, (*UI, *RARE, "traceback", "psutil")
    ),
    # ... and forked from `xl launch` (what it imported is there already): what it adds before
    # torchrun starts, on the path from the command to the first step. The typed events
    # (rundir/events.py) load here, not in `xl launch`, which writes none.
    "supervisor, forked": Budget(
        "import xl.launcher.supervisor.loop", 15, 15, (*UI, "psutil"), after=LAUNCH
    ),
    # ... and once torchrun runs: telemetry (the collector, the sampler, the parsers), the digest
    # and provenance, while torchrun imports torch beside them. Its CPU slows torch's import on
    # a machine with few cores, so psutil (the sampler and the checks read /proc themselves),
    # secrets (os.urandom names requests and sockets) and the thread pool that only asks ranks
    # for their stacks are left out, as are statistics and orjson (as in the command). The digest
    # (xl.launcher.view) and the hang capture (xl.launcher.stacks) each come with their package;
    # a diagnosis (telemetry/diagnosis.py), the roster (telemetry/roster.py), a rank's stacks
    # (stacks/model.py) and its collectives (stacks/collectives.py: columns shared across ranks,
    # so a 4,096-rank document leaves the garbage collector few objects) are typed values of
    # modules of their own.
    "supervisor, once torchrun runs": Budget(
        "import xl.launcher.telemetry.service, xl.launcher.view.digest, xl.launcher.provenance",
        42,
        25,
        (*UI, "psutil", "secrets", "concurrent", "tempfile", "orjson", "statistics"),
        after=LAUNCH + ", xl.launcher.supervisor.loop",
    ),
    # Every rank, before the user's first line: standard library and xl's own rank code only
    # (today 43 modules, 13-26 ms of CPU on an idle 2-core machine; most of them are modules
    # `import torch` loads anyway).
    "rank entry": Budget(
        "import xl.launcher.rank.entry",
        45,
        30,
        (*UI, "psutil", "orjson", "tempfile", "random", "secrets"),
    ),
}
# What the supervisor's loop needs only once torchrun runs, or on several nodes: never imported
# before torchrun starts (each costs the start of every run: ~50 ms of CPU together).
AFTER_TORCHRUN = (
    "xl.launcher.telemetry.service",
    "xl.launcher.view.digest",
    "xl.launcher.provenance",
    "xl.launcher.supervisor.hub",
    "xl.launcher.supervisor.follower",
    "xl.launcher.multinode.nodelink",
)


def _added(statement: str, after: str = "pass") -> list[str]:
    code = (
        f"import sys\n{after}\nbefore = set(sys.modules)\n{statement}\nnew = "
        "sorted(set(sys.modules) - before)\nimport json\nprint(json.dumps(new))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("process", list(PROCESSES))
def test_each_process_imports_only_what_it_needs(process: str) -> None:
    budget = PROCESSES[process]
    added = _added(budget.statement, budget.after)
    heavy = sorted({m for m in added if m.split(".")[0] in budget.never})
    assert not heavy, f"{process} loads {heavy}"
    assert len(added) <= budget.modules, (
        f"{process} adds {len(added)} modules (budget {budget.modules}): {added}"
    )


def test_the_supervisor_starts_torchrun_before_importing_what_only_its_loop_needs() -> None:
    loaded = sorted(set(AFTER_TORCHRUN) & set(_added("import xl.launcher.supervisor.loop")))
    assert not loaded, f"the supervisor imports {loaded} before it starts torchrun"


def test_the_budget_counts_what_a_statement_adds() -> None:
    # The counter itself: a heavy import shows up, a module already loaded does not.
    assert "json" in _added("import json") and _added("import sys") == []
