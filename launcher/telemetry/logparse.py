"""Metrics from rank output, for scripts that never call ``xl.log``.

Two shapes are understood:

- HF Trainer log dicts, printed by its ProgressCallback / PrinterCallback:
  ``{'loss': 0.5, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}`` (values may be
  quoted numbers such as ``'0.6931'``: ProgressCallback formats floats with ``%.4g``). Only a
  dict that reads as a training log (a loss or an epoch in it) is one: a printed config is not.
- tqdm progress bars: ``  5%|▌   | 5/100 [00:01<00:20,  4.60it/s]`` (carriage returns split
  one physical line into many updates; the last complete one wins). Bars that are not training
  are left alone: a nested bar (tqdm moves the cursor back up after it: HF Trainer's evaluation
  bar) and Lightning's ``Validation``/``Sanity Checking``/``Testing``/``Predicting`` bars.
  Lightning's ``Epoch N:`` bar restarts its count every epoch: its step is ``N * total + n``;
  ``train_loss=`` (or ``loss=``) in a bar's postfix is the loss.

Every parser here is linear in what it reads and reads a bounded part of a line: rank output is
anyone's text, and one 60,000-digit line ending " it/s" once held the supervisor for 19 s in a
regex that backtracked over every digit. So each pattern is anchored where it may
start (no retry at every position of a long run of digits) and each repeat has a bound; a line
is looked at up to MAX_EXAMINED characters (the tail of a tqdm segment, where the counters are;
a dict only when the whole dict is within MAX_DICT). A parser added here keeps to the same rules.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

# How much of a line the parsers look at: a tqdm segment's tail, and the largest dict parsed.
MAX_EXAMINED = 2048
MAX_DICT = 16384
_DICT_TRIES = 4  # "{'" occurrences tried as the start of a dict, first ones first
_DICT_KEY = re.compile(r"\{'[A-Za-z_][\w/.-]{0,128}': ")
# (?<!\d): a match starts only at the first digit of a number, never again inside it.
_TQDM = re.compile(
    r"(?<!\d)(?P<n>\d{1,18})/(?P<total>\d{1,18}|\?)\s{0,8}\[(?P<inside>[^\]]{0,256})\]"
)
_RATE = re.compile(r"(?<![\d.])(?P<rate>[\d.]{1,32})\s{0,8}(?P<unit>[A-Za-z]{1,16})/s\b")
_INV_RATE = re.compile(r"(?<![\d.])(?P<inv>[\d.]{1,32})\s{0,8}s/(?P<unit>[A-Za-z]{1,16})\b")
# PrinterCallback prints raw floats, so a NaN loss appears as a bare ``nan`` token, which
# ast.literal_eval rejects; quote those tokens first.
_BARE = re.compile(r"(?<=: )(-?inf|nan)(?=[,}])")
_RENAME = {"learning_rate": "lr", "train_loss": "loss"}
_NESTED = "\x1b[A"  # tqdm's cursor-up after a bar drawn below another (position > 0)
_NOT_TRAINING = ("Validation", "Sanity Checking", "Testing", "Predicting", "Evaluating")
_EPOCH = re.compile(r"\s{0,8}Epoch (?P<epoch>\d{1,9})\s{0,8}:")
# a postfix's loss: ", train_loss=2.38" (Lightning's prog_bar metrics) or ", loss=0.3"
_POSTFIX_LOSS = re.compile(
    r"(?:^|[ ,])(?:train_)?loss="
    r"(?P<loss>-?\d{1,24}(?:\.\d{1,24})?(?:e[-+]?\d{1,4})?|nan|inf)(?=[,\]]|\s|$)"
)
_STEP_KEYS = ("step", "global_step")

# What a line gives, in its order: train figures (None where not finite), ``step``, ``summary``
# (a Trainer's end-of-training dict), ``nonfinite`` (figure -> "nan", "inf" or "-inf").
Found = dict[str, float | int | bool | dict[str, str] | None]


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


def _dict_text(text: str) -> str | None:
    """The dict a line holds: from the first "{'" that starts a key to the line's last "}"."""
    end = text.rfind("}")
    start = -1
    for _ in range(_DICT_TRIES):
        start = text.find("{'", start + 1)
        if start < 0 or start > end:
            return None
        if _DICT_KEY.match(text, start):
            break
    else:
        return None
    if end + 1 - start > MAX_DICT:
        return None
    return text[start : end + 1]


def parse_hf_dict(text: str) -> Found | None:
    found = _dict_text(text)
    if found is None:
        return None
    try:
        obj = ast.literal_eval(_BARE.sub(r"'\1'", found))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    out: Found = {}
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
    if not out or not _training_log(out):
        return None
    # A Trainer summary ('train_runtime', ...) is not a step record; keep it but mark it.
    if "train_runtime" in out:
        out["summary"] = True
    for key in _STEP_KEYS:
        if key in out:
            step = out.pop(key)
            if not isinstance(step, (int, float)):  # not finite: no step to count from
                raise TypeError(f"step {step!r}")
            out["step"] = int(step)
            break
    if nonfinite:
        out["nonfinite"] = nonfinite
    return out


def _training_log(found: Found) -> bool:
    """A dict reads as a training log when it gives a loss (``loss``, ``train_loss``,
    ``eval_loss``, ...) or an ``epoch``, as every dict HF's Trainer prints does; a printed config
    (``{'eos_token_id': 0, 'bos_token_id': 0}``, ``{'lr': 3e-4, 'batch_size': 64}``) does not."""
    return any(_is_loss(key) or key == "epoch" for key in found)


def _is_loss(key: str) -> bool:
    return key == "loss" or key.endswith("_loss") or key.startswith("loss_")


def parse_tqdm(text: str) -> Found | None:
    # The last carriage-return segment is what the terminal would show.
    for segment in reversed(text.split("\r")):
        if "|" not in segment and "it/s" not in segment and "s/it" not in segment:
            continue
        segment = segment[-MAX_EXAMINED:]  # the counters and rate end a bar
        match = _TQDM.search(segment)
        if match is None or _NESTED in segment[match.end() : match.end() + 8]:
            continue  # a bar below the training bar: evaluation, not training
        head = segment[: match.start()].lstrip()
        if head.startswith(_NOT_TRAINING):
            return None
        step = int(match.group("n"))
        out: Found = {"step": step}
        total = match.group("total")
        epoch = _EPOCH.match(head)
        if epoch is not None and total != "?":
            # Lightning's count starts again each epoch: the step counts on across epochs.
            out["epoch"] = int(epoch.group("epoch"))
            out["step"] = step + int(epoch.group("epoch")) * int(total)
        elif total != "?":
            out["total_steps"] = int(total)
        inside = match.group("inside")
        loss = _POSTFIX_LOSS.search(inside)
        if loss is not None:
            value = float(loss.group("loss"))
            out["loss"] = value if math.isfinite(value) else None
            if not math.isfinite(value):
                out["nonfinite"] = {"loss": loss.group("loss")}
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


def worth_parsing(line: str) -> bool:
    """Whether ``parse_line`` could find anything in ``line`` (a linear test, for the caller's
    thread; the parse itself runs on telemetry's own)."""
    # One byte first: a memchr for "{" and "/" is what most lines cost (a rank writing 100 MB
    # paid 0.09 s of the supervisor's CPU for the two-character search alone).
    return ("{" in line and "{'" in line) or (
        "/" in line and ("it/s" in line or "s/it" in line or "%|" in line)
    )


def parse_line(line: str) -> Found | None:
    """Train scalars found in one line of rank output, or None (the common, cheap case)."""
    if "{'" in line:
        found = parse_hf_dict(line)
        if found is not None:
            return found
    if "/" in line and ("it/s" in line or "s/it" in line or "%|" in line):
        return parse_tqdm(line)
    return None
