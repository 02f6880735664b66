"""Which physical GPUs a CUDA process sees, and in which order (pure; no NVML, no torch).

CUDA first numbers the GPUs by CUDA_DEVICE_ORDER (FASTEST_FIRST by default, PCI_BUS_ID = the
nvidia-smi order), then CUDA_VISIBLE_DEVICES picks from that numbering. The parsing rules follow
what CUDA does, as PyTorch models it in ``torch.cuda._parse_visible_devices``:

- entries are comma separated; an index entry is read like ``strtoul`` (whitespace skipped,
  ``"1gpu2"`` is 1, ``"1fa9..."`` is 1), UUID entries must start with ``GPU-`` / ``MIG-`` and may be
  any unique prefix of the UUID;
- the first invalid entry (unknown index or UUID, negative number, empty, an entry of the other
  kind) ends the list: later entries are ignored;
- an entry repeated makes the whole list empty: CUDA sees no GPU at all;
- ``""`` and ``-1`` hide every GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xl.gpu.inventory import GPU

PCI_BUS_ID = "PCI_BUS_ID"
FASTEST_FIRST = "FASTEST_FIRST"


@dataclass(frozen=True)
class Visibility:
    devices: tuple[GPU, ...]  # what CUDA sees: devices[k] is cuda:k
    problems: tuple[str, ...]  # one line each: what is wrong and what CUDA does about it
    hides_all: bool  # CUDA_VISIBLE_DEVICES is set and selects no GPU
    order_differs: bool  # CUDA's numbering differs from nvidia-smi's (CUDA_DEVICE_ORDER)
    device_order: str  # PCI_BUS_ID | FASTEST_FIRST (what CUDA uses)
    visible_devices: str | None  # the raw CUDA_VISIBLE_DEVICES (None: unset)
    ignored: tuple[str, ...] = ()  # entries CUDA ignores (after the first invalid one)
    mig_ids: tuple[str, ...] = ()  # MIG instances selected (not resolvable to GPUs here)
    duplicates: tuple[str, ...] = ()  # entries given twice (which empties the list)
    # An entry CUDA rejects (it stops there) or a duplicate: the variable is wrong, whereas the
    # other problems are facts worth knowing (orders differ, "" hides all on purpose, ...).
    invalid: bool = False


def _uuid_key(uuid: str) -> str:
    return uuid[4:].lower() if uuid[:4].upper() == "GPU-" else uuid.lower()


def _by_uuid_prefix(gpus: Sequence[GPU], prefix: str) -> tuple[GPU | None, int]:
    """The GPU whose UUID starts with ``prefix`` (without ``GPU-``), and how many matched."""
    key = prefix.lower()
    hits = [g for g in gpus if g.uuid and _uuid_key(g.uuid).startswith(key)]
    return (hits[0] if len(hits) == 1 else None), len(hits)


def find_gpu(gpus: Sequence[GPU], token: str) -> GPU | None:
    """The GPU a person means by ``token``: an nvidia-smi index, a UUID or a unique prefix of
    one (with or without ``GPU-``), or a PCI bus id. None when nothing or several match."""
    t = token.strip()
    if not t:
        return None
    if t.isdigit():
        return next((g for g in gpus if g.index == int(t)), None)
    pci = [g for g in gpus if g.pci_bus_id and _pci_matches(g.pci_bus_id, t)]
    if len(pci) == 1:
        return pci[0]
    key = _uuid_key(t)
    if not key:
        return None
    gpu, _ = _by_uuid_prefix(gpus, key)
    return gpu


def _pci_matches(bus_id: str, t: str) -> bool:
    b, t = bus_id.lower(), t.lower()
    # nvidia-smi prints 00000000:07:00.0; lspci prints 0000:07:00.0 or 07:00.0
    return ":" in t and (b == t or b.endswith(":" + t) or b[4:] == t)


def cuda_order(gpus: Sequence[GPU], env: Mapping[str, str]) -> tuple[tuple[GPU, ...], str]:
    """All GPUs in CUDA's numbering before CUDA_VISIBLE_DEVICES, and the order used."""
    smi = tuple(sorted(gpus, key=lambda g: g.index))
    order = env.get("CUDA_DEVICE_ORDER", "").strip().upper()
    if order == PCI_BUS_ID:
        return smi, PCI_BUS_ID
    # FASTEST_FIRST: CUDA ranks by an estimate of speed; the compute capability stands in for
    # it (the newer architecture first), and equal GPUs keep their PCI order (sort is stable).
    return tuple(sorted(smi, key=lambda g: -_cc_value(g.compute_capability))), FASTEST_FIRST


def _cc_value(cc: str | None) -> float:
    if not cc:
        return -1.0
    major, _, minor = cc.partition(".")
    try:
        return int(major) + int(minor or 0) / 100
    except ValueError:
        return -1.0


def _strtoul(s: str) -> int:
    """What CUDA reads from an index entry: the leading digits, or -1 (invalid)."""
    s = s.lstrip(" \t\n\r\f\v")
    digits = ""
    for i, c in enumerate(s):
        if c.isdigit() or (i == 0 and c in "+-"):
            digits += c
        else:
            break
    try:
        return int(digits)
    except ValueError:
        return -1


def resolve_visible_devices(gpus: Sequence[GPU], env: Mapping[str, str]) -> Visibility:
    """Which of ``gpus`` (an xl.gpu.nvml inventory) a CUDA process started with ``env`` sees."""
    ordered, order = cuda_order(gpus, env)
    smi = tuple(sorted(gpus, key=lambda g: g.index))
    order_differs = [g.index for g in ordered] != [g.index for g in smi]
    problems: list[str] = []
    raw_order = env.get("CUDA_DEVICE_ORDER")
    if raw_order is not None and raw_order.strip().upper() not in (PCI_BUS_ID, FASTEST_FIRST):
        problems.append(
            f"CUDA_DEVICE_ORDER={raw_order!r} is not a value CUDA knows; it uses FASTEST_FIRST "
            f"(set PCI_BUS_ID to number GPUs as nvidia-smi does)"
        )
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        if order_differs:
            problems.append(
                "CUDA numbers these GPUs fastest first, so CUDA index k is not nvidia-smi "
                "index k (set CUDA_DEVICE_ORDER=PCI_BUS_ID)"
            )
        return Visibility(ordered, tuple(problems), False, order_differs, order, None)

    entries = raw.split(",")
    chosen: list[GPU] = []
    invalid = False
    mig: list[str] = []
    ignored: tuple[str, ...] = ()
    dupes: list[str] = []
    uuid_mode = raw.startswith("GPU-") or raw.startswith("MIG-")
    for pos, entry in enumerate(entries):
        gpu: GPU | None = None
        why = ""
        if uuid_mode:
            if entry.startswith("MIG-"):
                if entry in mig:
                    dupes.append(entry)
                    break
                mig.append(entry)
                continue
            if not entry.startswith("GPU-"):
                why = (
                    f"entry {entry!r} is not a GPU- UUID like the first entry "
                    "(indices and UUIDs cannot be mixed)"
                )
            else:
                gpu, hits = _by_uuid_prefix(gpus, entry[4:])
                if hits > 1:
                    why = f"{entry!r} matches {hits} GPUs' UUIDs (give more of the UUID)"
                elif gpu is None:
                    why = f"no GPU has the UUID {entry!r}"
        else:
            n = _strtoul(entry)
            if n < 0:
                if entry.strip() == "" and len(entries) > 1:
                    why = "an empty entry"
                elif entry.strip().startswith(("GPU-", "MIG-")):
                    why = (
                        f"entry {entry.strip()!r} is a UUID after an index "
                        "(indices and UUIDs cannot be mixed)"
                    )
                elif entry.strip() not in ("", "-1"):
                    why = f"{entry.strip()!r} is not a GPU index"
            elif n >= len(ordered):
                why = f"there is no GPU {n} (CUDA sees {len(ordered)})"
            else:
                gpu = ordered[n]
                text = entry.strip()
                if not text.isdigit():
                    problems.append(
                        f"entry {text!r} is read by CUDA as index {n}"
                        + (" (a UUID needs the GPU- prefix)" if len(text) > 8 else "")
                    )
        if gpu is None:
            ignored = tuple(entries[pos + 1 :])
            if not why and pos > 0:
                why = f"{entry.strip()!r} ends the list"
            if why:
                invalid = True
                rest = f", ignoring {','.join(ignored)!r}" if ignored else ""
                problems.append(f"CUDA_VISIBLE_DEVICES: {why}; CUDA stops there{rest}")
            break
        if any(g.index == gpu.index for g in chosen):
            dupes.append(entry.strip())
            break
        chosen.append(gpu)

    if dupes:
        problems.append(
            f"CUDA_VISIBLE_DEVICES: {dupes[0]!r} names a GPU twice, so CUDA sees no GPU at all "
            "(list each GPU once)"
        )
        chosen, mig = [], []
    if mig:
        problems.append(
            "CUDA_VISIBLE_DEVICES selects MIG instances; xl shows whole GPUs and cannot tell "
            "which GPU each MIG instance belongs to"
        )
    if not uuid_mode and any(ordered.index(g) != g.index for g in chosen):
        problems.append(
            "CUDA_VISIBLE_DEVICES indices are CUDA's (fastest first), not nvidia-smi's "
            "(set CUDA_DEVICE_ORDER=PCI_BUS_ID): "
            + ", ".join(
                f"{e.strip()}=nvidia-smi {g.index}" for e, g in zip(entries, chosen, strict=False)
            )
        )
    hides_all = not chosen and not mig
    if hides_all and not dupes and len(gpus):
        shown = raw if raw.strip() else '""'
        problems.append(
            f"CUDA_VISIBLE_DEVICES={shown} hides every GPU: CUDA sees none "
            "(unset it or list the GPUs to use)"
        )
    return Visibility(
        devices=tuple(chosen),
        problems=tuple(problems),
        hides_all=hides_all,
        order_differs=order_differs,
        device_order=order,
        visible_devices=raw,
        ignored=ignored,
        mig_ids=tuple(mig),
        duplicates=tuple(dupes),
        invalid=invalid or bool(dupes),
    )


# --------------------------------------------------------------------------- the one verdict
# `xl doctor` (check cuda_visible_devices) and `xl launch` / `xl demo` (the devices a run gets
# when no --gpus is given) judge CUDA_VISIBLE_DEVICES with this one function, so the doctor's
# status is what a launch does: ok / skip = go on silently, warn = go on and say it, fail = stop.
_DEVICE_TOKEN = re.compile(r"\s*(\d+|(GPU|MIG)-[0-9A-Za-z-]+)\s*")
# The values people write to hide every GPU on purpose ("-1" is the common one).
_HIDE_ALL = ("", "-1")


@dataclass(frozen=True)
class VisibleVerdict:
    status: str  # ok | warn | fail | skip (the doctor's statuses)
    detail: str
    fix: str | None
    devices: tuple[GPU, ...]  # what CUDA sees (cuda:k is devices[k]); empty: a CPU run
    data: dict[str, Any] = field(default_factory=dict)


def judge_visible_devices(
    gpus: Sequence[GPU], env: Mapping[str, str], *, have_driver: bool
) -> VisibleVerdict:
    """How CUDA_VISIBLE_DEVICES in ``env`` stands on a machine with ``gpus`` (one inventory).

    With no driver nothing can be matched: the entries' syntax is all there is to judge, and a
    run there is a CPU run whatever the variable says, so nothing is a ``fail``."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    usable = [g for g in gpus if not g.lost]
    if value is None:
        if have_driver:
            return VisibleVerdict(
                "ok", f"unset: all {len(gpus)} GPU(s) visible", None, tuple(usable)
            )
        return VisibleVerdict("skip", "unset", None, ())
    data: dict[str, Any] = {"value": value}
    if value.strip() in _HIDE_ALL:
        shown = repr(value) if value.strip() else "set but empty"
        if not usable:
            return VisibleVerdict(
                "skip", f"{shown}: hides every GPU; there is none here anyway", None, (), data
            )
        return VisibleVerdict(
            "warn",
            # The alternative is said in the detail, so the fix stays one command to paste.
            f"{shown}: CUDA sees no GPU at all (torch.cuda.is_available() is False); or list "
            "the GPUs to use, e.g. export CUDA_VISIBLE_DEVICES=0,1",
            "unset CUDA_VISIBLE_DEVICES",
            (),
            data,
        )
    if not have_driver:
        bad = [tok for tok in value.split(",") if not _DEVICE_TOKEN.fullmatch(tok)]
        if bad:
            return VisibleVerdict(
                "warn",
                f"{value!r}: {bad[0]!r} is neither an index nor a GPU-/MIG- UUID",
                "use indices or UUIDs from `nvidia-smi -L`, e.g. export CUDA_VISIBLE_DEVICES=0,1",
                (),
                data,
            )
        return VisibleVerdict(
            "skip", f"{value!r}; no driver to check the entries against", None, (), data
        )
    vis = resolve_visible_devices(gpus, env)
    devices = tuple(g for g in vis.devices if not g.lost)
    # Visibility also reports CUDA_DEVICE_ORDER problems; those belong to the order check.
    problems = [p for p in vis.problems if p.startswith(("CUDA_VISIBLE_DEVICES", "entry "))]
    # Selecting MIG instances is a valid setup; say so without calling it a problem.
    problems = [p for p in problems if "MIG instances" not in p]
    if len(vis.mig_ids) > 1:
        # CUDA enumerates one MIG instance per process (the first listed): the rest sit idle,
        # and every rank started with this variable lands on that same instance.
        return VisibleVerdict(
            "fail",
            f"{value!r} names {len(vis.mig_ids)} MIG instances, but one CUDA process enumerates "
            "only one "
            f"(the first, {vis.mig_ids[0]}): the others are never used; one MIG instance per "
            "process, each process its own",
            f"export CUDA_VISIBLE_DEVICES={vis.mig_ids[0]}",
            devices,
            {**data, "mig": list(vis.mig_ids)},
        )
    if vis.mig_ids and not problems:
        also = f" and GPU(s) {', '.join(str(g.index) for g in devices)}" if devices else ""
        return VisibleVerdict(
            "ok", f"{value!r}: {len(vis.mig_ids)} MIG instance(s){also}", None, devices, data
        )
    data["devices"] = [g.index for g in devices]
    if problems:
        fatal = bool(vis.duplicates) or any("CUDA stops there" in p for p in problems)
        keep = ",".join(str(g.index) for g in devices) or ",".join(str(g.index) for g in gpus)
        fix = (
            f"export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={keep}"
            if keep
            else "unset CUDA_VISIBLE_DEVICES"
        )
        numbered = "; the fix numbers GPUs as `nvidia-smi -L` does" if keep else ""
        said = "; ".join(problems) + numbered
        return VisibleVerdict("fail" if fatal else "warn", said, fix, devices, data)
    shown = ", ".join(f"{g.index}" for g in devices)
    return VisibleVerdict(
        "ok", f"{value!r}: CUDA sees nvidia-smi GPU(s) {shown}", None, devices, data
    )
