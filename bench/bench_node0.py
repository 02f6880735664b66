"""Node 0's work per rank, this tree against an earlier commit, at thousands of ranks.

    .venv/bin/python bench/bench_node0.py [--base REV] [--ranks 4096] [--pairs 5]

Each part runs the code of this tree and that of ``--base`` (its modules read with ``git show``
and loaded beside this tree's) on the same input, in pairs that alternate which goes first, and
prints the median seconds of each and their ratio (base / now), and whether both gave the same
result (they must):

- ``digest``: the digest of a run dir in which every rank was called stalled (as a node 0 that
  fell behind saw at 4,096 ranks), read whole (``digest.build``);
- ``tick``: the diagnoser's once-a-second pass (stalls, stragglers) over every rank after 20 s
  of lines, two steps a second with their split, as bench_scale's simulated ranks send, and
  the quiet spell the supervisor asks for each second; again with steps of 2.5 s;
- ``ingest``: one second of those ranks' train lines into the diagnoser;
- ``parse``: the collector's check of one second of those lines (``wire.parse_record``);
- ``dumps``: the client's (and a node's) writing of them (``wire.dumps_record``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xl import wire
from xl.launcher.rundir import runrecord as record
from xl.launcher.telemetry import diagnose
from xl.launcher.view import digest

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_700_000_000.0


def _load(rev: str, path: str, name: str, swaps: dict[str, str] | None = None) -> Any:
    """The module ``path`` as it was at ``rev``, loaded as ``name`` (imports swapped per
    ``swaps``: old text -> new)."""
    src = subprocess.run(
        ["git", "show", f"{rev}:{path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    for old, new in (swaps or {}).items():
        assert old in src, f"{path} at {rev} has no {old!r}"
        src = src.replace(old, new)
    mod = types.ModuleType(name)
    mod.__file__ = f"{rev}:{path}"
    sys.modules[name] = mod  # dataclasses look their module up
    exec(compile(src, f"{rev}:{path}", "exec"), mod.__dict__)
    return mod


def _pairs(
    pairs: int, base: Callable[[], Any], now: Callable[[], Any]
) -> tuple[float, float, bool]:
    """Median seconds of ``base`` and ``now`` over alternating pairs, and whether each pair's
    results were equal."""
    times: dict[str, list[float]] = {"base": [], "now": []}
    same = True
    for i in range(pairs):
        order = [("base", base), ("now", now)]
        if i % 2:
            order.reverse()
        got = {}
        for name, fn in order:
            start = time.perf_counter()
            got[name] = fn()
            times[name].append(time.perf_counter() - start)
        same = same and got["base"] == got["now"]
    return statistics.median(times["base"]), statistics.median(times["now"]), same


def _line(rank: int, step: int, t: float, split: bool = True) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "t": round(t, 6),
        "rank": rank,
        "kind": "train",
        "step": step,
        "loss": 2.345678,
        "samples": 32,
    }
    if split:
        comm = 0.002 + (rank * 7919 + step * 104729) % 1000 / 1e6
        rec |= {"data_s": 0.012, "compute_s": 0.45, "comm_s": comm, "other_s": 0.003, "steps": 1}
        rec["samples_per_s"] = 64.0
    return rec


def _stalled_run(ranks: int) -> Path:
    """A run dir: every rank steps 10 times, is called stalled, and half of them come back."""
    run_dir = Path(tempfile.mkdtemp(prefix="xl-bench-node0-"))
    rec = record.RunRecord("run", "succeeded", {"started_at": T0, "ended_at": T0 + 70, "ranks": []})
    record.save(run_dir, rec)
    lines = [_line(r, s, T0 + s, split=False) for s in range(1, 11) for r in range(ranks)]
    lines += [_line(r, 11, T0 + 50 + r % 7, split=False) for r in range(0, ranks, 2)]
    events: list[dict[str, Any]] = [
        {"t": T0 + 40 + r / ranks, "kind": "stalled", "rank": r, "idle_s": 30.0}
        for r in range(ranks)
    ]
    events += [
        {"t": T0 + 52 + r % 7, "kind": "recovered", "rank": r, "of": "stalled"}
        for r in range(0, ranks, 2)
    ]
    events += [
        {"t": T0 + 60, "kind": "rank_exited", "rank": r, "exit_code": 0} for r in range(1, ranks, 2)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run_dir / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in events))
    return run_dir


def _named(diag: Any) -> dict[int, str]:
    """Each rank named stalled or straggler: ``named()``, ``state()`` at commits before it."""
    return diag.named() if hasattr(diag, "named") else diag.state()


def _fed(module: Any, ranks: int, seconds: int, step_s: float = 0.5) -> Any:
    """A diagnoser of ``module`` fed ``seconds`` of every rank's lines (a step each ``step_s``),
    ticked once a second."""
    th = module.Thresholds(stall_min_s=30, straggler_window_s=10, straggler_sustain=5)
    events: list[dict[str, Any]] = []
    # Its events as their lines' objects: a value (``to_json``) now, the object at older commits.
    diag = module.Diagnoser(lambda e: events.append(e if isinstance(e, dict) else e.to_json()), th)
    tick = T0 + 1
    for step in range(1, int(seconds / step_s) + 1):
        t = T0 + step * step_s
        while tick <= t:
            diag.tick(tick, mono=tick)
            tick += 1
        for r in range(ranks):
            diag.ingest(r, [_line(r, step, t)])
    diag.events = events
    return diag


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="653b563", help="the commit to compare with")
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args()
    rev, n, pairs = args.base, args.ranks, args.pairs

    _load(rev, "launcher/view/timing.py", "_base_timing")  # the old digest's
    old_digest = _load(
        rev,
        "launcher/view/digest.py",
        "_base_digest",
        {"from xl.launcher.rundir import timing\n": "import _base_timing as timing\n"},
    )
    old_diagnose = _load(rev, "launcher/telemetry/diagnose.py", "_base_diagnose")
    old_wire = _load(rev, "xl/wire.py", "_base_wire")

    rows = []
    run_dir = _stalled_run(n)
    rec = record.load(run_dir)
    assert rec is not None
    rows.append(
        (
            f"digest, {n} ranks stalled",
            _pairs(
                max(1, pairs // 2),
                lambda: old_digest.build(run_dir, rec),
                lambda: digest.build(run_dir, rec),
            ),
        )
    )

    seconds = 20
    fed = {"base": _fed(old_diagnose, n, seconds), "now": _fed(diagnose, n, seconds)}
    assert fed["base"].events == fed["now"].events
    clock = {"base": T0 + seconds, "now": T0 + seconds}

    def tick(which: str, module: Any) -> Callable[[], Any]:
        def run() -> Any:
            diag = fed[which]
            clock[which] += 1
            t = clock[which]
            diag.tick(t, mono=t)
            return module.quiet_spell(diag, t), _named(diag)

        return run

    rows.append(
        (
            f"tick + quiet spell, {n} ranks",
            _pairs(pairs, tick("base", old_diagnose), tick("now", diagnose)),
        )
    )
    # Slow steps (2.5 s, as big models take): a tick between two lines of most ranks.
    slow = {"base": _fed(old_diagnose, n, seconds, 2.5), "now": _fed(diagnose, n, seconds, 2.5)}
    assert slow["base"].events == slow["now"].events
    slow_clock = {"base": T0 + seconds, "now": T0 + seconds}

    def slow_tick(which: str, module: Any) -> Callable[[], Any]:
        def run() -> Any:
            diag = slow[which]
            slow_clock[which] += 1
            t = slow_clock[which]
            diag.tick(t, mono=t)
            return module.quiet_spell(diag, t), _named(diag)

        return run

    rows.append(
        (
            f"tick, {n} ranks, 2.5 s steps",
            _pairs(pairs, slow_tick("base", old_diagnose), slow_tick("now", diagnose)),
        )
    )
    # The lines of the seconds after the ticks' (every pair its own second), into the diagnosers
    # fed above: a rank's state as it is while a run goes.
    start = 2 * seconds + 2 * pairs + 2
    nexts = [
        [_line(r, start + 2 * i + s, T0 + start / 2 + i + s / 2) for s in (1, 2) for r in range(n)]
        for i in range(pairs)
    ]
    done = {"base": 0, "now": 0}

    def ingest(which: str) -> Callable[[], Any]:
        def run() -> Any:
            diag, lines = fed[which], nexts[done[which]]
            done[which] += 1
            for line in lines:
                diag.ingest(line["rank"], [line])
            return sorted(_named(diag).items())

        return run

    rows.append((f"ingest, {len(nexts[0])} lines", _pairs(pairs, ingest("base"), ingest("now"))))
    second = nexts[0]
    raw = [wire.dumps_record(x) for x in second] * 10
    ranks = [x["rank"] for x in second] * 10
    rows.append(
        (
            f"parse_record, {len(raw)} lines",
            _pairs(
                pairs,
                lambda: [old_wire.parse_record(x, r) for x, r in zip(raw, ranks, strict=True)],
                lambda: [wire.parse_record(x, r) for x, r in zip(raw, ranks, strict=True)],
            ),
        )
    )
    rows.append(
        (
            f"dumps_record, {len(raw)} lines",
            _pairs(
                pairs,
                lambda: [old_wire.dumps_record(x) for x in second * 10],
                lambda: [wire.dumps_record(x) for x in second * 10],
            ),
        )
    )

    print(f"base {rev} against this tree; medians of {pairs} alternating pairs (digest: fewer)")
    print(f"{'part':36} {'base s':>9} {'now s':>9} {'base/now':>9}  same result")
    for name, (b, w, same) in rows:
        print(f"{name:36} {b:9.4f} {w:9.4f} {b / w:9.2f}x  {'yes' if same else 'NO'}")
    return 0 if all(same for _, (_, _, same) in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
