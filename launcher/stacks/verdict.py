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

import xl
from xl.launcher.stacks.collectives import Collective, Columns, Shapes
from xl.launcher.stacks.model import Frame, RankStacks, Verdict
from xl.stats import median
from xl.units import ranks_text

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


def _r(entry: RankStacks) -> int:
    """The entry's rank (every entry asked has one; -1 stands for none)."""
    return entry.rank if entry.rank is not None else -1


def _is_user(frame: Frame) -> bool:
    path = frame.file
    return not any(mark in path for mark in _LIBRARY_MARKS) and not path.startswith(_XL_DIRS)


def _qualified(frame: Frame) -> str:
    """'re.match', 'torch.distributed.distributed_c10d.all_reduce': a library function by its
    module."""
    path, function = frame.file, frame.function
    for root in _PACKAGE_ROOTS:
        if root in path:
            rest = path.rsplit(root, 1)[1]
            if root == "/lib/python3":
                rest = rest.partition("/")[2]  # past "11/"
            module = rest.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            return f"{module}.{function}" if module and "<" not in module else function
    return function


def _at(frame: Frame) -> str:
    return f"{frame.function} at {os.path.basename(frame.file)}:{frame.line}"


def where(entry: RankStacks) -> str:
    """'parse_record at train.py:19 (calling re.match)': the innermost frame of the person's own
    code (not a library's, the standard library's or xl's), and the call it is in, if any."""
    frames = entry.main_frames
    if not frames:
        return "no Python frame"
    at = next((i for i in range(len(frames) - 1, -1, -1) if _is_user(frames[i])), None)
    if at is None:  # nothing of the person's (a library's own thread or entry point)
        return _at(frames[-1])
    inner = frames[at + 1 :]
    callee = next((f for f in inner if f.function not in _WRAPPERS), inner[-1] if inner else None)
    calling = f" (calling {_qualified(callee)})" if callee is not None else ""
    return f"{_at(frames[at])}{calling}"


def busy(entry: RankStacks, peers: Sequence[RankStacks] = ()) -> bool:
    """The rank was using the CPU since its last progress (``cpu_pct`` in its entry): BUSY_CPU
    or more, or several times what the other ranks of ``peers`` (the same capture) used."""
    cpu = entry.cpu_pct
    if cpu is None:
        return False
    if cpu >= BUSY_CPU:
        return True
    others = [p.cpu_pct for p in peers if p.rank != entry.rank and p.cpu_pct is not None]
    if not others or cpu < BUSY_MIN_CPU:
        return False
    return cpu >= BUSY_OVER_PEERS * max(median(others), BUSY_PEER_FLOOR)


def doing(entry: RankStacks, peers: Sequence[RankStacks] = ()) -> str:
    """where(), and for a rank that was using the CPU since its last progress, how much: "evaluate
    at train.py:88, working at 99% CPU (a long computation, or a loop that never ends)"."""
    if not busy(entry, peers):
        return where(entry)
    return (f"{where(entry)}, working at {entry.cpu_pct:.0f}% CPU (a long computation, or a "
        f"loop that never ends)")


def _place(entry: RankStacks) -> str:
    """'train.py:41': where() without the function and the call."""
    return where(entry).split(" at ", 1)[-1].split(" (calling ", 1)[0]


def _in_distributed(entry: RankStacks) -> bool:
    return any("torch/distributed" in f.file for f in entry.main_frames[-4:])


@dataclass
class Position:
    """Where one rank is in collective terms: waiting in (pg, seq, op), or last done (pg, seq)."""

    waiting: tuple[str, int, str] | None = None
    done: dict[str, int] = field(default_factory=dict)
    known: bool = False


def position(entry: RankStacks) -> Position:
    # Read for every rank of a capture: the columns read side by side, the group
    # (Collective.group) and done-ness spelled out.
    pgs, seqs, ops, stages, pg_ids, _, _ = entry.collectives.columns
    done: dict[str, int] = {}
    waiting: tuple[str, int, str] | None = None
    for pg, seq, op, stage, pg_id in zip(pgs, seqs, ops, stages, pg_ids, strict=True):
        if seq is None:
            continue
        if pg_id is not None:
            pg = pg_id
        if stage == "completed":
            if seq > done.get(pg, -1):
                done[pg] = seq
        elif waiting is None or seq > waiting[1]:
            waiting = (pg, seq, op)
    return Position(waiting, done, bool(seqs))


def _shared(entry: RankStacks, memo: dict[object, Position]) -> Position:
    """position(), one value for the ranks of a capture at the same place (thousands of ranks in
    one all-reduce are at two or three): read, never changed. Ranks that recorded the same
    collectives hold one Columns (the document keeps them once): found by its identity, which
    lasts as long as the entries the memo is used with."""
    columns = entry.collectives.columns
    pos = memo.get(id(columns))
    if pos is None:
        pos = position(entry)
        pos = memo.setdefault((pos.waiting, pos.known, *pos.done.items()), pos)
        memo[id(columns)] = pos
    return pos


def _label(entry: RankStacks, pos: Position) -> str:
    if pos.waiting is not None:
        _, seq, op = pos.waiting
        return f"wait in {op} #{seq} at {_place(entry)}"
    return f"in {where(entry)}"


def groups(entries: Sequence[RankStacks]) -> list[tuple[list[int], str]]:
    """Ranks with the same position and stack place, largest group first."""
    by: dict[str, list[int]] = {}
    for e in entries:
        error = e.error or ""
        label = (
            (error if error.startswith(SILENT) else f"gave no stacks ({error})")
            if error
            else _label(e, position(e))
        )
        by.setdefault(label, []).append(_r(e))
    return sorted(((sorted(r), label) for label, r in by.items()), key=lambda g: (-len(g[0]), g[0]))


def group_lines(entries: Sequence[RankStacks]) -> list[str]:
    """One line per group: 'ranks 0,2-7 wait in all_reduce #12 at train.py:41'."""
    out = []
    for ranks, label in groups(entries):
        many = len(ranks) > 1
        if label.startswith("wait "):
            label = label if many else "waits" + label[4:]
        elif label.startswith("in "):
            label = ("are " if many else "is ") + label
        out.append(f"{ranks_text(ranks)} {label}")
    return out


# Ops whose tensors may differ between ranks as used (torch's Flight Recorder analysis agrees):
# all-to-all's splits, scatter's inputs and gather's outputs exist on the root only.
_FREE_IN = frozenset({"all_to_all", "alltoall", "alltoall_base", "all_to_all_single", "scatter"})
_FREE_OUT = frozenset({"all_to_all", "alltoall", "alltoall_base", "all_to_all_single", "gather"})


# What every rank's record of one collective must agree on: the op and, where the op wants them
# equal, its tensors' shapes (None where not known).
_Signature = tuple[str, Shapes | None, Shapes | None]


def _signature(op: str, ins: Shapes | None, outs: Shapes | None) -> _Signature:
    return (op, None if op in _FREE_IN else ins, None if op in _FREE_OUT else outs)


def _agree(a: _Signature, b: _Signature) -> bool:
    return a[0] == b[0] and all(
        x == y or x is None or y is None for x, y in zip(a[1:], b[1:], strict=True)
    )


def _shapes(c: Collective) -> str:
    sizes = c.ins if c.ins else c.outs
    return f" of {', '.join('x'.join(map(str, s)) or 'scalar' for s in sizes)}" if sizes else ""


def _culprits(parts: list[list[int]]) -> list[int]:
    """The ranks apart from a strict majority; all of them when none has one (two ranks)."""
    parts = sorted(parts, key=len, reverse=True)
    if len(parts[0]) > len(parts[1]):
        return sorted(r for part in parts[1:] for r in part)
    return sorted(r for part in parts for r in part)


def mismatch(entries: Sequence[RankStacks]) -> Verdict | None:
    """A certain deadlock, named from one snapshot whatever the progress says, or None.

    - The same sequence number of one process group recorded as different collectives on two
      ranks (another op, or other tensor shapes): they can never match. The first such number
      where a rank still waits is the one named, with every rank's place.
    - Two ranks each blocked in a collective of a different process group, both of which they
      use, neither having done the other's: each waits for the other.
    Ranks merely at different numbers (one behind, or NCCL's queue ahead) are no mismatch."""
    return _mismatch(entries, {})


def _mismatch(
    entries: Sequence[RankStacks], positions: dict[int, Position]
) -> Verdict | None:
    """mismatch(), with the positions of ranks already found (more are added to it)."""
    answered = {e.rank: e for e in entries if not e.error and e.rank is not None}
    # The ranks that recorded the same collectives hold one Columns (see _shared): each is read
    # once, and a rank's Collective is made only where some rank has not done it.
    alike: dict[int, tuple[Columns, list[int]]] = {}
    for rank, e in answered.items():
        columns = e.collectives.columns
        group = alike.get(id(columns))
        if group is None:
            alike[id(columns)] = (columns, [rank])
        else:
            group[1].append(rank)
    # Where each (group, number) is recorded: the Columns, the ranks holding it, the index.
    seen: dict[tuple[str, int], list[tuple[Columns, list[int], int]]] = {}
    unfinished: set[tuple[str, int]] = set()  # where some rank has not done its collective
    for columns, ranks in alike.values():
        for i, (pg, seq, pg_id, stage) in enumerate(
            zip(columns.pg, columns.seq, columns.pg_id, columns.stage, strict=True)
        ):
            if seq is not None:
                key = (pg if pg_id is None else pg_id, seq)
                places = seen.get(key)
                if places is None:
                    seen[key] = places = []
                places.append((columns, ranks, i))
                if stage != "completed":
                    unfinished.add(key)
    order = {rank: n for n, rank in enumerate(answered)}
    for key, places in sorted(seen.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        seq = key[1]
        if key not in unfinished:
            continue
        # Each rank's place (a rank's later record of one number is the one read, as in its own
        # order): thousands of ranks share a few, each read once.
        at = {rank: k for k, (_, ranks, _) in enumerate(places) for rank in ranks}
        if len(at) < 2:
            continue
        columns, _, i = places[at[min(at, key=order.__getitem__)]]
        pg = columns.pg[i]
        if all(places[k][0].stage[places[k][2]] == "completed" for k in set(at.values())):
            continue
        sigs = [_signature(columns.op[i], columns.ins[i], columns.outs[i])
                for columns, _, i in places]  # fmt: skip
        kinds: list[tuple[_Signature, list[int]]] = []
        # A signature met before is that kind's (the kinds' first signatures never agree, so the
        # first kind it agrees with is the one it equals): a look-up, not a scan, per rank.
        exact: dict[_Signature, list[int]] = {}
        for rank in sorted(at):
            sig = sigs[at[rank]]
            found = exact.get(sig)
            if found is not None:
                found.append(rank)
                continue
            same = next((k for k in kinds if _agree(k[0], sig)), None)
            if same is None:
                kinds.append((sig, [rank]))
                exact[sig] = kinds[-1][1]
            else:
                same[1].append(rank)
        if len(kinds) < 2:
            continue
        ops = {sig[0] for sig, _ in kinds}
        told = []
        for _sig, ranks in sorted(kinds, key=lambda k: (-len(k[1]), k[1])):
            c = answered[ranks[0]].collectives[places[at[ranks[0]]][2]]
            what = f"{c.op} #{seq}{_shapes(c) if len(ops) == 1 else ''}"
            many = len(ranks) > 1
            if c.done:
                told.append(
                    f"{ranks_text(ranks)} did {what} and "
                    f"{'are' if many else 'is'} now at {_place(answered[ranks[0]])}"
                )
            else:
                told.append(
                    f"{ranks_text(ranks)} {'are' if many else 'is'} in "
                    f"{what} at {_place(answered[ranks[0]])}"
                )
        differ = "other tensor shapes" if len(ops) == 1 else "different collectives"
        return Verdict(
            tuple(_culprits([ranks for _, ranks in kinds])),
            f"mismatch at #{seq} of process group {pg} ({differ}; they can never "
            f"match): {'; '.join(told)}",
            mismatch=True,
        )
    return _crossed(answered, positions)


def _crossed(answered: dict[int, RankStacks], positions: dict[int, Position]) -> Verdict | None:
    """Two ranks blocked (their main thread inside torch.distributed) in collectives of two
    process groups, each of which both ranks use, neither having done the other's."""
    memo: dict[object, Position] = {}
    for r, e in answered.items():
        if r not in positions:
            positions[r] = _shared(e, memo)
    # Ranks blocked in one process group alone (the hang of thousands in one all-reduce) make no
    # pair: their frames need no look.
    if len({p.waiting[0] for p in positions.values() if p.waiting is not None}) < 2:
        return None
    groups = {r: {c.group for c in e.collectives} for r, e in answered.items()}
    pos = {r: positions[r] for r, e in answered.items() if _in_distributed(e)}
    blocked = sorted((r, p.waiting) for r, p in pos.items() if p.waiting is not None)
    # Only a rank blocked in another group that x uses can be its pair: found through the
    # groups, not by a look at every later rank (thousands blocked in one all-reduce would make
    # that O(ranks^2)); the pairs are looked at in the same order, so the same pair is named.
    by_group: dict[str, list[int]] = {}
    for j, (_, (pg, _, _)) in enumerate(blocked):
        by_group.setdefault(pg, []).append(j)
    for i, (x, (pg_x, seq_x, op_x)) in enumerate(blocked):
        later = sorted(j for g in groups[x] if g != pg_x for j in by_group.get(g, ()) if j > i)
        for y, (pg_y, seq_y, op_y) in (blocked[j] for j in later):
            if pg_x == pg_y or pg_y not in groups[x] or pg_x not in groups[y]:
                continue
            if pos[x].done.get(pg_y, -1) >= seq_y or pos[y].done.get(pg_x, -1) >= seq_x:
                continue
            name = {c.group: c.pg for e in answered.values() for c in e.collectives}
            return Verdict(
                (x, y),
                f"mismatch of process groups (each waits for the other): rank {x} is in "
                f"{op_x} #{seq_x} of process group {name[pg_x]} at {_place(answered[x])}; "
                f"rank {y} is in {op_y} #{seq_y} of process group {name[pg_y]} at "
                f"{_place(answered[y])}",
                mismatch=True,
            )
    return None


def verdict(entries: Sequence[RankStacks]) -> Verdict:
    """Who the others wait for: the stacks document's ``verdict``."""
    known: dict[int, Position] = {}
    found = _mismatch(entries, known)
    if found is not None:
        return found
    answered = [e for e in entries if not e.error]
    # Only a rank that was asked and kept quiet is suspect; one with no handler tells nothing.
    silent = sorted(_r(e) for e in entries if (e.error or "").startswith(SILENT))
    memo: dict[object, Position] = {}
    positions = {_r(e): known.get(_r(e)) or _shared(e, memo) for e in answered}
    waits = Counter(p.waiting for p in positions.values() if p.waiting is not None)
    if not waits:
        if silent:
            return Verdict(
                tuple(silent),
                f"{ranks_text(silent)} did not answer; no rank waits in a collective",
            )
        where_all = "; ".join(group_lines(answered))
        return Verdict(
            (), "no rank waits in a collective" + (f": {where_all}" if where_all else "")
        )
    meet, _ = waits.most_common(1)[0]
    pg, seq, op = meet
    waiting = sorted(r for r, p in positions.items() if p.waiting == meet)
    reasons: dict[int, str] = {}
    for e in answered:
        rank, pos = _r(e), positions[_r(e)]
        if pos.waiting == meet:
            continue
        if pos.waiting is not None:
            wop, wseq = pos.waiting[2], pos.waiting[1]
            reasons[rank] = f"is in {wop} #{wseq}, not {op} #{seq}, at {_place(e)}"
        elif pos.done.get(pg, -1) < seq and (pos.known or not _in_distributed(e)):
            reasons[rank] = f"never entered {op} #{seq}: it is in {doing(e, answered)}"
    culprits = sorted(reasons) or silent
    victims = f"{ranks_text(waiting)} wait{'' if len(waiting) > 1 else 's'} in {op} #{seq}"
    if not culprits:
        unasked = sorted(_r(e) for e in entries if e.error and _r(e) not in silent)
        if unasked:
            # Every rank asked is in the collective: the one missing is among those not asked.
            first = next(e.error for e in entries if e.error and _r(e) == unasked[0])
            return Verdict(
                tuple(unasked),
                f"{victims} for {ranks_text(unasked)}, whose stacks are not known here ({first})",
            )
        return Verdict(
            (),
            f"{victims}; every rank is there (a collective timeout or a peer outside the group?)",
        )
    if not reasons:
        return Verdict(
            tuple(culprits), f"{victims} for {ranks_text(silent)}, which did not answer"
        )
    held = "; ".join(f"rank {r} {reasons[r]}" for r in culprits)
    return Verdict(
        tuple(culprits), f"{held}. {victims} for {'it' if len(culprits) == 1 else 'them'}"
    )
