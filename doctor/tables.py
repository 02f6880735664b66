"""Version knowledge the checks decide with: compiler limits, DeepSpeed's allow-lists, driver
floors.

Authoritative sources win: a toolkit's own include/crt/host_config.h beats the table below, which
only covers toolkits whose header is missing (e.g. a pip nvcc without the crt headers).
"""

from __future__ import annotations

import re

from xl.doctor.facts import vtuple

# Highest gcc major each nvcc accepts (NVIDIA's installation guides). Keys are inclusive
# (low, high) version ranges over (major, minor, patch). Not torch's table: it has been wrong
# (it rejected gcc 14 for CUDA 12.8).
GCC_MAX: tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...] = (
    ((11, 0, 0), (11, 0, 999), 9),
    ((11, 1, 0), (11, 4, 0), 10),
    ((11, 4, 1), (11, 8, 999), 11),
    ((12, 0, 0), (12, 3, 999), 12),
    ((12, 4, 0), (12, 6, 999), 13),
    ((12, 8, 0), (12, 9, 999), 14),
    ((13, 0, 0), (13, 2, 999), 15),
)
CLANG_MAX: tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...] = (
    ((11, 0, 0), (11, 0, 999), 9),
    ((11, 1, 0), (11, 1, 999), 10),
    ((11, 2, 0), (11, 3, 999), 11),
    ((11, 4, 0), (11, 5, 999), 12),
    ((11, 6, 0), (11, 8, 999), 13),
    ((12, 0, 0), (12, 2, 999), 14),
    ((12, 3, 0), (12, 3, 999), 16),
    ((12, 4, 0), (12, 5, 999), 17),
    ((12, 6, 0), (12, 6, 999), 18),
    ((12, 8, 0), (12, 9, 999), 19),
    ((13, 0, 0), (13, 2, 999), 20),
)

# nvcc of 11.4.0 reports V11.4.48; 11.4.1 is V11.4.100 and later.
_NVCC_BUILD_TO_PATCH: dict[tuple[int, ...], tuple[int, ...]] = {(11, 4, 48): (11, 4, 0)}


def compiler_max_from_table(kind: str, cuda_version: str | None) -> int | None:
    t = vtuple(cuda_version)
    if len(t) < 2:
        return None
    t = _NVCC_BUILD_TO_PATCH.get(t[:3], t[:3])
    if len(t) == 2:
        t = (*t, 0)
    for low, high, limit in GCC_MAX if kind == "gcc" else CLANG_MAX:
        if low <= t <= high:
            return limit
    return None


def parse_host_config(text: str) -> tuple[int | None, int | None, int | None, int | None]:
    """(gcc_min, gcc_max, clang_min, clang_max) from include/crt/host_config.h.

    The header checks each compiler with `#if <condition>` followed by `#error -- unsupported GNU
    version!` / `#error -- unsupported clang version!`; the condition names the bounds.
    """
    gcc_min = gcc_max = clang_min = clang_max = None
    last_if = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("#if", "#elif")):
            last_if = stripped
            continue
        if not stripped.startswith("#error"):
            continue
        low = stripped.lower()
        if "unsupported gnu version" in low:
            m = re.search(r"__GNUC__\s*>\s*(\d+)", last_if)
            if m:
                gcc_max = int(m.group(1))
            m = re.search(r"__GNUC__\s*<\s*(\d+)", last_if)
            if m:
                gcc_min = int(m.group(1))
        elif "unsupported clang version" in low and "hos clang" not in low and "grace" not in low:
            m = re.search(r"__clang_major__\s*>=\s*(\d+)", last_if)
            if m:
                clang_max = int(m.group(1)) - 1
            else:
                m = re.search(r"__clang_major__\s*>\s*(\d+)", last_if)
                if m:
                    clang_max = int(m.group(1))
            m = re.search(r"__clang_major__\s*<\s*(\d+)\)", last_if)
            if m and int(m.group(1)) > 3:
                clang_min = int(m.group(1))
    return gcc_min, gcc_max, clang_min, clang_max


# DeepSpeed's op builder accepts a minor mismatch between the toolkit and torch's CUDA only when
# both versions are in the same list (deepspeed/ops/op_builder/builder.py).
DEEPSPEED_MINOR_OK: dict[int, tuple[str, ...]] = {
    11: ("11.0", "11.1", "11.2", "11.3", "11.4", "11.5", "11.6", "11.7", "11.8"),
    12: ("12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8", "12.9"),
}


def deepspeed_verdict(toolkit: str, torch_cuda: str, skip_check: bool) -> str:
    """One sentence: what DeepSpeed's op builder does with this pair."""
    tk, tc = vtuple(toolkit)[:2], vtuple(torch_cuda)[:2]
    a, b = ".".join(map(str, tk)), ".".join(map(str, tc))
    if tk == tc:
        return "DeepSpeed accepts it"
    allowed = (
        tk[0] == tc[0]
        and a in DEEPSPEED_MINOR_OK.get(tk[0], ())
        and b in DEEPSPEED_MINOR_OK.get(tk[0], ())
    )
    if allowed:
        return f"DeepSpeed accepts it ({a} and {b} are both on its CUDA {tk[0]} allow-list)"
    if skip_check:
        return "DeepSpeed would refuse it, but DS_SKIP_CUDA_CHECK=1 makes it only warn"
    if tk[0] != tc[0]:
        return "DeepSpeed refuses it (major versions differ)"
    if tk[0] not in DEEPSPEED_MINOR_OK:
        return (
            f"DeepSpeed refuses it (it allows no minor mismatch for CUDA {tk[0]}.x; "
            "DS_SKIP_CUDA_CHECK=1 overrides)"
        )
    return (
        f"DeepSpeed refuses it ({a} and {b} are not both on its CUDA {tk[0]} allow-list; "
        "DS_SKIP_CUDA_CHECK=1 overrides)"
    )


# Oldest driver branch that supports each CUDA minor (NVIDIA's CUDA release notes, Linux).
DRIVER_FOR_CUDA: dict[str, str] = {
    "11.0": "450.36.06",
    "11.1": "455.23.05",
    "11.2": "460.27.03",
    "11.3": "465.19.01",
    "11.4": "470.42.01",
    "11.5": "495.29.05",
    "11.6": "510.39.01",
    "11.7": "515.43.04",
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}

def cuda_of_driver(version: str | None) -> str | None:
    """The newest CUDA a driver (a libcuda.so.<version>) supports, by DRIVER_FOR_CUDA."""
    have = vtuple(version)
    if not have:
        return None
    fits = [c for c, floor in DRIVER_FOR_CUDA.items() if vtuple(floor) <= have]
    return max(fits, key=vtuple) if fits else None


# Lowest and highest compute capability each nvcc major can build for.
NVCC_ARCH_RANGE: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {
    11: ((3, 5), (9, 0)),
    12: ((5, 0), (12, 1)),
    13: ((7, 5), (12, 1)),
}

# The newest architecture each nvcc builds, from the first version that does (CUDA toolkit
# release notes: 11.1 brought sm_86, 11.4 sm_87, 11.8 sm_89/sm_90, 12.8 sm_100/sm_120, 12.9
# sm_103/sm_121). An RTX 5090 (sm_120) needs nvcc 12.8 or newer.
NVCC_NEWEST_ARCH: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = (
    ((11, 0), (8, 0)),
    ((11, 1), (8, 6)),
    ((11, 4), (8, 7)),
    ((11, 8), (9, 0)),
    ((12, 8), (12, 0)),
    ((12, 9), (12, 1)),
)


def nvcc_newest_arch(version: str | None) -> tuple[int, int] | None:
    """The newest compute capability this nvcc version builds for; None when unknown."""
    want = vtuple(version)[:2]
    if len(want) < 2:
        return None
    rows = [arch for since, arch in NVCC_NEWEST_ARCH if since <= want]
    return rows[-1] if rows else None


def first_nvcc_for(arch: tuple[int, int]) -> str | None:
    """The oldest CUDA version whose nvcc builds for this architecture, as 'major.minor'."""
    since = next((s for s, newest in NVCC_NEWEST_ARCH if newest >= arch), None)
    return f"{since[0]}.{since[1]}" if since else None


# torch's own compiler table (torch/utils/cpp_extension.py 2.13, CUDA_GCC_VERSIONS /
# CUDA_CLANG_VERSIONS): the first major it refuses for each nvcc. It applies on top of nvcc's
# host_config.h check to binary builds of torch, unless TORCH_DONT_CHECK_COMPILER_ABI is set,
# and -allow-unsupported-compiler does not switch it off.
_TORCH_GCC = (("11.0", 10), ("11.1", 11), ("11.2", 11), ("11.3", 11), ("11.4", 12), ("11.5", 12),
              ("11.6", 12), ("11.7", 12), ("12.0", 13), ("12.1", 13), ("12.2", 13), ("12.3", 14),
              ("12.4", 14), ("12.5", 14), ("12.6", 14), ("12.7", 14), ("12.8", 15), ("12.9", 15),
              ("13.0", 16))  # fmt: skip
_TORCH_CLANG = (("11.1", 11), ("11.2", 12), ("11.3", 12), ("11.4", 13), ("11.5", 13), ("11.6", 14),
                ("11.7", 14), ("12.0", 15), ("12.1", 15), ("12.2", 16), ("12.3", 16), ("12.4", 17),
                ("12.5", 18), ("12.6", 18), ("12.7", 19), ("12.8", 19), ("12.9", 19),
                ("13.0", 21))  # fmt: skip
TORCH_COMPILER_REFUSES: dict[str, dict[str, int]] = {
    "gcc": dict(_TORCH_GCC),
    "clang": dict(_TORCH_CLANG),
}
