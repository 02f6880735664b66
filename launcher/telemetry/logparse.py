"""Metrics from rank output, for scripts that never call ``xl.log``.

Two shapes are understood:

- HF Trainer log dicts, printed by its ProgressCallback / PrinterCallback:
  ``{'loss': 0.5, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}`` (values may be
  quoted numbers such as ``'0.6931'``: ProgressCallback formats floats with ``%.4g``).
- tqdm progress bars: ``  5%|▌   | 5/100 [00:01<00:20,  4.60it/s]`` (carriage returns split
  one physical line into many updates; the last complete one wins).
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

_DICT = re.compile(r"\{'[A-Za-z_][\w/.-]*': .*\}")
_TQDM = re.compile(r"(?P<n>\d+)/(?P<total>\d+|\?)\s*\[(?P<inside>[^\]]*)\]")
_RATE = re.compile(r"(?P<rate>[\d.]+)\s*(?P<unit>[A-Za-z]+)/s\b")
_INV_RATE = re.compile(r"(?P<inv>[\d.]+)\s*s/(?P<unit>[A-Za-z]+)\b")
# PrinterCallback prints raw floats, so a NaN loss appears as a bare ``nan`` token, which
# ast.literal_eval rejects; quote those tokens first.
_BARE = re.compile(r"(?<=: )(-?inf|nan)(?=[,}])")
_RENAME = {"learning_rate": "lr", "train_loss": "loss"}
_STEP_KEYS = ("step", "global_step")


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def parse_hf_dict(text: str) -> dict[str, Any] | None:
    match = _DICT.search(text)
    if match is None:
        return None
    try:
        obj = ast.literal_eval(_BARE.sub(r"'\1'", match.group(0)))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    out: dict[str, Any] = {}
    nonfinite: dict[str, str] = {}
    for key, value in obj.items():
        num = _number(value)
        if num is None or not isinstance(key, str):
            continue
        name = _RENAME.get(key, key)
        if isinstance(num, float) and not math.isfinite(num):
            nonfinite[name] = "nan" if math.isnan(num) else ("inf" if num > 0 else "-inf")
            out[name] = None
            continue
        out[name] = num
    if not out:
        return None
    # A Trainer summary ('train_runtime', ...) is not a step record; keep it but mark it.
    if "train_runtime" in out:
        out["summary"] = True
    for key in _STEP_KEYS:
        if key in out:
            out["step"] = int(out.pop(key))
            break
    if nonfinite:
        out["nonfinite"] = nonfinite
    return out


def parse_tqdm(text: str) -> dict[str, Any] | None:
    # The last carriage-return segment is what the terminal would show.
    for segment in reversed(text.split("\r")):
        if "|" not in segment and "it/s" not in segment and "s/it" not in segment:
            continue
        match = _TQDM.search(segment)
        if match is None:
            continue
        out: dict[str, Any] = {"step": int(match.group("n"))}
        if match.group("total") not in (None, "?"):
            out["total_steps"] = int(match.group("total"))
        inside = match.group("inside")
        rate = _RATE.search(inside)
        inv = _INV_RATE.search(inside) if rate is None else None
        try:
            if rate is not None:
                unit = rate.group("unit")
                key = "steps_per_s" if unit == "it" else f"{unit}_per_s"
                out[key] = float(rate.group("rate"))
            elif inv is not None and float(inv.group("inv")) > 0:
                out["steps_per_s"] = round(1.0 / float(inv.group("inv")), 6)
        except ValueError:  # "1.2.3it/s" is not a number
            pass
        return out
    return None


def parse_line(line: str) -> dict[str, Any] | None:
    """Train scalars found in one line of rank output, or None (the common, cheap case)."""
    if "{'" in line:
        found = parse_hf_dict(line)
        if found is not None:
            return found
    if "/" in line and ("it/s" in line or "s/it" in line or "%|" in line):
        return parse_tqdm(line)
    return None
