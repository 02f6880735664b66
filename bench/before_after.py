"""The benches that a change to the house's insides must leave alone, this tree against an earlier
revision, measured side by side on the same machine in the same minutes.

    .venv/bin/python bench/before_after.py --before REV [--rounds 3] [--only launch,reader,...]

- launch: bench_launch.py with ``--before`` (its own alternating rounds; xl / torchrun and the
  earlier xl in the same rounds);
- reader: bench_reader.py ``--ref REV`` (one poll's CPU against json.loads, each tree a round);
- collector: bench_collector.py, each tree's own script in a process of its own, alternating
  which goes first, round by round: records stored per collector CPU-second and drops;
- app: bench_tui.py likewise: the Monitor's CPU on 64 ranks, % of one core.

For the two run here, each round runs both trees one after the other (the order turns every
round), and the paired ratio this tree / REV is printed as its median and range over the rounds:
load that changes between rounds lands on both sides of a pair alike.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_reader import unpack

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

# bench -> (its arguments here, the figure read from its output, whether higher is better)
PAIRED: dict[str, tuple[list[str], re.Pattern[str], bool]] = {
    "collector": (
        ["--ranks", "64", "--seconds", "8", "--flood-seconds", "4", "--workers", "2"],
        re.compile(r"-> ([\d,]+) records per CPU-second"),
        True,
    ),
    "app": (
        ["--seconds", "10", "--warmup", "4"],
        re.compile(r"xl app: the Monitor on 64 ranks \(as shipped\), median\s*:\s*([\d.]+) %"),
        False,
    ),
}
SCRIPT = {"collector": "bench_collector.py", "app": "bench_tui.py"}


def _run(script: Path, args: list[str], pkg: Path | None, timeout: int) -> str:
    env = dict(os.environ)
    if pkg is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pkg), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
        timeout=timeout,
    )
    if out.returncode != 0:
        raise SystemExit(f"{script} failed ({out.returncode}): {out.stderr.strip()[-400:]}")
    return out.stdout


def paired(name: str, rev: str, tree: Path, pkg: Path, rounds: int) -> None:
    args, figure, higher = PAIRED[name]
    sides = {"this tree": (BENCH / SCRIPT[name], None), rev: (tree / "bench" / SCRIPT[name], pkg)}
    got: dict[str, list[float]] = {side: [] for side in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for side in order:
            script, side_pkg = sides[side]
            text = _run(script, args, side_pkg, timeout=600)
            found = figure.search(text)
            if found is None:
                raise SystemExit(f"{name}: no figure in {script}'s output:\n{text[-800:]}")
            got[side].append(float(found.group(1).replace(",", "")))
        ours, theirs = got["this tree"][-1], got[rev][-1]
        print(f"  {name} round {r + 1}: this tree {ours:,.2f}, {rev} {theirs:,.2f}", flush=True)
    ratios = [a / b for a, b in zip(got["this tree"], got[rev], strict=True) if b]
    better = "higher" if higher else "lower"
    print(
        f"{name}: this tree / {rev} = {statistics.median(ratios):.3f}x "
        f"[{min(ratios):.3f}, {max(ratios):.3f}] over {rounds} rounds ({better} is better; "
        f"medians {statistics.median(got['this tree']):,.2f} vs "
        f"{statistics.median(got[rev]):,.2f}); "
        f"load {os.getloadavg()[0]:.1f}",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--before", metavar="REV", required=True, help="the revision to compare with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="launch,reader,collector,app")
    ns = ap.parse_args()
    wanted = [w for w in ns.only.split(",") if w]
    unknown = set(wanted) - {"launch", "reader", "collector", "app"}
    if unknown:
        print(f"before_after: no bench named {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="xl-before-after-") as tmp:
        pkg = unpack(ns.before, Path(tmp))
        tree = Path(tmp) / "tree"
        for name in wanted:
            print(f"== {name}", flush=True)
            if name == "launch":
                print(
                    _run(
                        BENCH / "bench_launch.py",
                        ["--repeat", str(max(4, 2 * ns.rounds)), "--before", str(pkg)],
                        None,
                        timeout=1800,
                    ),
                    flush=True,
                )
            elif name == "reader":
                out = _run(
                    BENCH / "bench_reader.py",
                    ["--ref", ns.before, "--rounds", str(max(4, 2 * ns.rounds))],
                    None,
                    timeout=1800,
                )
                print(out.strip().splitlines()[-1], flush=True)
            else:
                paired(name, ns.before, tree, pkg, ns.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
