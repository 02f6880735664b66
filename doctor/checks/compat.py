"""Which libcuda.so.1 a CUDA process loads, and what that means for the driver's CUDA.

NVML reports the kernel module's driver and its CUDA. The user-space driver that actually loads
(libcuda.so.1) is the first one the loader finds: LD_LIBRARY_PATH's folders first, then the
ldconfig cache. When that is NVIDIA's forward-compatibility package (cuda-compat, e.g.
/usr/local/cuda-12.8/compat/libcuda.so.570.86.10) on an older kernel module, CUDA runs at the
package's version, not NVML's; a libcuda older than the kernel module fails cuInit with
CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803), and forward compatibility on a GeForce GPU fails with
CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE (804): NVIDIA supports it on data-center GPUs only
(https://docs.nvidia.com/deploy/cuda-compatibility/).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from xl.doctor.facts import Facts, vtuple
from xl.doctor.tables import cuda_of_driver

# A driver's version has a three-digit branch (libcuda.so.570.86.10); WSL2's libcuda.so.1.1
# (in /usr/lib/wsl/lib) is no driver version and is not compared with the kernel module's.
_VERSIONED = re.compile(r"^libcuda\.so\.(\d{3,}\.\d+(?:\.\d+)?)$")


@dataclass(frozen=True)
class Libcuda:
    path: str  # the real file
    version: str  # its driver version, from the file name
    source: str  # LD_LIBRARY_PATH | ldconfig
    folder: str  # the LD_LIBRARY_PATH entry (or cache folder) it comes from

    @property
    def cuda(self) -> str | None:
        return cuda_of_driver(self.version)


def loaded_libcuda(f: Facts) -> Libcuda | None:
    """The libcuda.so.1 the loader picks, when its file name tells its version."""
    found: tuple[str, str, str] | None = None
    entry = next((e for e in f.ld_entries if e.libcuda), None)
    if entry is not None and entry.libcuda:
        found = (entry.libcuda, "LD_LIBRARY_PATH", entry.path)
    elif f.ldconfig.get("libcuda.so.1"):
        first = f.ldconfig["libcuda.so.1"][0]
        found = (os.path.realpath(first), "ldconfig", os.path.dirname(first))
    if found is None:
        return None
    m = _VERSIONED.match(os.path.basename(found[0]))
    return Libcuda(found[0], m.group(1), found[1], found[2]) if m else None


def driver_mismatch(f: Facts) -> Libcuda | None:
    """The loaded libcuda when it is not the kernel module's own version."""
    d = f.driver
    lib = loaded_libcuda(f)
    if lib is None or d is None or d.error or not d.version:
        return None
    return lib if vtuple(lib.version) != vtuple(d.version) else None


def forward_compat(f: Facts) -> Libcuda | None:
    """The forward-compatibility libcuda in use (newer than the kernel module), if any."""
    lib = driver_mismatch(f)
    d = f.driver
    return (
        lib
        if lib is not None and d is not None and vtuple(lib.version) > vtuple(d.version)
        else None
    )


def unusable(f: Facts) -> Libcuda | None:
    """The loaded libcuda when it cannot work here: older than the kernel module (803), or
    forward compatibility on a GeForce GPU (804)."""
    lib = driver_mismatch(f)
    d = f.driver
    if lib is None or d is None:
        return None
    if vtuple(lib.version) < vtuple(d.version):
        return lib
    geforce = any("GeForce" in g.name for g in f.gpus if not g.lost)
    return lib if geforce else None


def ldconfig_fix(lib: Libcuda) -> str:
    """The command that takes this libcuda's folder out of the ldconfig cache."""
    return f"sudo sed -i '\\|^{lib.folder}/*$|d' /etc/ld.so.conf.d/*.conf && sudo ldconfig"
