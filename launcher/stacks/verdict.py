"""From every rank's stacks and collectives to who the others wait for (pure functions).

The collective most ranks wait in (a process group, a sequence number, an op) is the meeting
point. A rank that has not reached it (its newest entry there is older), or that waits in a
different collective (another op, or another sequence number), holds the others up: that is the
culprit. A rank with no collective record (C code holds the GIL, or no Flight Recorder) is a
culprit when its main thread is not inside torch.distributed while others wait. Ranks are then
grouped by where they are, so eight ranks read as one line: "ranks 0,2-7 wait in all_reduce #12
at train.py:41".

A culprit that was using the CPU while the others waited (its ``cpu_pct`` in the document, from
the sampler's figures) is said to be working: a long evaluation outside the training loop looks
like a hang to the others, and so does a loop that never ends; only the time tells them apart.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xl
from xl.figures import number
from xl.stats import median

SILENT = "did not answer"  # the start of the error of a rank that was asked and kept quiet
# Not the person's code: installed packages, the standard library, frozen modules.
_LIBRARY_MARKS = ("site-packages", "dist-packages", "<frozen", "/lib/python3", "<string>")
_PACKAGE_ROOTS = ("site-packages/", "dist-packages/", "/lib/python3")
# xl's own code in a rank (the entry, xl.log): its folders, wherever xl is installed or checked out.
_XL_DIRS = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # xl.launcher
    os.path.dirname(os.path.abspath(xl.__file__ or os.sep)) + os.sep,
)
# A rank's mean CPU since its last progress (BUSY_WINDOW_S at most; percent of one core, with its
# children, as the sampler reads it) at or above which it is working, not waiting: a rank blocked
# in a lock, a socket or a sleep uses a few percent; one computing gets its share of a core even
# on a loaded machine (a fifth, when ten processes want two cores).
BUSY_CPU = 20.0
BUSY_WINDOW_S = 10.0
# Below BUSY_CPU, a rank is working still when it uses BUSY_OVER_PEERS times the CPU of the ranks
# beside it (their median, taken as at least BUSY_PEER_FLOOR) and BUSY_MIN_CPU at least: at load
# 19 on 2 cores a rank spinning in Python got 12-17% of a core while its waiting peer read 0.3%.
BUSY_MIN_CPU = 5.0
BUSY_OVER_PEERS = 5.0
BUSY_PEER_FLOOR = 0.5
# Decorators' inner functions: the call a person wrote is the one they wrap.
_WRAPPERS = frozenset({"wrapper", "wrapped", "inner", "_fn", "decorate_context", "wrapper_fn"})


def ranges(ranks: list[int]) -> str:
    """[0, 2, 3, 4, 7] -> '0,2-4,7'."""
    out: list[str] = []
    nums = sorted(set(ranks))
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}{',' if j == i + 1 else '-'}{nums[j]}")
        i = j + 1
    return ",".join(out)


def _main_frames(entry: dict[str, Any]) -> list[dict[str, Any]]:
    threads = entry.get("threads") or []
    main = next(
        (t for t in threads if t.get("name") == "MainThread"), threads[0] if threads else None
    )
    return list((main or {}).get("frames") or [])


def _is_user(frame: dict[str, Any]) -> bool:
    path = str(frame.get("file") or "")
    return not any(mark in path for mark in _LIBRARY_MARKS) and not path.startswith(_XL_DIRS)


def _qualified(frame: dict[str, Any]) -> str:
    """'re.match', 'torch.distributed.distributed_c10d.all_reduce': a library function by its
    module."""
    path, function = str(frame.get("file") or ""), str(frame.get("function"))
    for root in _PACKAGE_ROOTS:
        if root in path:
            rest = path.rsplit(root, 1)[1]
            if root == "/lib/python3":
                rest = rest.partition("/")[2]  # past "11/"
            module = rest.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            return f"{module}.{function}" if module and "<" not in module else function
    return function


def where(entry: dict[str, Any]) -> str:
    """'parse_record at train.py:19 (calling re.match)': the innermost frame of the person's own
    code (not a library's, the standard library's or xl's), and the call it is in, if any."""
    frames = _main_frames(entry)
    if not frames:
        return "no Python frame"
    at = next((i for i in range(len(frames) - 1, -1, -1) if _is_user(frames[i])), None)
    if at is None:  # nothing of the person's (a library's own thread or entry point)
        last = frames[-1]
        return (f"{last.get('function')} at "
            f"{os.path.basename(str(last.get('file')))}:{last.get('line')}")
    user = frames[at]
    inner = frames[at + 1 :]
    callee = next(
        (f for f in inner if f.get("function") not in _WRAPPERS), inner[-1] if inner else None
    )
    calling = f" (calling {_qualified(callee)})" if callee is not None else ""
    return (f"{user.get('function')} at "
        f"{os.path.basename(str(user.get('file')))}:{user.get('line')}{calling}")


def figure(value: Any) -> float | None:
    """``value`` when it is a finite number (not a bool) as JSON gives it, else None."""
    found = number(value)
    return None if found is None else float(found)


def busy(entry: dict[str, Any], peers: Sequence[dict[str, Any]] = ()) -> bool:
    """The rank was using the CPU since its last progress (``cpu_pct`` in its entry): BUSY_CPU
    or more, or several times what the other ranks of ``peers`` (the same capture) used."""
    cpu = figure(entry.get("cpu_pct"))
    if cpu is None:
        return False
    if cpu >= BUSY_CPU:
        return True
    others = [
        c
        for p in peers
        if p.get("rank") != entry.get("rank") and (c := figure(p.get("cpu_pct"))) is not None
    ]
    if not others or cpu < BUSY_MIN_CPU:
        return False
    return cpu >= BUSY_OVER_PEERS * max(median(others), BUSY_PEER_FLOOR)


def doing(entry: dict[str, Any], peers: Sequence[dict[str, Any]] = ()) -> str:
    """where(), and for a rank that was using the CPU since its last progress, how much: "evaluate
    at train.py:88, working at 99% CPU (a long computation, or a loop that never ends)"."""
    if not busy(entry, peers):
        return where(entry)
    return (f"{where(entry)}, working at {entry['cpu_pct']:.0f}% CPU (a long computation, or a "
        f"loop that never ends)")


def _place(entry: dict[str, Any]) -> str:
    """'train.py:41': where() without the function and the call."""
    return where(entry).split(" at ", 1)[-1].split(" (calling ", 1)[0]


def _in_distributed(entry: dict[str, Any]) -> bool:
    return any("torch/distributed" in str(f.get("file")) for f in _main_frames(entry)[-4:])


@dataclass
class Position:
    """Where one rank is in collective terms: waiting in (pg, seq, op), or last done (pg, seq)."""

    waiting: tuple[str, int, str] | None = None
    done: dict[str, int] = field(default_factory=dict)
    known: bool = False


def position(entry: dict[str, Any]) -> Position:
    pos = Position(known=bool(entry.get("collectives")))
    for c in entry.get("collectives") or []:
        pg, seq, op = _group(c), c.get("seq"), str(c.get("op"))
        if not isinstance(seq, int):
            continue
        if c.get("state") == "completed":
            pos.done[pg] = max(pos.done.get(pg, -1), seq)
        elif pos.waiting is None or seq > pos.waiting[1]:
            pos.waiting = (pg, seq, op)
    return pos


def _label(entry: dict[str, Any], pos: Position) -> str:
    if pos.waiting is not None:
        _, seq, op = pos.waiting
        return f"wait in {op} #{seq} at {_place(entry)}"
    return f"in {where(entry)}"


def groups(entries: list[dict[str, Any]]) -> list[tuple[list[int], str]]:
    """Ranks with the same position and stack place, largest group first."""
    by: dict[str, list[int]] = {}
    for e in entries:
        error = str(e.get("error") or "")
        label = (
            (error if error.startswith(SILENT) else f"gave no stacks ({error})")
            if error
            else _label(e, position(e))
        )
        by.setdefault(label, []).append(int(e["rank"]))
    return sorted(((sorted(r), label) for label, r in by.items()), key=lambda g: (-len(g[0]), g[0]))


def group_lines(entries: list[dict[str, Any]]) -> list[str]:
    """One line per group: 'ranks 0,2-7 wait in all_reduce #12 at train.py:41'."""
    out = []
    for ranks, label in groups(entries):
        many = len(ranks) > 1
        if label.startswith("wait "):
            label = label if many else "waits" + label[4:]
        elif label.startswith("in "):
            label = ("are " if many else "is ") + label
        out.append(f"rank{'s' if many else ''} {ranges(ranks)} {label}")
    return out


# Ops whose tensors may differ between ranks as used (torch's Flight Recorder analysis agrees):
# all-to-all's splits, scatter's inputs and gather's outputs exist on the root only.
_FREE_IN = frozenset({"all_to_all", "alltoall", "alltoall_base", "all_to_all_single", "scatter"})
_FREE_OUT = frozenset({"all_to_all", "alltoall", "alltoall_base", "all_to_all_single", "gather"})


def _signature(c: dict[str, Any]) -> tuple[str, str, str]:
    """What every rank's record of one collective must agree on: the op and, where the op wants
    them equal, its tensors' shapes ('' where not known)."""
    op = str(c.get("op"))
    ins = "" if op in _FREE_IN or "in" not in c else repr(c["in"])
    outs = "" if op in _FREE_OUT or "out" not in c else repr(c["out"])
    return op, ins, outs


def _agree(a: tuple[str, str, str], b: tuple[str, str, str]) -> bool:
    return a[0] == b[0] and all(x == y or not x or not y for x, y in zip(a[1:], b[1:], strict=True))


def _shapes(c: dict[str, Any]) -> str:
    sizes = c.get("in") if c.get("in") else c.get("out")
    return (
        f" of {', '.join('x'.join(map(str, s)) or 'scalar' for s in sizes)}"
        if isinstance(sizes, list) and sizes
        else ""
    )


def _group(c: dict[str, Any]) -> str:
    """Which process group a collective is of, the same on every rank: its number where the
    document has it (two subgroups may share a name), else its name."""
    return str(c.get("pg_id") if c.get("pg_id") is not None else c.get("pg"))


def _culprits(parts: list[list[int]]) -> list[int]:
    """The ranks apart from a strict majority; all of them when none has one (two ranks)."""
    parts = sorted(parts, key=len, reverse=True)
    if len(parts[0]) > len(parts[1]):
        return sorted(r for part in parts[1:] for r in part)
    return sorted(r for part in parts for r in part)


def mismatch(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A certain deadlock, named from one snapshot whatever the progress says, or None.

    - The same sequence number of one process group recorded as different collectives on two
      ranks (another op, or other tensor shapes): they can never match. The first such number
      where a rank still waits is the one named, with every rank's place.
    - Two ranks each blocked in a collective of a different process group, both of which they
      use, neither having done the other's: each waits for the other.
    Ranks merely at different numbers (one behind, or NCCL's queue ahead) are no mismatch."""
    answered = {
        int(e["rank"]): e for e in entries if not e.get("error") and type(e.get("rank")) is int
    }
    seen: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for rank, e in answered.items():
        for c in e.get("collectives") or []:
            if isinstance(c, dict) and type(c.get("seq")) is int:
                seen.setdefault((_group(c), c["seq"]), {})[rank] = c
    for (_, seq), rows in sorted(seen.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        pg = str(next(iter(rows.values())).get("pg"))
        if len(rows) < 2 or all(c.get("state") == "completed" for c in rows.values()):
            continue
        kinds: list[tuple[tuple[str, str, str], list[int]]] = []
        for rank, c in sorted(rows.items()):
            sig = _signature(c)
            same = next((k for k in kinds if _agree(k[0], sig)), None)
            if same is None:
                kinds.append((sig, [rank]))
            else:
                same[1].append(rank)
        if len(kinds) < 2:
            continue
        ops = {sig[0] for sig, _ in kinds}
        told = []
        for _sig, ranks in sorted(kinds, key=lambda k: (-len(k[1]), k[1])):
            c = rows[ranks[0]]
            what = f"{c.get('op')} #{seq}{_shapes(c) if len(ops) == 1 else ''}"
            many = len(ranks) > 1
            if c.get("state") == "completed":
                told.append(
                    f"rank{'s' if many else ''} {ranges(ranks)} did {what} and "
                    f"{'are' if many else 'is'} now at {_place(answered[ranks[0]])}"
                )
            else:
                told.append(
                    f"rank{'s' if many else ''} {ranges(ranks)} {'are' if many else 'is'} in "
                    f"{what} at {_place(answered[ranks[0]])}"
                )
        differ = "other tensor shapes" if len(ops) == 1 else "different collectives"
        return {
            "ranks": _culprits([ranks for _, ranks in kinds]),
            "mismatch": True,
            "message": f"mismatch at #{seq} of process group {pg} ({differ}; they can never "
            f"match): {'; '.join(told)}",
        }
    return _crossed(answered)


def _crossed(answered: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """Two ranks blocked (their main thread inside torch.distributed) in collectives of two
    process groups, each of which both ranks use, neither having done the other's."""
    groups = {
        r: {_group(c) for c in e.get("collectives") or [] if isinstance(c, dict)}
        for r, e in answered.items()
    }
    pos = {r: position(e) for r, e in answered.items() if _in_distributed(e)}
    blocked = sorted((r, p.waiting) for r, p in pos.items() if p.waiting is not None)
    # Only a rank blocked in another group that x uses can be its pair: found through the
    # groups, not by a look at every later rank (thousands blocked in one all-reduce made that
    # O(ranks^2)); the pairs are looked at in the same order, so the same pair is named.
    by_group: dict[Any, list[int]] = {}
    for j, (_, (pg, _, _)) in enumerate(blocked):
        by_group.setdefault(pg, []).append(j)
    for i, (x, (pg_x, seq_x, op_x)) in enumerate(blocked):
        later = sorted(j for g in groups[x] if g != pg_x for j in by_group.get(g, ()) if j > i)
        for y, (pg_y, seq_y, op_y) in (blocked[j] for j in later):
            if pg_x == pg_y or pg_y not in groups[x] or pg_x not in groups[y]:
                continue
            if pos[x].done.get(pg_y, -1) >= seq_y or pos[y].done.get(pg_x, -1) >= seq_x:
                continue
            name = {
                _group(c): str(c.get("pg"))
                for e in answered.values()
                for c in e.get("collectives") or []
                if isinstance(c, dict)
            }
            return {
                "ranks": [x, y],
                "mismatch": True,
                "message": (
                    f"mismatch of process groups (each waits for the other): rank {x} is in "
                    f"{op_x} #{seq_x} of "
                    f"process group {name[pg_x]} at {_place(answered[x])}; rank {y} is in {op_y} "
                    f"#{seq_y} of process "
                    f"group {name[pg_y]} at {_place(answered[y])}"
                ),
            }
    return None


def verdict(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"ranks": [culprits], "message": ...}`` for the stacks document."""
    found = mismatch(entries)
    if found is not None:
        return found
    answered = [e for e in entries if not e.get("error")]
    # Only a rank that was asked and kept quiet is suspect; one with no handler tells nothing.
    silent = sorted(int(e["rank"]) for e in entries if str(e.get("error") or "").startswith(SILENT))
    positions = {int(e["rank"]): position(e) for e in answered}
    waits = Counter(p.waiting for p in positions.values() if p.waiting is not None)
    if not waits:
        if silent:
            return {
                "ranks": silent,
                "message": f"rank{'s' if len(silent) > 1 else ''} {ranges(silent)} did not answer; "
                "no rank waits in a collective",
            }
        where_all = "; ".join(group_lines(answered))
        return {
            "ranks": [],
            "message": "no rank waits in a collective" + (f": {where_all}" if where_all else ""),
        }
    meet, _ = waits.most_common(1)[0]
    pg, seq, op = meet
    waiting = sorted(r for r, p in positions.items() if p.waiting == meet)
    reasons: dict[int, str] = {}
    for e in answered:
        rank, pos = int(e["rank"]), positions[int(e["rank"])]
        if pos.waiting == meet:
            continue
        if pos.waiting is not None:
            wop, wseq = pos.waiting[2], pos.waiting[1]
            reasons[rank] = f"is in {wop} #{wseq}, not {op} #{seq}, at {_place(e)}"
        elif pos.done.get(pg, -1) < seq and (pos.known or not _in_distributed(e)):
            reasons[rank] = f"never entered {op} #{seq}: it is in {doing(e, answered)}"
    culprits = sorted(reasons) or silent
    victims = (f"rank{'s' if len(waiting) > 1 else ''} {ranges(waiting)} "
        f"wait{'' if len(waiting) > 1 else 's'} in {op} #{seq}")
    if not culprits:
        unasked = sorted(
            int(e["rank"]) for e in entries if e.get("error") and int(e["rank"]) not in silent
        )
        if unasked:
            # Every rank asked is in the collective: the one missing is among those not asked.
            first = next(str(e["error"]) for e in entries if e.get("rank") == unasked[0])
            them = f"rank{'s' if len(unasked) > 1 else ''} {ranges(unasked)}"
            return {
                "ranks": unasked,
                "message": f"{victims} for {them}, whose stacks are not known here ({first})",
            }
        return {
            "ranks": [],
            "message": f"{victims}; every rank is there "
            "(a collective timeout or a peer outside the group?)",
        }
    if not reasons:
        return {
            "ranks": culprits,
            "message": f"{victims} for rank{'s' if len(silent) > 1 else ''} {ranges(silent)}, "
            "which did not answer",
        }
    held = "; ".join(f"rank {r} {reasons[r]}" for r in culprits)
    return {
        "ranks": culprits,
        "message": f"{held}. {victims} for {'it' if len(culprits) == 1 else 'them'}",
    }
