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
from typing import Any

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


def torch_info(data: dict[str, Any], python: str) -> TorchInfo:
    """TorchInfo from the probe's answer (a JSON object), checking every field's type."""
    info = TorchInfo(python=python)
    info.python = data.get("python") or python
    info.bin_dir = data.get("bin_dir")
    info.problem = data.get("problem")
    info.location = data.get("location")
    info.found = bool(info.location)
    for key in ("version", "cuda", "hip", "nccl", "nccl_from"):
        value = data.get(key)
        setattr(info, key, value if isinstance(value, str) else None)
    info.pip_ptxas = [x for x in data.get("pip_ptxas") or [] if isinstance(x, str)]
    info.pip_libs = [
        (str(x[0]), str(x[1]), str(x[2]))
        for x in data.get("pip_libs") or []
        if isinstance(x, list) and len(x) == 3
    ]
    info.nccl_wheels = [
        (str(x[0]), str(x[1])) for x in data.get("nccl_wheels") or [] if isinstance(x, list) and len(x) == 2
    ]
    req = data.get("nccl_required")
    info.nccl_required = (str(req[0]), str(req[1])) if isinstance(req, list) and len(req) == 2 else None
    info.pip_toolkits = [
        tuple(x) for x in data.get("pip_toolkits") or [] if isinstance(x, list) and len(x) == 2
    ]
    return info
