"""What a node sends, made to fit what node 0 takes (``protocol.parse_message`` checks it there):
the threads, frames and collectives of its stacks entries, and the texts of its failure, clipped
on the sending node so that a big answer still arrives instead of being refused whole."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from xl.launcher.multinode.protocol import (
    CLIPPED,
    MAX_COLLECTIVES,
    MAX_EVIDENCE,
    MAX_FIELD_TEXT,
    MAX_FRAMES,
    MAX_STACKS_LINE,
    MAX_STACKS_TEXT,
    MAX_TEXT,
    MAX_THREADS,
    SHAPE_KEYS,
    is_shapes,
)


def _clip_text(value: Any) -> Any:
    if type(value) is str and len(value) > MAX_STACKS_TEXT:
        # a path's tail names it
        return CLIPPED + value[len(value) - (MAX_STACKS_TEXT - len(CLIPPED)) :]
    return value


def clip_stacks(entries: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """This node's entries within what node 0 takes (parse_message): the first threads (the main
    thread leads), each one's innermost frames, the newest collectives. When they are still too
    big for one frame, the main thread alone, then no frames at all (the entry says so)."""
    out: list[dict[str, Any]] = []  # JSON values, as the wire carries them
    for entry in entries:
        clipped: dict[str, Any] = {
            k: _clip_text(v)
            for k, v in entry.items()
            if k not in ("threads", "collectives") and type(v) is not dict
        }
        if "threads" in entry:
            clipped["threads"] = [
                {
                    "name": _clip_text(str(t.get("name"))),
                    "frames": [
                        {k: _clip_text(v) for k, v in f.items()}
                        for f in (t.get("frames") or [])[-MAX_FRAMES:]
                    ],
                }
                for t in _items(entry.get("threads"))[:MAX_THREADS]
            ]
            clipped["collectives"] = [
                _clip_collective(c) for c in _items(entry.get("collectives"))[-MAX_COLLECTIVES:]
            ]
        out.append(clipped)
    for keep in (MAX_THREADS, 1, 0):
        if len(json.dumps(out, default=str)) <= MAX_STACKS_LINE:
            break
        for entry in out:
            if "threads" in entry:
                entry["threads"] = entry["threads"][:keep]
                if not keep:
                    entry.pop("threads")
                    entry.pop("collectives", None)
                    entry["error"] = (
                        "its stacks were too big to send to node 0; 'xl stacks RUN' on its node "
                        "shows them"
                    )
    return list(out)


def _items(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _clip_collective(c: dict[str, Any]) -> dict[str, Any]:
    """A collective as node 0 takes it: texts clipped, shapes kept only when node 0 can hold them
    (without them the verdict compares the op alone)."""
    return {k: _clip_text(v) for k, v in c.items() if k not in SHAPE_KEYS or is_shapes(v)}


def clip_failure(failure: Mapping[str, object]) -> dict[str, object]:
    """A copy of ``failure`` within what node 0 takes (parse_message): the head of long texts
    (message, error), the tail of the traceback (where the exception is)."""
    out = dict(failure)
    for key, value in failure.items():
        if type(value) is not str:
            continue
        if key == "traceback":
            if len(value) > MAX_TEXT:
                out[key] = CLIPPED + value[len(value) - (MAX_TEXT - len(CLIPPED)) :]
        elif len(value) > MAX_FIELD_TEXT:
            out[key] = value[: MAX_FIELD_TEXT - len(CLIPPED)] + CLIPPED
    cause = failure.get("cause")
    if isinstance(cause, dict):  # its texts and its evidence as _check_failure takes them
        clipped: dict[str, object] = {
            k: (_clip(v) if isinstance(v, str) else v) for k, v in cause.items() if k != "evidence"
        }
        evidence = cause.get("evidence")
        clipped["evidence"] = (
            [_clip(str(x)) for x in evidence[:MAX_EVIDENCE]] if isinstance(evidence, list) else []
        )
        out["cause"] = clipped
    return out


def _clip(text: str) -> str:
    return (
        text if len(text) <= MAX_FIELD_TEXT else text[: MAX_FIELD_TEXT - len(CLIPPED)] + CLIPPED
    )
