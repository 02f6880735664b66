"""The plain view of a big run: past ``SUMMARY_PAST`` ranks, a summary instead of a row per rank
(docs/launch.md, "Big runs in the plain view").

    big-4096  20261128-big-4096  running  312s  4096 ranks on 512 nodes
    ranks: 4093 running, 1 straggler, 1 failed, 1 stalled
    not running:
      failed (1): rank 1234 (exit 1)
      stalled (1): rank 3017
      rank 3017: xl: rank 3017 has not stepped for 95 s (...)
    slowest steps: rank 77 2.000 s, rank 6 0.530 s, rank 13 0.530 s (median of all 0.515 s)
    slow: rank 77 2.000 s (3.9x the median; compute 1.800 s)
    node  host   ranks  ok  step     step time min / median / max  data   compute  ...
       0  node0      8   8  611-612  0.500 / 0.513 / 0.530 s       10 ms  313 ms   ...

Every rank that is not running, by state; the slowest ranks, a plain list; the ranks slower
than ``SLOW_X`` times the median (or diagnosed stragglers) named as slow; then a row per node
(past ``ROWS`` nodes, a row per group of consecutive nodes) with the spread of its ranks' step
times and the median of each phase (``ok``: its ranks running or ended cleanly). Plain text: the
end of a run is drawn without Rich.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from xl.figures import PHASES
from xl.launcher.rundir.events import EventKind, EventLine
from xl.launcher.view.runview import RankView
from xl.stats import median
from xl.textsafe import visible
from xl.units import ranges, ranks_text

SUMMARY_PAST = 64  # up to this many ranks the views keep a row per rank
ROWS = 64  # node rows at most; more nodes are shown in groups of consecutive nodes
SLOW_X = 1.25  # a rank this much slower than the median step is named as slow
SLOWEST_SHOWN = 3
NAMED = 8  # slow ranks, and diagnoses of ranks not running, named one a line at most
HEADERS = ("node", "host", "ranks", "ok", "step", "step time min / median / max", *PHASES)
HEADERS_RIGHT = {0, 2, 3}


def summarised(ranks: Mapping[int, RankView]) -> bool:
    """Whether the views summarise these ranks rather than draw a row each."""
    return len(ranks) > SUMMARY_PAST


def _seconds(value: float) -> str:
    return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.3f} s"


def _stepping(r: RankView) -> bool:
    """Running (a straggler too), or ended cleanly: its step time is news, not stale."""
    return r.state in ("running", "straggler") or (r.state == "exited" and r.exit_code in (0, None))


def _not_running(r: RankView) -> bool:
    """Anything a person must look at besides slow steps: failed, stalled, waiting, stopped."""
    return not _stepping(r)


@dataclass
class _Row:
    label: str
    hosts: list[str] = field(default_factory=list)
    views: list[RankView] = field(default_factory=list)

    def cells(self) -> list[str]:
        views = self.views
        hosts = sorted(set(self.hosts))
        host = hosts[0] if len(hosts) == 1 else f"{len(hosts)} hosts"
        # running or ended cleanly: the others are listed under "not running"
        running = sum(1 for r in views if _stepping(r))
        steps = [r.step for r in views if r.step is not None]
        step = ""
        if steps:
            low, high = min(steps), max(steps)
            step = f"{low:.0f}" if low == high else f"{low:.0f}-{high:.0f}"
        times = sorted(r.step_s for r in views if r.step_s is not None)
        spread = ""
        if times:
            spread = f"{times[0]:.3f} / {median(times):.3f} / {times[-1]:.3f} s"
        phases = []
        for name in PHASES:
            values = [v for r in views if (v := getattr(r, f"{name}_s")) is not None]
            phases.append(_seconds(median(values)) if values else "")
        return [self.label, visible(host), str(len(views)), str(running), step, spread, *phases]


def node_rows(ranks: Mapping[int, RankView]) -> list[_Row]:
    """A row per node, in node order; past ROWS nodes a row per group of consecutive nodes."""
    by_node: dict[int, list[RankView]] = {}
    for rank in sorted(ranks):
        r = ranks[rank]
        by_node.setdefault(r.node_rank if r.node_rank is not None else 0, []).append(r)
    nodes = sorted(by_node)
    size = -(-len(nodes) // ROWS)
    rows = []
    for i in range(0, len(nodes), size):
        group = nodes[i : i + size]
        label = str(group[0]) if len(group) == 1 else f"{group[0]}-{group[-1]}"
        row = _Row(label)
        for node in group:
            row.views += by_node[node]
            row.hosts += [r.host or "" for r in by_node[node]]
        rows.append(row)
    return rows


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]

    def line(cells: list[str] | tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(w) if i in HEADERS_RIGHT else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(HEADERS), *(line(r) for r in rows)]


def slow_lines(ranks: Mapping[int, RankView]) -> list[str]:
    """The slowest ranks (a plain list) and those named slow: SLOW_X the median step or more, or
    diagnosed stragglers."""
    # a rank xl stopped at the run's end stepped until then; a failed or stalled one's is stale
    timed = [
        r for r in ranks.values() if r.step_s is not None and (_stepping(r) or r.state == "stopped")
    ]
    if not timed:
        return []
    middle = median([r.step_s for r in timed if r.step_s is not None])
    by_time = sorted(timed, key=lambda r: (-(r.step_s or 0.0), r.rank))
    slowest = ", ".join(f"rank {r.rank} {r.step_s:.3f} s" for r in by_time[:SLOWEST_SHOWN])
    lines = [f"slowest steps: {slowest} (median of all {middle:.3f} s)"]
    slow = [
        r
        for r in by_time
        if r.state == "straggler" or (middle > 0 and (r.step_s or 0.0) >= SLOW_X * middle)
    ]
    for r in slow[:NAMED]:
        split = r.split or {}
        worst = max(split, key=lambda k: split[k]) if split else None
        where = f"; {worst.removesuffix('_s')} {split[worst]:.3f} s" if worst else ""
        ratio = f"{(r.step_s or 0.0) / middle:.1f}x the median" if middle > 0 else "slow"
        told = f"  xl: {visible(r.diagnosis)}" if r.diagnosis else ""
        lines.append(f"slow: rank {r.rank} {r.step_s:.3f} s ({ratio}{where}){told}")
    if len(slow) > NAMED:
        lines.append(f"slow: {len(slow) - NAMED} more: ranks {ranges([r.rank for r in slow])}")
    return lines


def not_running_lines(ranks: Mapping[int, RankView]) -> list[str]:
    """Every rank not running, by state (failed ranks with their exit codes), and what xl said
    of the first few."""
    out: dict[str, list[RankView]] = {}
    for rank in sorted(ranks):
        r = ranks[rank]
        if _not_running(r):
            out.setdefault(r.state, []).append(r)
    if not out:
        return []
    lines = ["not running:"]
    order = sorted(out, key=lambda s: (s != "failed", s))  # failed, then stalled before waiting
    for state in order:
        views = out[state]
        codes: dict[int | None, list[int]] = {}
        for r in views:
            codes.setdefault(r.exit_code, []).append(r.rank)
        said = "; ".join(
            ranks_text(ids)
            + ("" if code is None else f" (exit {code})")
            for code, ids in codes.items()
        )
        lines.append(f"  {state} ({len(views)}): {said}")
    told = [r for state in order for r in out[state] if r.diagnosis][:NAMED]
    lines += [f"  rank {r.rank}: xl: {visible(r.diagnosis or '')}" for r in told]
    return lines


def render_summary(ranks: Mapping[int, RankView], title: str) -> str:
    """The summary as text ending in a newline (``title``: the run's name, status and time)."""
    nodes = node_rows(ranks)
    counts: dict[str, int] = {}
    for r in ranks.values():
        counts[r.state] = counts.get(r.state, 0) + 1
    states = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    node_count = len({r.node_rank or 0 for r in ranks.values()})
    lines = [
        f"{title}  {len(ranks)} ranks on {node_count} node{'s' if node_count != 1 else ''}",
        f"ranks: {states}",
        # what needs a look first: a live view too short for the nodes crops their last rows
        *not_running_lines(ranks),
        *slow_lines(ranks),
        *_table([row.cells() for row in nodes]),
    ]
    return "\n".join(lines) + "\n"


def _fold_kind(ev: EventLine) -> str | None:
    """What an event says of its rank when it is one of many alike: started, or ended cleanly."""
    if ev.rank is None:
        return None
    if ev.kind is EventKind.RANK_STARTED:
        return "started"
    if ev.kind is EventKind.RANK_EXITED and ev.exit_code == 0:
        return "exited with code 0"
    return None


def fold_events(events: list[EventLine], say: Callable[[EventLine], str], world: int) -> list[str]:
    """The plain view's lines for ``events`` of a run of ``world`` ranks: past SUMMARY_PAST,
    consecutive ranks that started (or exited with code 0) are one line, ``HH:MM:SS xl: ranks
    0-4095 started (4096)``; every other event is ``say(event)``, in order."""
    if world <= SUMMARY_PAST:
        return [say(ev) for ev in events]
    out: list[str] = []
    i = 0
    while i < len(events):
        kind = _fold_kind(events[i])
        j = i + 1
        while kind is not None and j < len(events) and _fold_kind(events[j]) == kind:
            j += 1
        if j - i < 2:
            out.append(say(events[i]))
            i += 1
            continue
        ranks = [ev.rank for ev in events[i:j] if ev.rank is not None]  # each has one
        t = events[j - 1].t
        stamp = time.strftime("%H:%M:%S", time.localtime(t if t is not None else time.time()))
        out.append(f"{stamp} xl: ranks {ranges(ranks)} {kind} ({len(ranks)})")
        i = j
    return out
