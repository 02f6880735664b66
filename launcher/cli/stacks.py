"""``xl stacks RUN [--rank R] [--json]``: where every live rank is, and who the others wait for.

Asks each rank of the run on this node (``xl.launcher.stacks.gather``): its threads'
Python stacks and its collectives from PyTorch's Flight Recorder. On node 0 of a multi-node run, the
other nodes' ranks too, through node 0's supervisor and each node's link
(``xl.launcher.stacks.nodes``). Prints ranks grouped by where they are, the verdict, then
each group's stack once. ``--json`` prints the stacks document (docs/launch.md). ``--rank R`` shows
that rank only; the verdict is always the whole run's, and names a culprit only when the run is
stalled (xl.launcher.telemetry.stall). Exit 0 with stacks, 1 when the run is not running, 2 on
bad usage. """

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from xl.errors import EXIT_FAILED, ArgumentParser, UsageError
from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.runrecord import RunStatus
from xl.launcher.rundir.store import resolve_run
from xl.launcher.stacks import gather as capture
from xl.launcher.stacks import verdict
from xl.launcher.stacks.model import StacksDoc, Thread
from xl.textsafe import visible
from xl.units import ranges, ranks_text

_OWN_FILES = ("/launcher/rank/stacks.py", "/xl/client/sender.py")
_FRAMES_SHOWN = 12  # innermost frames of a group's main thread in the text output


def _own_thread(thread: Thread) -> bool:
    """xl's own threads in the rank (log sender, the stacks socket): never the news."""
    return thread.name.startswith("xl-") or any(f.file.endswith(_OWN_FILES) for f in thread.frames)


def render(doc: StacksDoc) -> str:
    """The text `xl stacks` prints: groups, the verdict, then one stack per group."""
    entries = doc.ranks
    lines = verdict.group_lines(entries)
    lines += ["", f"verdict: {doc.verdict.message or 'nothing to say'}"]
    by_rank = {e.rank: e for e in entries}
    for ranks, label in verdict.groups(entries):
        entry = by_rank.get(ranks[0])
        if entry is None or entry.error:
            continue
        lines += ["", f"{ranks_text(ranks)} ({label}):"]
        if entry.note:
            lines.append(f"  ({entry.note})")
        for thread in entry.threads or ():
            if _own_thread(thread):
                continue
            frames = thread.frames
            lines.append(f"  thread {thread.name}:")
            if len(frames) > _FRAMES_SHOWN:
                lines.append(f"    ... {len(frames) - _FRAMES_SHOWN} outer frames")
            for f in frames[-_FRAMES_SHOWN:]:
                lines.append(f"    {f.file}:{f.line} in {f.function}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    p = ArgumentParser(
        prog="xl stacks",
        description="Every live rank's stacks and collective state, and the verdict.",
    )
    p.add_argument("run", metavar="RUN", help="run id, unique prefix, or 'last'")
    p.add_argument("--rank", type=int, help="show only this rank (the verdict is the whole run's)")
    p.add_argument("--json", action="store_true", help="print the stacks document (JSON)")
    ns = p.parse_args(list(argv))
    run_dir: Path = resolve_run(ns.run, "stacks")
    rec = record.load(run_dir)
    known = sorted(r.rank for r in rec.ranks if r.rank is not None) if rec else []
    if (
        ns.rank is not None
        and rec is not None
        and rec.status == RunStatus.RUNNING
        and ns.rank not in known
    ):
        raise UsageError(
            f"run {run_dir.name} has no rank {ns.rank} (ranks: "
            f"{ranges(known) or 'none yet'})"
        )
    try:
        doc = capture.run_document(run_dir, ns.rank)
    except capture.NotRunning as exc:
        sys.stderr.write(f"xl stacks: {exc}\n")
        return EXIT_FAILED
    # thread names are the rank's
    print(json.dumps(doc.to_json(), indent=1) if ns.json else visible(render(doc), lines=True))
    return 0
