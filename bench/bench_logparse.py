"""The log parser on hostile lines, against the same parser on ordinary output.

    .venv/bin/python bench/bench_logparse.py [--pairs 15]

Issue 25: one 60,000-digit line ending " it/s" held the supervisor's loop for 19 s (the tqdm
regex backtracked over every digit; 32 KB took 5.8 s). The anchor, measured in the same run: the
same number of characters of ordinary rank output (tqdm bars, HF Trainer dicts, plain text),
parsed line by line. Each hostile shape is timed against it in alternating pairs; the ratio of
medians says what a hostile character costs against an ordinary one (near or under 1: linear,
no worse than normal output). ``--against PATH`` times another copy of logparse.py on the
hostile shapes too, in the same run (e.g. ``git show a2bdab3~1:launcher/telemetry/logparse.py``);
give it small ``--size`` (the old parser is quadratic).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Callable
from typing import Any

from xl.launcher.telemetry.logparse import parse_line

ORDINARY = [
    " 40%|████      | 4/10 [00:01<00:02,  2.95it/s]",
    "{'loss': 0.6931, 'grad_norm': 1.25, 'learning_rate': 5e-05, 'epoch': 0.5}",
    "epoch 1: validation accuracy 0.913 on 10000 samples",
    "Epoch 1:  50%|█████     | 50/100 [00:05<00:05, 9.80it/s, loss=0.3]",
]


def hostile(size: int) -> dict[str, str]:
    return {
        "digits + it/s": "1" * size + " it/s",
        "n/ repeated": ("1/" * (size // 2)) + " it/s",
        "open brackets": ("1/1 [" * (size // 5)) + " it/s",
        "nested dict starts": ("{'a': " * (size // 6)) + "}",
        "rate digits": "|" + "1." * (size // 2) + "it/s",
    }


def _time(parse: Callable[[str], Any], lines: list[str]) -> float:
    t0 = time.perf_counter()
    for line in lines:
        parse(line)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--size", type=int, default=60_000, help="characters in each hostile line")
    ap.add_argument("--against", help="another logparse.py to time on the hostile shapes")
    ns = ap.parse_args()
    other = None
    if ns.against:
        spec = importlib.util.spec_from_file_location("other_logparse", ns.against)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        other = module.parse_line
    shapes = hostile(ns.size)
    for name, line in shapes.items():
        # as many characters
        anchor = [ORDINARY[i % len(ORDINARY)] for i in range(len(line) // 60 + 1)]
        ours: list[float] = []
        base: list[float] = []
        theirs: list[float] = []
        for _ in range(ns.pairs):
            ours.append(_time(parse_line, [line]))
            base.append(_time(parse_line, anchor))
            if other is not None:
                theirs.append(_time(other, [line]))
        ratio = statistics.median(ours) / statistics.median(base)
        text = (
            f"{name:20} {len(line):>7} chars: {statistics.median(ours) * 1e3:8.3f} ms, ordinary "
            f"output {statistics.median(base) * 1e3:8.3f} ms, ratio {ratio:6.3f}"
        )
        if theirs:
            text += (
                f"; --against {statistics.median(theirs) * 1e3:10.1f} ms "
                f"({statistics.median(theirs) / statistics.median(ours):,.0f}x ours)"
            )
        print(text)


if __name__ == "__main__":
    main()
