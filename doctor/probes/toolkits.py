"""CUDA toolkits: where they are, which one CUDA_HOME names (as torch resolves it), and what each
holds, read from its files without running anything."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

from xl.doctor.facts import Toolkit
from xl.doctor.probes.files import is_dir, is_file, listdir, read_text, real_path, why_not_a_folder
from xl.doctor.probes.libraries import CUDART
from xl.doctor.tables import parse_host_config

_WRAPPED_NVCC = re.compile(r"(/[^\s\"'$;|&]+/bin/nvcc)\b")


def follow_nvcc(path: str) -> str:
    """The real nvcc behind `path`: symlinks resolved, and a small `exec .../bin/nvcc` wrapper
    script followed (e.g. /usr/local/bin/nvcc -> /usr/local/cuda-13.0/bin/nvcc)."""
    real = os.path.realpath(path)
    try:
        if os.path.getsize(real) < 4096:
            text = read_text(real, 4096) or ""
            if text.startswith("#!"):
                for cand in _WRAPPED_NVCC.findall(text):
                    target = os.path.realpath(cand)
                    if target != real and is_file(target):
                        return target
    except (OSError, ValueError):
        pass
    return real


def toolkit_root_of_nvcc(nvcc: str) -> str:
    return os.path.dirname(os.path.dirname(follow_nvcc(nvcc)))


def resolve_cuda_home(
    env: Mapping[str, str], path_nvcc: str | None, default: str = "/usr/local/cuda"
) -> tuple[str | None, str | None]:
    """CUDA_HOME exactly as torch.utils.cpp_extension._find_cuda_home resolves it on Linux:

        cuda_home = os.environ.get('CUDA_HOME') or os.environ.get('CUDA_PATH')
        if cuda_home is None: the folder above shutil.which('nvcc') (not resolved), else
                              /usr/local/cuda when it exists (a dangling link does not)

    The `or` chain skips an empty CUDA_HOME, but a CUDA_PATH that is set and empty comes back as
    "" and stops the search: torch then looks for nvcc at the relative path bin/nvcc. That case
    returns ("", "CUDA_PATH") so the check can say so.
    """
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home is not None:
        return home, "CUDA_HOME" if env.get("CUDA_HOME") else "CUDA_PATH"
    if path_nvcc:
        return os.path.dirname(os.path.dirname(path_nvcc)), "nvcc on PATH"
    if os.path.exists(default):
        return default, default
    return None, None


_VERSION_TXT = re.compile(r"CUDA Version (\d+\.\d+(?:\.\d+)?)")
_DISTINFO_NVCC = re.compile(r"^nvidia_cuda_nvcc(?:_cu\d+)?-(\d+\.\d+(?:\.\d+)?)[^/]*\.dist-info$")


def _read_version(tk: Toolkit) -> None:
    """The toolkit's version from version.json, else version.txt, else a pip wheel's dist-info."""
    text = read_text(os.path.join(tk.real, "version.json"))
    if text is not None:
        try:
            data = json.loads(text)
            ver = (data.get("cuda") or {}).get("version") or (data.get("cuda_nvcc") or {}).get(
                "version"
            )
            if isinstance(ver, str):
                tk.version, tk.version_from = ver, "version.json"
        except (ValueError, AttributeError):
            pass
    if tk.version is None:
        text = read_text(os.path.join(tk.real, "version.txt"))
        m = _VERSION_TXT.search(text or "")
        if m:
            tk.version, tk.version_from = m.group(1), "version.txt"
    if tk.version is None:
        for name in listdir(os.path.join(tk.real, "dist-info")):
            m = _DISTINFO_NVCC.match(name)
            if m:
                tk.version, tk.version_from = m.group(1), "dist-info"
                break


def _read_host_config(tk: Toolkit, path: str) -> None:
    """The host compilers this toolkit's nvcc accepts, from its host_config.h when it can be
    read."""
    text = read_text(path)
    if text is not None:
        tk.host_config = path
        tk.gcc_min, tk.gcc_max, tk.clang_min, tk.clang_max = parse_host_config(text)


def inspect_toolkit(root: str, found_by: str) -> Toolkit:
    """Read a toolkit's version, limits and libraries from its files (no subprocess)."""
    real = real_path(root)
    tk = Toolkit(root=root, real=real, found_by=[found_by])
    if not is_dir(real):
        tk.problem = f"{root} {why_not_a_folder(root)}"
        return tk
    if not os.access(real, os.R_OK | os.X_OK):
        tk.problem = f"{root} is not readable"
        return tk
    nvcc = os.path.join(root, "bin", "nvcc")
    if is_file(nvcc):
        tk.nvcc = nvcc
    _read_version(tk)
    _read_host_config(tk, os.path.join(real, "include", "crt", "host_config.h"))
    tk.has_headers = is_file(os.path.join(real, "include", "cuda_runtime.h"))
    if not tk.has_headers:
        # conda-forge's layout: headers only under targets/<arch>/include, which nvcc finds
        # through its nvcc.profile but the host compiler (and torch's -I$CUDA_HOME/include) not.
        for arch in ("x86_64-linux", "sbsa-linux"):
            inc = os.path.join(root, "targets", arch, "include")
            if is_file(os.path.join(inc, "cuda_runtime.h")):
                tk.target_include = inc
                break
    if tk.host_config is None and tk.target_include:
        _read_host_config(tk, os.path.join(tk.target_include, "crt", "host_config.h"))
    for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib")):
        libdir = os.path.join(real, sub)
        if is_dir(libdir):
            lreal = os.path.realpath(libdir)
            if lreal not in tk.lib_dirs:
                tk.lib_dirs.append(lreal)
        for name in listdir(libdir):
            if CUDART.match(name) and name not in tk.cudart:
                tk.cudart.append(name)
    tk.cudart.sort()
    _read_conda(tk, real)
    return tk


def _read_conda(tk: Toolkit, real: str) -> None:
    """A conda environment's toolkit: the channel of its cuda-nvcc record (conda-meta/*.json),
    conda-forge when the record does not say, and its targets/<arch> folder."""
    meta = os.path.join(real, "conda-meta")
    if not is_dir(meta):
        return
    for arch in ("x86_64-linux", "sbsa-linux"):
        if is_dir(os.path.join(tk.root, "targets", arch)):
            tk.target_dir = os.path.join(tk.root, "targets", arch)
            break
    tk.conda_channel = "conda-forge"
    record = next(
        (n for n in sorted(listdir(meta)) if n.startswith("cuda-nvcc-") and n.endswith(".json")),
        None,
    )
    text = read_text(os.path.join(meta, record), limit=1 << 20) if record else None
    m = re.search(r'"channel"\s*:\s*"([^"]+)"', text or "")
    if m:
        # https://conda.anaconda.org/nvidia/label/cuda-12.4.1 -> nvidia/label/cuda-12.4.1
        channel = re.sub(r"^https?://conda\.anaconda\.org/", "", m.group(1)).strip("/")
        if re.fullmatch(r"[\w./-]+", channel):
            tk.conda_channel = "conda-forge" if channel.startswith("conda-forge") else channel


def toolkit_root_of_libdir(entry: str) -> str | None:
    """The toolkit a library folder belongs to (ROOT/lib64, ROOT/lib or
    ROOT/targets/<arch>/lib, as written or once resolved), when ROOT looks like one."""
    if not entry or not is_dir(entry):
        return None
    roots: list[str] = []
    for path in dict.fromkeys((os.path.normpath(entry), os.path.realpath(entry))):
        parent = os.path.dirname(path)
        if os.path.basename(path) in ("lib64", "lib"):
            roots.append(parent)
            if os.path.basename(os.path.dirname(parent)) == "targets":
                roots.append(os.path.dirname(os.path.dirname(parent)))
    for root in roots:
        if any(is_file(os.path.join(root, n)) for n in ("bin/nvcc", "version.json", "version.txt")):
            return root
    return None


def _candidates(
    env: Mapping[str, str], path_nvcc: str | None, cuda_home: str | None
) -> list[tuple[str, str]]:
    """(folder, where it was found) for every place a toolkit may be, duplicates included."""
    cands: list[tuple[str, str]] = []
    for base, label in (("/usr/local", "/usr/local/cuda*"), ("/opt", "/opt/cuda*")):
        for name in sorted(listdir(base)):
            if name.startswith("cuda"):
                cands.append((os.path.join(base, name), label))
    if cuda_home:
        # torch's CUDA_HOME may be the folder above a wrapper (/usr/local for /usr/local/bin/nvcc):
        # the toolkit is where the wrapper leads; the cuda_home check judges the folder itself.
        home_nvcc = os.path.join(cuda_home, "bin", "nvcc")
        root = toolkit_root_of_nvcc(home_nvcc) if is_file(home_nvcc) else cuda_home
        cands.append((root, "CUDA_HOME"))
    if env.get("CUDA_PATH") and env.get("CUDA_HOME"):
        cands.append((env["CUDA_PATH"], "CUDA_PATH"))
    if path_nvcc:
        cands.append((toolkit_root_of_nvcc(path_nvcc), "PATH"))
    for entry in (env.get("PATH") or "").split(os.pathsep):
        if entry and is_file(os.path.join(entry, "nvcc")):
            cands.append((toolkit_root_of_nvcc(os.path.join(entry, "nvcc")), "PATH"))
    # A toolkit's library folder on LD_LIBRARY_PATH (cuda-12.1/lib64 and the like) names a toolkit
    # too: without it, which toolkit LD_LIBRARY_PATH selects could not be told.
    for entry in (env.get("LD_LIBRARY_PATH") or "").split(os.pathsep):
        lib_root = toolkit_root_of_libdir(entry)
        if lib_root is not None:
            cands.append((lib_root, "LD_LIBRARY_PATH"))
    if env.get("CONDA_PREFIX"):
        prefix = env["CONDA_PREFIX"]
        if is_file(os.path.join(prefix, "bin", "nvcc")):
            cands.append((prefix, "$CONDA_PREFIX"))
    return cands


def discover_toolkits(
    env: Mapping[str, str], path_nvcc: str | None, cuda_home: str | None
) -> list[Toolkit]:
    """Every toolkit we can see, deduplicated by real path, with where each was found."""
    found: dict[str, Toolkit] = {}
    for root, label in _candidates(env, path_nvcc, cuda_home):
        real = real_path(root)
        if real in found:
            tk = found[real]
            if label not in tk.found_by:
                tk.found_by.append(label)
            if root != tk.root and root not in tk.aliases:
                tk.aliases.append(root)
            continue
        tk = inspect_toolkit(root, label)
        # /usr/local/cuda-foo.bak without nvcc or version is not a toolkit; a named variable is
        # reported even when broken (the checks say why).
        if tk.problem is None and tk.nvcc is None and tk.version is None and label.endswith("*"):
            continue
        found[real] = tk
    return list(found.values())
