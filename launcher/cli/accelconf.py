"""Read an existing Accelerate config (``accelerate config`` output) into launch settings.

PyYAML is not a dependency of xl; when it is missing, the flat ``key: value`` form Accelerate
writes is read by a small parser (nested sections such as ``fsdp_config`` are skipped: xl does
not use them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xl.address import format_address
from xl.errors import UsageError


def default_path() -> Path:
    hf_home = os.environ.get("HF_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache", "huggingface"
    )
    return Path(hf_home) / "accelerate" / "default_config.yaml"


@dataclass
class AccelerateSettings:
    nproc: int | None = None  # per node
    gpus: str | None = None
    mixed_precision: str | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    rdzv: str | None = None


def _scalar(text: str) -> Any:
    text = text.strip()
    if " #" in text:
        text = text.split(" #", 1)[0].rstrip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "~", ""):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_flat_yaml(text: str) -> dict[str, object]:
    """Top-level ``key: scalar`` pairs of a YAML mapping; nested blocks are ignored."""
    out: dict[str, object] = {}
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#") or raw[0] in " \t-":
            continue
        key, sep, value = raw.partition(":")
        if sep:
            out[key.strip()] = _scalar(value)
    return out


def load_config(path: Path) -> dict[str, object]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(
            f"no Accelerate config at {path} (run 'accelerate config' or give a path)"
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot read Accelerate config {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)  # `accelerate config default` may write JSON
    except ValueError:
        try:
            import yaml  # noqa: PLC0415 - PyYAML is optional (not a dependency); the flat reader stands in
        except ImportError:
            data = parse_flat_yaml(text)
        else:
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise UsageError(
                    f"Accelerate config {path} is not valid YAML: {str(exc).splitlines()[0]}"
                ) from None
    if not isinstance(data, dict):
        raise UsageError(f"Accelerate config {path} is not a mapping of settings")
    return data


def _int(data: Mapping[str, object], key: str, path: Path) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    try:
        if not isinstance(value, (int, float, str)):
            raise TypeError(key)
        return int(value)
    except (TypeError, ValueError):
        raise UsageError(
            f"Accelerate config {path}: {key} should be a number, not {value!r}"
        ) from None


def read_settings(path: Path) -> AccelerateSettings:
    data = load_config(path)
    out = AccelerateSettings()
    machines = _int(data, "num_machines", path)
    total = _int(data, "num_processes", path)
    if machines is not None and machines >= 1:
        out.nnodes = machines
    # Accelerate's num_processes counts every machine; torchrun wants the per-node count.
    if total is not None and total >= 1:
        out.nproc = max(1, total // (out.nnodes or 1))
    gpu_ids = data.get("gpu_ids")
    if gpu_ids is not None and not data.get("use_cpu"):
        out.gpus = str(gpu_ids).strip() or None
    mp = data.get("mixed_precision")
    if mp is not None:
        out.mixed_precision = str(mp)
    out.node_rank = _int(data, "machine_rank", path)
    ip, port = data.get("main_process_ip"), data.get("main_process_port")
    if ip and port and (out.nnodes or 1) > 1:
        out.rdzv = format_address(str(ip), str(port))
    return out
