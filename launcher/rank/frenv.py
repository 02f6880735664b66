"""The Flight Recorder's buffer variable, by the name the rank's own torch reads (stdlib only).

Gloo and NCCL record collectives only with a buffer, set before torch starts. torch renamed the
variable: ``TORCH_NCCL_TRACE_BUFFER_SIZE`` became ``TORCH_FR_BUFFER_SIZE``, and a torch that
reads the new name warns "TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated" into every rank's log when
the old one is set (torch 2.13: c10d's FlightRecorder.hpp reads both, the old one with a warning).
So the rank sets only the name its torch reads, found in torch's own files without importing it
(the rank entry runs before user code, and importing torch costs a second).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import MutableMapping

NEW = "TORCH_FR_BUFFER_SIZE"
OLD = "TORCH_NCCL_TRACE_BUFFER_SIZE"
# Where a torch that knows the new name says so: the C++ header (shipped in wheels' include/),
# else the Python side of c10d (which reads it for torchcomms).
_SOURCES = (
    os.path.join("include", "torch", "csrc", "distributed", "c10d", "FlightRecorder.hpp"),
    os.path.join("distributed", "distributed_c10d.py"),
)


def torch_dir() -> str | None:
    """The folder of the torch this interpreter would import (None: no torch)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    return os.path.dirname(origin) if origin else None


def reads_new_name(folder: str) -> bool:
    """Whether the torch in ``folder`` reads TORCH_FR_BUFFER_SIZE."""
    for rel in _SOURCES:
        try:
            with open(os.path.join(folder, rel), "rb") as fh:
                if NEW.encode() in fh.read():
                    return True
        except OSError:
            continue
    return False


def set_buffer(env: MutableMapping[str, str], size: str, folder: str | None = None) -> str | None:
    """Set the buffer size under the one name the torch reads; the person's own setting (either
    name) stands. Returns the name set, None when nothing was."""
    if NEW in env or OLD in env:
        return None
    folder = torch_dir() if folder is None else folder
    if folder is None:
        return None  # no torch: nothing will record
    name = NEW if reads_new_name(folder) else OLD
    env[name] = size
    return name
