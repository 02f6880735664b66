"""Where a process's CPU went, from bench_scale.py --profile's py-spy samples.

    python bench/scale_profile.py FOLDER/node0.txt [--seconds 30] [--rate 50] [--top 6]

py-spy's raw format is one line per distinct stack, ``thread (TID): NAME;frame;frame... COUNT``,
idle threads left out (and stacks that end in a wait, see _WAITS); so a thread's samples over
``rate x seconds`` is the share of one core it was running. Prints each thread's share, then per
thread the functions the samples were in (innermost frame: where the time went) and the frames of
xl's own code nearest to it (which part of xl spent it).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

_LINE = re.compile(r"^thread \((?:0x)?[0-9a-fA-F]+\): (?P<stack>.*) (?P<count>\d+)$")
_XL = ("launcher/", "xl/", "tui/", "doctor/")
# Innermost frames that wait rather than run: py-spy without pausing the process cannot always
# tell a thread blocked there from one running, so they are left out.
_WAITS = (
    ".select (selectors.py", ".wait (threading.py", "sleep (", ".accept (socket.py",
    ".get (queue.py",
)


def summarize(path: Path, seconds: float, rate: float, top: int) -> list[str]:
    threads: Counter[str] = Counter()
    leaves: dict[str, Counter[str]] = defaultdict(Counter)
    ours: dict[str, Counter[str]] = defaultdict(Counter)
    for line in path.read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        frames = m["stack"].split(";")
        if any(w in frames[-1] for w in _WAITS):
            continue
        name, count = frames[0], int(m["count"])
        threads[name] += count
        leaves[name][frames[-1]] += count
        mine = next(
            (f for f in reversed(frames[1:]) if f.split("(")[-1].startswith(_XL)), frames[-1]
        )
        ours[name][mine] += count
    total = rate * seconds
    out = [f"{path.name}: {sum(threads.values()) / total:.2f} cores sampled over {seconds:g} s"]
    for name, count in threads.most_common():
        out.append(f"  {name}: {count / total:.3f} cores")
        for frame, n in leaves[name].most_common(top):
            out.append(f"      in  {n / total:.3f}  {frame}")
        for frame, n in ours[name].most_common(top):
            out.append(f"      xl  {n / total:.3f}  {frame}")
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("file", type=Path)
    ap.add_argument("--seconds", type=float, default=30.0, help="the window it was recorded over")
    ap.add_argument("--rate", type=float, default=50.0, help="py-spy's samples a second")
    ap.add_argument("--top", type=int, default=6)
    ns = ap.parse_args(argv)
    try:
        print("\n".join(summarize(ns.file, ns.seconds, ns.rate, ns.top)))
    except OSError as exc:
        print(f"scale_profile: cannot read {ns.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
