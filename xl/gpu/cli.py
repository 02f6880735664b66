"""``xl gpus [--json]``: a one-shot GPU inventory.

A Rich table when stdout is a terminal (or FORCE_COLOR is set); plain aligned text when it is
not (pipes, files, CI) or when NO_COLOR / TERM=dumb ask for it; ``--json`` for programs. No
NVIDIA driver is a valid setup (CPU training), so it says so and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from xl.errors import ArgumentParser
from xl.gpu.nvml import GPU, Inventory, inventory

if TYPE_CHECKING:  # Rich is imported only for a colour terminal
    from rich.console import RenderableType

NA = "n/a"
HEADERS = (
    "IDX",
    "NAME",
    "UUID",
    "PCI BUS ID",
    "MEMORY MiB",
    "GPU%",
    "MEM%",
    "TEMP",
    "POWER W",
    "CC",
    "MIG",
)
PROC_HEADERS = ("GPU", "PID", "MEMORY MiB", "RANK", "LOCAL RANK", "RUN", "NAME")


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    return NA if v is None else fmt.format(v)


def _memory(g: GPU) -> str:
    if g.memory_total_mib is None:
        return NA
    return f"{_num(g.memory_used_mib)} / {_num(g.memory_total_mib)}"


def _power(g: GPU) -> str:
    if g.power_w is None and g.power_limit_w is None:
        return NA
    return f"{_num(g.power_w)} / {_num(g.power_limit_w)}"


def _mig(g: GPU) -> str:
    return NA if g.mig_mode is None else ("on" if g.mig_mode else "off")


def gpu_row(g: GPU) -> tuple[str, ...]:
    if g.lost:
        return (
            str(g.index),
            g.name or "?",
            g.uuid or "?",
            g.pci_bus_id or "?",
            "LOST",
            "",
            "",
            "",
            "",
            g.compute_capability or "",
            "",
        )
    return (
        str(g.index),
        g.name or "?",
        g.uuid or "?",
        g.pci_bus_id or "?",
        _memory(g),
        _num(g.util_gpu, "{}%"),
        _num(g.util_mem, "{}%"),
        _num(g.temperature_c, "{}C"),
        _power(g),
        g.compute_capability or NA,
        _mig(g),
    )


def process_rows(inv: Inventory) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for g in inv.gpus:
        for p in g.processes:
            rows.append(
                (
                    str(g.index),
                    str(p.pid),
                    _num(p.used_mib),
                    "" if p.rank is None else str(p.rank),
                    "" if p.local_rank is None else str(p.local_rank),
                    p.run_id or "",
                    p.name or "?",
                )
            )
    return rows


def headline(inv: Inventory) -> str:
    d = inv.driver
    if d.error:
        return d.error[:1].upper() + d.error[1:]
    n = len(inv.gpus)
    gpus = "no GPUs found" if n == 0 else f"{n} GPU{'s' if n != 1 else ''}"
    return f"NVIDIA driver {d.version or NA}, CUDA {d.cuda_version or NA}: {gpus}"


def notes(inv: Inventory) -> list[str]:
    return [f"GPU {g.index}: {g.error}" for g in inv.gpus if g.error]


RIGHT = frozenset({"IDX", "MEMORY MiB", "GPU%", "MEM%", "TEMP", "POWER W", "GPU", "PID"})


def _align(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    return [
        "  ".join(
            c.rjust(w) if h in RIGHT else c.ljust(w)
            for c, w, h in zip(r, widths, headers, strict=True)
        ).rstrip()
        for r in [headers, *rows]
    ]


def render_plain(inv: Inventory) -> str:
    lines = [headline(inv)]
    if inv.gpus:
        lines += ["", *_align(HEADERS, [gpu_row(g) for g in inv.gpus])]
        procs = process_rows(inv)
        lines += ["", *(_align(PROC_HEADERS, procs) if procs else ["No processes on the GPUs."])]
    extra = notes(inv)
    if extra:
        lines += ["", *extra]
    return "\n".join(lines) + "\n"


def render_rich(inv: Inventory) -> RenderableType:
    """A Rich renderable of the same content (Rich is imported only for a terminal)."""
    from rich.console import Group  # noqa: PLC0415 - Rich costs ~45 ms; only a colour terminal needs it
    from rich.table import Table  # noqa: PLC0415 - Rich costs ~45 ms; only a colour terminal needs it
    from rich.text import Text  # noqa: PLC0415 - Rich costs ~45 ms; only a colour terminal needs it

    parts: list[RenderableType] = [
        Text(headline(inv), style="bold red" if inv.driver.error else "bold")
    ]
    if inv.gpus:
        table = Table(show_edge=False, header_style="bold", pad_edge=False)
        for h in HEADERS:
            table.add_column(
                h,
                no_wrap=h in ("IDX", "UUID", "PCI BUS ID", "MEMORY MiB"),
                justify="right" if h in RIGHT else "left",
            )
        for g in inv.gpus:
            table.add_row(*gpu_row(g), style="red" if g.lost else None)
        parts.append(table)
        procs = process_rows(inv)
        if procs:
            pt = Table(show_edge=False, header_style="bold", pad_edge=False)
            for h in PROC_HEADERS:
                pt.add_column(h, justify="right" if h in RIGHT else "left")
            for r in procs:
                pt.add_row(*r)
            parts.append(pt)
        else:
            parts.append(Text("No processes on the GPUs.", style="dim"))
    for line in notes(inv):
        parts.append(Text(line, style="yellow"))
    return Group(*parts)


def _wants_rich() -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return bool(os.environ.get("FORCE_COLOR")) or sys.stdout.isatty()


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(
        prog="xl gpus", description="List the NVIDIA GPUs, their use and processes."
    )
    ap.add_argument(
        "--json", action="store_true", help="print one JSON object (keys: docs/contracts.md)"
    )
    args = ap.parse_args(list(argv) if argv is not None else None)
    inv = inventory()
    if args.json:
        sys.stdout.write(json.dumps(inv.to_json(), indent=2) + "\n")
    elif _wants_rich():
        from rich.console import Console  # noqa: PLC0415 - Rich costs ~45 ms; only a colour terminal needs it

        Console().print(render_rich(inv))
    else:
        sys.stdout.write(render_plain(inv))
    sys.stdout.flush()
    return 0
