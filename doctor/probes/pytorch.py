"""torch's facts (version, CUDA build, NCCL, pip toolkits) from the interpreter under test.

The work happens in another process: the interpreter given by `xl doctor --python` may not have xl
installed, and the doctor never imports torch itself. The stdlib-only script torch_probe.py is
read from beside this file and run with `-c`, so the interpreter's sys.path[0] is the working
folder as for any `python -c`, never this package's folder (whose modules would shadow others).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

from xl.doctor.facts import TorchInfo
from xl.doctor.probes.commands import CMD_TIMEOUT, run_cmd

PROBE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_probe.py")


def probe_torch(python: str, env: Mapping[str, str] | None = None) -> TorchInfo:
    """Run the probe script in `python`; its problems (a hang, a crash, a broken torch) come back
    in TorchInfo.problem. Only a missing probe script raises (a broken xl install)."""
    info = TorchInfo(python=python)
    with open(PROBE_SCRIPT, encoding="utf-8") as fh:
        source = fh.read()
    res = run_cmd(
        [python, "-c", source],
        timeout=CMD_TIMEOUT,
        env=env,
        label=f"{os.path.basename(python)} -c <torch probe>",
    )
    if not res.ok:
        info.problem = res.problem
        return info
    lines = [ln for ln in res.stdout.strip().splitlines() if ln.startswith("{")]
    try:
        data = json.loads(lines[-1])
    except (ValueError, IndexError):
        info.problem = (
            f"{python} printed something that is not the probe's answer: {res.first_line()!r}"
        )
        return info
    return torch_info(data, python)


def probe_torch_here() -> TorchInfo:
    """The same facts for this interpreter, without a subprocess (~50 ms less): the probe only
    finds torch and reads its version.py, so running it here imports no torch either."""
    from xl.doctor.probes import torch_probe  # noqa: PLC0415 - only a launch on GPUs needs it

    return torch_info(json.loads(json.dumps(torch_probe.probe())), sys.executable)


def _text(data: Mapping[str, object], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) else None


def _rows(data: Mapping[str, object], key: str, width: int) -> list[list[str]]:
    """The `width`-long lists under `key`, as text (anything else in the answer is left out)."""
    rows = data.get(key)
    if not isinstance(rows, list):
        return []
    return [[str(v) for v in x] for x in rows if isinstance(x, list) and len(x) == width]


def torch_info(data: Mapping[str, object], python: str) -> TorchInfo:
    """TorchInfo from the probe's answer (a JSON object), checking every field's type."""
    info = TorchInfo(python=python)
    info.python = _text(data, "python") or python
    info.bin_dir = _text(data, "bin_dir")
    info.problem = _text(data, "problem")
    info.location = _text(data, "location")
    info.found = bool(info.location)
    info.version = _text(data, "version")
    info.cuda = _text(data, "cuda")
    info.hip = _text(data, "hip")
    info.nccl = _text(data, "nccl")
    info.nccl_from = _text(data, "nccl_from")
    ptxas = data.get("pip_ptxas")
    info.pip_ptxas = [x for x in ptxas if isinstance(x, str)] if isinstance(ptxas, list) else []
    info.pip_libs = [(a, b, c) for a, b, c in _rows(data, "pip_libs", 3)]
    info.nccl_wheels = [(a, b) for a, b in _rows(data, "nccl_wheels", 2)]
    req = data.get("nccl_required")
    info.nccl_required = (
        (str(req[0]), str(req[1])) if isinstance(req, list) and len(req) == 2 else None
    )
    info.pip_toolkits = [(a, b) for a, b in _rows(data, "pip_toolkits", 2)]
    info.requires = _names(data, "requires")
    info.nvidia_dists = _names(data, "nvidia_dists")
    return info


def _names(data: Mapping[str, object], key: str) -> dict[str, str]:
    """{name: version} under `key`, as text (anything else in the answer is left out)."""
    value = data.get(key)
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items() if isinstance(v, str)}
