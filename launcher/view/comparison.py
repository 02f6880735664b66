"""Two runs side by side: what changed between them, their speed, their loss, where their time went.

``xl compare A B --json`` prints ``Comparison.doc``; the app's Compare screen draws it with the two
runs' series (loss and samples/s over steps). Everything comes from run.json and the runs'
digests (xl.launcher.view.digest), so it answers at once whatever the runs' size.
docs/compare.md describes every key.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xl.errors import UsageError
from xl.figures import PHASES
from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.runrecord import RunRecord
from xl.launcher.view import digest, timing

# An environment variable whose name says it holds a secret: its value is never shown (as `ps`
# shows no secret of a run: xl passes them in the environment, never on a command line).
SECRET_NAME = re.compile(r"token|key|secret|passw|credential|auth", re.IGNORECASE)
MASK = "****"
_VERSIONS = ("torch", "cuda", "driver", "xl", "git")


def _target(rec: RunRecord) -> str | None:
    spec = rec.spec
    if spec.get("script"):
        return str(spec["script"])
    return f"-m {spec['module']}" if spec.get("module") else None


def facts(rec: RunRecord) -> dict[str, object]:
    """What ``changed`` compares, by its name there (``env.K`` one entry per variable)."""
    spec = rec.spec
    versions = rec.versions
    out: dict[str, object] = {
        "script": _target(rec),
        "args": [str(a) for a in spec.get("args") or []],
        "nproc": rec.nproc_per_node,
        "nodes": rec.nnodes,
        "gpus": [d.index for d in rec.devices],
        "gpu_models": [d.name for d in rec.devices],
        "mixed_precision": spec.get("mixed_precision"),
        "max_restarts": spec.get("max_restarts"),
        "python": spec.get("python"),
    }
    out.update({name: versions.get(name) for name in _VERSIONS})
    for key, value in sorted(rec.rank_env.items()):
        out[f"env.{key}"] = value
    return out


def changed(a: RunRecord, b: RunRecord) -> list[dict[str, object]]:
    """Each fact that differs; a secret that differs is listed with both values masked."""
    fa, fb = facts(a), facts(b)
    names = list(fa) + [k for k in fb if k not in fa]
    out = []
    for k in names:
        va, vb = fa.get(k), fb.get(k)
        if va == vb:
            continue
        if k.startswith("env.") and SECRET_NAME.search(k):
            va, vb = (None if va is None else MASK), (None if vb is None else MASK)
        out.append({"what": k, "a": va, "b": vb})
    return out


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """How much faster B is than A: samples/s B over A, else step time A over B."""
    if a.get("samples_per_s") and b.get("samples_per_s"):
        return round(b["samples_per_s"] / a["samples_per_s"], 4)
    if a.get("step_s") and b.get("step_s"):
        return round(a["step_s"] / b["step_s"], 4)
    return None


def _rounded(speed: Any) -> dict[str, Any]:
    speed = speed if isinstance(speed, dict) else {}
    return {
        k: (round(v, 6) if isinstance(v, (int, float)) else None)
        for k in ("step_s", "samples_per_s")
        for v in [speed.get(k)]
    }


def _series(d: dict[str, Any]) -> dict[str, list[Any]]:
    return {k: list(d.get(k) or []) for k in ("steps", "loss", "samples_per_s")}


@dataclass
class Comparison:
    doc: dict[str, Any]  # what `xl compare --json` prints
    series: dict[str, dict[str, list[Any]]]  # "a"/"b": steps, loss, samples_per_s (for charts)
    names: dict[str, str | None]  # "a"/"b": each run's name
    status: dict[str, str]


def load_run(run_dir: Path) -> RunRecord:
    rec = record.load(run_dir)
    if rec is None:
        raise UsageError(
            f"run {run_dir.name}: its run.json is damaged or missing, so it cannot be compared"
        )
    return rec


def compare(dir_a: Path, dir_b: Path) -> Comparison:
    """UsageError (one line for a person) when the two are one run or one cannot be read."""
    if os.path.realpath(dir_a) == os.path.realpath(dir_b):
        raise UsageError(f"both arguments name run {dir_a.name}: give two different runs")
    a, b = load_run(dir_a), load_run(dir_b)
    da, db = digest.load(dir_a, a), digest.load(dir_b, b)
    sa, sb = _series(da), _series(db)
    loss_a = {s: v for s, v in zip(sa["steps"], sa["loss"], strict=False) if v is not None}
    loss_b = {s: v for s, v in zip(sb["steps"], sb["loss"], strict=False) if v is not None}
    common = sorted(set(loss_a) & set(loss_b))
    speed_a, speed_b = _rounded(da.get("speed")), _rounded(db.get("speed"))
    doc = {
        "runs": [a.run_id, b.run_id],
        "changed": changed(a, b),
        "speed": {"a": speed_a, "b": speed_b, "ratio": _ratio(speed_a, speed_b)},
        "loss": {
            "steps": common,
            "a": [loss_a[s] for s in common],
            "b": [loss_b[s] for s in common],
        },
        "time": {"a": a.time or da.get("time"), "b": b.time or db.get("time")},
        "split": {"a": timing.run_split(da.get("ranks")), "b": timing.run_split(db.get("ranks"))},
        "failure": {"a": _failure(a), "b": _failure(b)},
    }
    return Comparison(
        doc, {"a": sa, "b": sb}, {"a": a.name, "b": b.name}, {"a": a.status, "b": b.status}
    )


def _failure(rec: RunRecord) -> dict[str, Any] | None:
    """A failed run's root cause as ``xl compare`` shows it: the rank and its cause."""
    failure = rec.failure
    if failure is None:
        return None
    cause = failure.cause.to_json() if failure.cause is not None else None
    return {
        "rank": failure.rank,
        "node_rank": failure.node_rank,
        "message": failure.message,
        "cause": cause,
    }


def _failure_cell(failure: dict[str, Any] | None) -> str:
    if failure is None:
        return "-"
    cause = failure.get("cause")
    who = f"rank {failure['rank']}" if failure.get("rank") is not None else "no rank"
    return show(
        f"{who}: {cause['kind']}: {cause['summary']}" if cause else f"{who}: {failure['message']}",
        60,
    )


def show(value: object, width: int = 40) -> str:
    """A value as the tables show it (lists joined; long ones cut)."""
    if value is None:
        text = "-"
    elif isinstance(value, list):
        text = " ".join(str(v) for v in value) if value else "(none)"
    else:
        text = str(value)
    return text if len(text) <= width else text[: width - 1] + "~"


def _rate(v: Any) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


def _ms(v: Any) -> str:
    return (
        "-" if not isinstance(v, (int, float)) else f"{v * 1000:.1f} ms" if v < 10 else f"{v:.1f} s"
    )


LOSS_ROWS = 8  # loss at this many of the common steps, spread over them


def rows(c: Comparison) -> list[tuple[str, str, str]]:
    """The side-by-side table, (label, A, B) per row; a section's title row has empty cells."""
    doc = c.doc
    out: list[tuple[str, str, str]] = [
        ("run", doc["runs"][0], doc["runs"][1]),
        ("name", show(c.names["a"]), show(c.names["b"])),
        ("status", c.status["a"], c.status["b"]),
        ("failure", _failure_cell(doc["failure"]["a"]), _failure_cell(doc["failure"]["b"])),
        ("changed", "", ""),
    ]
    out += [(f"  {ch['what']}", show(ch["a"]), show(ch["b"])) for ch in doc["changed"]] or [
        ("  (nothing)", "", "")
    ]
    speed = doc["speed"]
    ratio = speed["ratio"]
    out += [
        ("speed", "", "" if ratio is None else f"B is {ratio:.2f}x A"),
        ("  step time", _ms(speed["a"]["step_s"]), _ms(speed["b"]["step_s"])),
        ("  samples/s", _rate(speed["a"]["samples_per_s"]), _rate(speed["b"]["samples_per_s"])),
    ]
    steps = doc["loss"]["steps"]
    out.append((f"loss ({len(steps)} steps)", "", ""))  # at the steps both runs logged
    picks = (
        sorted({round(i * (len(steps) - 1) / (LOSS_ROWS - 1)) for i in range(LOSS_ROWS)})
        if steps
        else []
    )
    out += [
        (f"  step {steps[i]:g}", f"{doc['loss']['a'][i]:.4g}", f"{doc['loss']['b'][i]:.4g}")
        for i in picks
    ]
    split = doc.get("split") or {}
    ca, cb = timing.split_cells(split.get("a")), timing.split_cells(split.get("b"))
    if ca or cb:  # where a step's time went, per step, the mean over each run's ranks
        out.append(("step split (mean of ranks)", "", ""))
        out += [
            (f"  {label}", ca[i] if ca else "-", cb[i] if cb else "-")
            for i, label in enumerate(("step", *PHASES))
        ]
    out.append(("time", "", ""))
    ta, tb = timing.rows(doc["time"]["a"]), timing.rows(doc["time"]["b"])
    out += [(f"  {ka}", va or "-", vb or "-") for (ka, va), (_kb, vb) in zip(ta, tb, strict=True)]
    return out
