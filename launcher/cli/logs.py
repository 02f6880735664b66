"""``xl logs RUN [--rank R] [-f]``: a run's per-rank output (never interleaved mid-line)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from xl.errors import ArgumentParser, UsageError
from xl.launcher.control import FINAL, read_run, resolve_run


class _Tail:
    """New complete lines of a growing file; ``partial`` holds a last line without newline."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> list[str]:
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return []
        if size <= self.offset:
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read(size - self.offset)
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return [ln.decode("utf-8", "replace") for ln in lines]


def _ranks(run_dir: Path, run: dict) -> list[int]:
    found = {int(r["rank"]) for r in run.get("ranks") or []}
    for path in (run_dir / "logs").glob("rank-*.log"):
        try:
            found.add(int(path.stem[5:]))
        except ValueError:
            continue
    return sorted(found)


def main(argv: Sequence[str]) -> int:
    p = ArgumentParser(prog="xl logs", description="Print a run's logs (all ranks, prefixed, or one).")
    p.add_argument("run", metavar="RUN", help="run id, unique prefix, or 'last'")
    p.add_argument("--rank", type=int, help="only this rank's log, unprefixed")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    ns = p.parse_args(list(argv))
    run_dir = resolve_run(ns.run)
    run = read_run(run_dir)
    ranks = _ranks(run_dir, run)
    if ns.rank is not None:
        if ns.rank not in ranks:
            known = ", ".join(map(str, ranks)) or "none yet"
            raise UsageError(f"run {run_dir.name} has no rank {ns.rank} (ranks: {known})")
        ranks = [ns.rank]
    prefix = ns.rank is None and len(ranks) > 1
    tails = {r: _Tail(run_dir / "logs" / f"rank-{r}.log") for r in ranks}
    out = sys.stdout
    while True:
        done = read_run(run_dir).get("status") in FINAL
        for rank, tail in tails.items():
            for line in tail.read():
                out.write(f"[rank {rank}] {line}\n" if prefix else line + "\n")
        out.flush()
        if not ns.follow or done:
            break
        time.sleep(0.2)
        if ns.rank is None:
            for rank in _ranks(run_dir, read_run(run_dir)):
                tails.setdefault(rank, _Tail(run_dir / "logs" / f"rank-{rank}.log"))
    for rank, tail in tails.items():
        # A last line without its newline yet.
        if tail.partial:
            text = tail.partial.decode("utf-8", "replace")
            out.write(f"[rank {rank}] {text}\n" if prefix else text + "\n")
    return 0
