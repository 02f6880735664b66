"""Which CUDA libraries the dynamic loader would find: LD_LIBRARY_PATH's folders and the
ldconfig cache."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping

from xl.doctor.facts import LdEntry
from xl.doctor.probes.files import is_dir, is_file, which, why_not_a_folder

# The runtime's soname; its major is what a binary built against a toolkit asks the loader for.
CUDART = re.compile(r"^libcudart\.so\.(\d+)$")
# The libraries torch's pip wheels bring (see torch_probe.PIP_LIB), with the full version a
# toolkit's real file names carry (libnvJitLink.so.12.1.105).
# NCCL and cuDNN too, whose real files carry their own version (libnccl.so.2.21.5,
# libcudnn.so.9.1.0): what the `cuda_libraries` check compares with torch's pins.
CUDA_LIB = re.compile(
    r"^(lib(?:cudart|nvJitLink|cublas|cublasLt|cusparse|cusolver|cufft|curand|nvrtc|nccl|cudnn)\.so\.\d+)"
    r"(?:\.(\d+(?:\.\d+){0,3}))?$"
)


def scan_ld_library_path(value: str | None) -> list[LdEntry]:
    entries: list[LdEntry] = []
    if value is None:
        return entries
    for raw in value.split(":"):
        entry = LdEntry(path=raw, real=os.path.realpath(raw) if raw else "")
        if raw == "":
            entry.exists = False
            entries.append(entry)
            continue
        if not os.path.exists(raw):
            entry.exists = False
            entry.why = why_not_a_folder(raw)
        elif not is_dir(raw):
            entry.is_dir = False
            entry.why = why_not_a_folder(raw)
        else:
            try:
                names = os.listdir(raw)
            except OSError as exc:
                entry.problem = exc.strerror or str(exc)
                names = []
            for name in names:
                lib = CUDA_LIB.match(name)
                if lib:
                    soname = lib.group(1)
                    # libcusparse.so.12.1.0.106 -> 12.1.0.106
                    rest = lib.group(2)
                    full = f"{soname.rsplit('.', 1)[1]}.{rest}" if rest else None
                    if full or soname not in entry.cuda_libs:
                        entry.cuda_libs[soname] = full
                if name == "libcuda.so.1":
                    entry.libcuda = os.path.realpath(os.path.join(raw, name))
                if CUDART.match(name):
                    entry.cudart.append(name)
                elif name.startswith("libnccl.so"):
                    entry.nccl.append(name)
                elif name.startswith("libcudnn.so"):
                    entry.cudnn.append(name)
            entry.cudart.sort()
        entries.append(entry)
    return entries


_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(.+?)\s*$")
_LD_INTEREST = (
    "libcudart.so",
    "libnccl.so",
    "libcuda.so",
    "libnvidia-ml.so",
    "libcudnn.so",
    "libcublas.so",
    "libnccl-net",
)
# The ABI word ldconfig prints for 64-bit libraries ("libc6,x86-64", "libc6,AArch64", ...).
_LD_64BIT = ("x86-64", "AArch64", "64bit", "IA-64")


def parse_ldconfig(text: str, bits64: bool = sys.maxsize > 2**32) -> dict[str, list[str]]:
    """`ldconfig -p` -> {soname: [paths in cache order]} for the CUDA libraries. A 64-bit
    process can't load the 32-bit copies (the driver's i386 libcuda.so.1, say), so those are
    left out; when no line carries a 64-bit ABI word (another architecture), all are kept."""
    rows: list[tuple[str, bool, str]] = []
    for line in text.splitlines():
        m = _LDCONFIG_LINE.match(line)
        if m and m.group(1).startswith(_LD_INTEREST):
            flags = [f.strip() for f in m.group(2).split(",")]
            rows.append((m.group(1), any(f in _LD_64BIT for f in flags), m.group(3)))
    if bits64 and any(is64 for _, is64, _ in rows):
        rows = [r for r in rows if r[1]]
    out: dict[str, list[str]] = {}
    for name, _, path in rows:
        out.setdefault(name, []).append(path)
    return out


def find_ldconfig(env: Mapping[str, str]) -> str | None:
    return which("ldconfig", env.get("PATH")) or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if is_file(p)), None
    )


def lib_version(path: str) -> tuple[str, str | None] | None:
    """(soname, full version) of a CUDA library file, the version read off the name of the file
    it resolves to (libnccl.so.2 -> libnccl.so.2.21.5: "2.21.5"); None for other files."""
    for name in (os.path.basename(os.path.realpath(path)), os.path.basename(path)):
        m = CUDA_LIB.match(name)
        if m and m.group(2):
            soname = m.group(1)
            return soname, f"{soname.rsplit('.', 1)[1]}.{m.group(2)}"
    m = CUDA_LIB.match(os.path.basename(path))
    return (m.group(1), None) if m else None


# Where the loader looks for a library named without a folder after LD_LIBRARY_PATH, for the
# distributions' usual layouts (the ldconfig cache lists these).
_SYSTEM_LIB_DIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
)


def scan_preload(
    value: str | None, ld_value: str | None = None
) -> list[tuple[str, str, str | None]]:
    """(entry, soname, version) of each CUDA library LD_PRELOAD names (split on spaces and
    colons, as the loader does); the loader takes these before anything else. An entry without a
    folder (`libnccl.so.2`) is found as the loader finds it: LD_LIBRARY_PATH's folders, then the
    system's."""
    out: list[tuple[str, str, str | None]] = []
    folders = [d for d in (ld_value or "").split(":") if d] + list(_SYSTEM_LIB_DIRS)
    for raw in re.split(r"[\s:]+", value or "")[:64]:
        if not raw:
            continue
        path = raw
        if "/" not in raw:
            path = next(
                (os.path.join(d, raw) for d in folders if is_file(os.path.join(d, raw))), ""
            )
        found = lib_version(path) if path else None
        if found is not None and is_file(path):
            out.append((raw, found[0], found[1]))
    return out


def cache_versions(cache: dict[str, list[str]]) -> dict[str, str]:
    """soname -> the full version of the file the ldconfig cache's first entry resolves to."""
    out: dict[str, str] = {}
    for soname, paths in cache.items():
        found = lib_version(paths[0]) if paths else None
        if found is not None and found[1]:
            out[soname] = found[1]
    return out


def find_net_plugin(
    value: str | None, ld_value: str | None, cache: dict[str, list[str]]
) -> tuple[str, str | None] | None:
    """(the library NCCL_NET_PLUGIN makes NCCL dlopen, where the loader finds it or None).
    NCCL opens libnccl-net-<value>.so (a value that is a file name or path: as it is)."""
    value = (value or "").strip()
    if not value or value.lower() == "none":
        return None
    name = value if "/" in value or value.endswith(".so") else f"libnccl-net-{value}.so"
    if "/" in name:
        return name, (name if is_file(name) else None)
    for folder in [
        *(ld_value or "").split(":"),
        "/lib",
        "/usr/lib",
        "/lib64",
        "/usr/lib64",
        "/usr/local/lib",
    ]:
        if folder and is_file(os.path.join(folder, name)):
            return name, os.path.join(folder, name)
    hit = cache.get(name)
    return name, (hit[0] if hit else None)
