"""The Monitor's header: one line that says which run it is and how it stands, fitted to the
terminal's width by saying less rather than wrapping (a finished run adds a second line: where
its time went)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from xl.tui import fmt

if TYPE_CHECKING:
    from xl.launcher.view.runview import RunView


def header_text(view: RunView, dir_name: str, now: float, width: int = 0) -> Text:
    """The Monitor's first line: the run's name, id and status, elapsed time, world size, its
    node (the number of nodes when more than one) and devices. Made to fit ``width`` (0: as it
    is) by saying less, in this order: wide gaps, the GPUs' model (the GPUs screen names it), the
    host, then the end of the name; never the run id, the one thing every command takes."""
    rec, nodes = view.record, view.nodes
    run_id = rec.run_id or dir_name
    # xl's run ids carry the run's name: said once, in the id, unless the id does not say it.
    name = rec.name if rec.name and rec.name not in run_id else None
    where = f" on {len(nodes)} nodes" if len(nodes) > 1 else ""
    host = f" on {nodes[0]}" if len(nodes) == 1 else ""  # the rank table has no Node column
    short_devices = gpu_indices(view)
    devices = view.devices_text
    if short_devices is None:
        short_devices = devices
    else:  # the model(s) after the indices, as RunView.devices_text says them
        devices = short_devices + devices[devices.index(" (") :] if " (" in devices else devices
    def line(name: str | None, gap: str, host: str, devices: str, terse: int = 0) -> Text:
        """``terse``: 1 drops the words before the figures, 2 the devices too (the GPUs
        screen lists them), 3 the world size too (the rank table shows every rank)."""
        header = Text()
        if name:
            header.append(name, style="bold")
            header.append("  ")
        header.append(f"[{run_id}]", style="dim" if name else "bold")
        header.append(gap)
        header.append(rec.status, style=fmt.lifecycle_style(rec.status, "bold"))
        elapsed = fmt.duration(view.elapsed(now))
        header.append(f"{gap}{elapsed}" if terse else f"{gap}elapsed {elapsed}")
        if not terse:
            header.append(f"{gap}world size {view.world_size}{where or host}")
            header.append(f"{gap}devices {devices}")
            return header
        if terse < 3:
            ranks = "rank" if view.world_size == 1 else "ranks"
            header.append(f"{gap}{view.world_size} {ranks}{where}")
        if terse < 2:
            header.append(f"{gap}{devices}")
        return header

    tries = [
        (name, "   ", host, devices, 0),
        (name, "  ", host, devices, 0),
        (name, "  ", host, short_devices, 0),
        (name, "  ", "", short_devices, 0),
    ]
    # A narrow terminal: the run id stays whole, the figures lose their words first, the
    # name (a name the id does not carry) goes last.
    narrow = [(who, "  ", "", short_devices, terse) for who in (name, None) for terse in (1, 2, 3)]
    for shown in tries:
        header = line(*shown)
        if not width or header.cell_len <= width:
            break
    over = header.cell_len - width if width else 0
    if over > 0 and name and len(name) - over - 1 >= 4:  # the name's end goes last (not all of it)
        header = line(name[: len(name) - over - 1] + "…", *tries[-1][1:])
    elif over > 0:
        for shown in narrow:
            header = line(*shown)
            if header.cell_len <= width:
                break
    spent = view.time_spent
    if spent:  # a finished run: where its time went (docs/compare.md)
        header.append(f"\n{spent}", style="dim")
    return header


def gpu_indices(view: RunView) -> str | None:
    """``GPU 0-7``: the run's GPUs by index, a run of three or more in a row as a range; None on
    CPU."""
    indices = [d.index for d in view.record.devices if d.index is not None]
    if not indices or len(indices) < len(view.record.devices):
        return None  # an index not recorded: RunView.devices_text says what is known
    groups: list[list[int]] = []
    for i in indices:
        if groups and i == groups[-1][-1] + 1:
            groups[-1].append(i)
        else:
            groups.append([i])
    parts = [
        f"{g[0]}-{g[-1]}" if len(g) > 2 else ",".join(str(i) for i in g) for g in groups
    ]
    return f"GPU {','.join(parts)}"
