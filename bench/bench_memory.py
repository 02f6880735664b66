"""Memory of xl's own processes at scale: PSS (not RSS) at 8 and 64 ranks, against torchrun's agent.

    .venv/bin/python bench/bench_memory.py [--ranks 8 64] [--repeat 3] [--before DIR]

Each rank (stdlib only) says it is up and sleeps until told to go; once every rank is up the
bench reads ``Pss`` from /proc/<pid>/smaps_rollup of every process of the run and sums it by
role: the torchrun agent, the ranks, and what xl adds (the `xl launch` view, the supervisor and
one output relay per rank). PSS shares a page's cost among the processes that map it, so the
relays (forks of their rank, sharing its pages) count for what they really cost. The anchor is
plain torchrun with the same ranks, measured alternately in the same run; medians of --repeat.
``--before DIR``: also measure another xl (DIR/xl is its package, first on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

SCRIPT = """\
import os, pathlib, time
here = pathlib.Path(__file__).parent
(here / f"up-{os.environ['RANK']}").touch()
deadline = time.monotonic() + 300
while not (here / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def pss_kib(pid: int) -> int:
    return _rollup(pid).get("Pss", 0)


def uss_kib(pid: int) -> int:
    """Memory only this process holds (freed if it ended): its private pages."""
    rollup = _rollup(pid)
    return rollup.get("Private_Clean", 0) + rollup.get("Private_Dirty", 0)


def _rollup(pid: int) -> dict[str, int]:
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if rest.strip().endswith("kB"):
                    found[key] = int(rest.split()[0])
    except OSError:
        pass
    return found


def _roles(root: psutil.Process) -> Iterator[tuple[psutil.Process, str]]:
    """Every process under ``root`` (itself included) with its role, known from where it sits:
    under `xl launch` the view forks the supervisor, which starts torchrun; torchrun's
    children are the ranks, and a rank's child is its output relay."""
    first = (
        "torchrun agent"
        if "torch.distributed.run" in " ".join(root.cmdline())
        else "xl launch (view)"
    )
    todo: list[tuple[psutil.Process, str]] = [(root, first)]
    below = {
        "xl launch (view)": "supervisor",
        "supervisor": "torchrun agent",
        "torchrun agent": "ranks",
        "ranks": "relays",
    }
    while todo:
        proc, role = todo.pop()
        try:
            kids = proc.children()
        except psutil.Error:
            continue
        yield proc, role
        todo.extend((k, below.get(role, "other")) for k in kids)


def measure(
    argv: list[str], env: dict[str, str], tmp: Path, ranks: int
) -> dict[str, tuple[int, int]]:
    """PSS by role (KiB, process count) once every rank is up."""
    for f in tmp.glob("up-*"):
        f.unlink()
    (tmp / "go").unlink(missing_ok=True)
    proc = subprocess.Popen(
        argv, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 240
        while len(list(tmp.glob("up-*"))) < ranks:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"{argv[:5]}: ranks did not come up")
            time.sleep(0.1)
        time.sleep(2.0)  # the supervisor's first ticks after the ranks started
        roles: dict[str, tuple[int, int]] = {}
        for p, role in _roles(psutil.Process(proc.pid)):
            kib, n = roles.get(role, (0, 0))
            roles[role] = (kib + pss_kib(p.pid), n + 1)
            if role == "relays":
                uss, _ = roles.get("relays (private)", (0, 0))
                roles["relays (private)"] = (uss + uss_kib(p.pid), n + 1)
        return roles
    finally:
        (tmp / "go").touch()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--before", metavar="DIR", help="another xl to measure alongside (DIR/xl is its package)"
    )
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="xl-bench-mem-") as tmp_s:
        tmp = Path(tmp_s)
        script = tmp / "idle.py"
        script.write_text(SCRIPT)
        env = dict(os.environ, XL_HOME=str(tmp / "home"))
        env.pop("CUDA_VISIBLE_DEVICES", None)
        for n in ns.ranks:
            xl = [sys.executable, "-m", "xl", "launch", "--no-tui", "--nproc", str(n), str(script)]
            torchrun = [
                sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
                str(script),
            ]
            runs = {"torchrun": (torchrun, env), "xl": (xl, env)}
            if ns.before:
                runs["xl (before)"] = (xl, dict(env, PYTHONPATH=os.path.abspath(ns.before)))
            found: dict[str, list[dict[str, tuple[int, int]]]] = {name: [] for name in runs}
            for _ in range(ns.repeat):
                for name, (argv, run_env) in runs.items():
                    found[name].append(measure(argv, run_env, tmp, n))
            for name in runs:
                if name != "torchrun":
                    _report(n, name, found[name], found["torchrun"])
    return 0


def _med(runs: list[dict[str, tuple[int, int]]], role: str) -> tuple[float, int]:
    return statistics.median(r.get(role, (0, 0))[0] for r in runs) / 1024, max(
        r.get(role, (0, 0))[1] for r in runs
    )


def _report(
    n: int,
    name: str,
    xl_runs: list[dict[str, tuple[int, int]]],
    tr_runs: list[dict[str, tuple[int, int]]],
) -> None:
    agent, _ = _med(tr_runs, "torchrun agent")
    tr_ranks, _ = _med(tr_runs, "ranks")
    print(f"{n} ranks, {name} (PSS, MiB, median of {len(xl_runs)}):")
    print(f"  torchrun alone: agent {agent:.1f}, ranks {tr_ranks:.1f} ({tr_ranks / n:.2f} each)")
    own = 0.0
    for role in (
        "xl launch (view)", "supervisor", "relays", "relays (private)", "torchrun agent", "ranks",
    ):
        mib, count = _med(xl_runs, role)
        each = f" ({mib / count:.2f} each)" if count > 1 else ""
        print(f"  {role:17} {mib:7.1f} in {count} process(es){each}")
        if role in ("xl launch (view)", "supervisor", "relays"):
            own += mib
    ranks, _ = _med(xl_runs, "ranks")
    # A relay is a fork of its rank: PSS splits their shared pages between the two. What the
    # relays alone add is their private memory (USS); what xl adds to each rank in all (the rank
    # entry's imports and threads, and the relay) is (ranks + relays) minus torchrun's ranks.
    added = ranks + _med(xl_runs, "relays")[0] - tr_ranks
    print(f"  view + supervisor + relays: {own:.1f} MiB = {own / agent:.2f}x torchrun's agent")
    print(f"  ranks + relays minus torchrun's ranks: {added:.1f} MiB ({added / n:.2f} a rank)")
    whole = own + _med(xl_runs, "torchrun agent")[0] + ranks
    print(
        f"  whole run: {whole:.1f} MiB vs torchrun's {agent + tr_ranks:.1f} MiB = "
        f"{whole / (agent + tr_ranks):.2f}x"
    )


if __name__ == "__main__":
    raise SystemExit(main())
