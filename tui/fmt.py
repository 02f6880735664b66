"""Small text formatters shared by the screens (durations, sizes, meters, a status in colour)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from rich.text import Text

from xl.launcher.view.runview import (
    lifecycle_style as lifecycle_style,  # re-exported: rank states, run statuses
)
from xl.units import mib as mib  # re-exported: one memory style for the app and the plain views

# Tests and snapshots replace this to get a fixed "now" (deterministic elapsed / last seen).
Clock = Callable[[], float]
default_clock: Clock = time.time

# What a table's cell shows: plain text, or rich Text where it has styles of its own.
Cell = str | Text



def duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0 or math.isnan(seconds):
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def ago(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    return duration(max(0.0, now - t)) + " ago"


def number(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.3g}"
    return f"{value:.{digits}g}"


def rate(value: float | None) -> str:
    """A throughput for a narrow column: 532, 12.4k, 1.2M (never 1.24e+04)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale * 0.9995:  # what would print as 1e+03 is 1k
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def meter(
    fraction: float | None, width: int = 10, label: str = "", style: str | None = None
) -> Text:
    """A bar like ``████▌     42%`` that stays readable without colour (NO_COLOR).

    Coloured by how full it is (green, yellow past 70%, red past 90%) unless ``style`` is given.
    """
    if fraction is None:
        return Text("-".ljust(width) + (f" {label}" if label else ""), style="dim")
    f = min(1.0, max(0.0, fraction))
    eighths = round(f * width * 8)
    full, rest = divmod(eighths, 8)
    bar = "█" * full + (" ▏▎▍▌▋▊▉"[rest] if rest else "")
    if style is None:
        style = "green" if f < 0.7 else ("yellow" if f < 0.9 else "red")
    text = Text(bar.ljust(width), style=style)
    if label:
        text.append(f" {label}")
    return text


def coloured(name: str | None) -> Text:
    """A run's status or a rank's state, in its colour (lifecycle_style)."""
    name = name or "-"
    return Text(name, style=lifecycle_style(name))
