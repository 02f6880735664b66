"""The Launch form's memory: the last settings used for each script, in the user config dir."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xl.atomic import write_json_atomic
from xl.paths import config_dir

FILE_NAME = "launch.json"
# Enough to remember every script a person uses without the file growing forever.
MAX_SCRIPTS = 50


def _path() -> Path:
    return config_dir() / FILE_NAME


def _load() -> dict[str, Any]:
    try:
        data = json.loads(_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"scripts": {}, "last": None}
    if not isinstance(data, dict) or not isinstance(data.get("scripts"), dict):
        return {"scripts": {}, "last": None}
    return data


def last_target() -> str | None:
    value = _load().get("last")
    return value if isinstance(value, str) else None


def recall(target: str) -> dict[str, object] | None:
    """The form values last launched with ``target`` (a script path or ``-m module``)."""
    value = _load()["scripts"].get(target)
    return value if isinstance(value, dict) else None


def remember(target: str, values: Mapping[str, str]) -> None:
    data = _load()
    scripts: dict[str, Any] = data["scripts"]
    scripts.pop(target, None)
    scripts[target] = dict(values)  # insertion order = recency
    while len(scripts) > MAX_SCRIPTS:
        scripts.pop(next(iter(scripts)))
    data["last"] = target
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data)
