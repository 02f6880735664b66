"""The torch probe: a stdlib-only script run inside the interpreter given by `xl doctor --python`.

That interpreter may not have xl installed, so this file imports nothing but the standard library
and the doctor runs its source with `python -c` (xl.doctor.probes.pytorch). It finds torch without
importing it (find_spec does not execute torch/__init__.py), reads torch/version.py as literals,
and prints one JSON object: python, bin_dir, location, version, cuda, hip, nccl, nccl_from,
pip_toolkits and, when something went wrong, problem. Importing this module does nothing.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import sys


def dists(site: str, prefix: str) -> list[str]:
    """The .dist-info folders in `site` whose names start with `prefix`, sorted."""
    try:
        return sorted(
            n for n in os.listdir(site) if n.startswith(prefix) and n.endswith(".dist-info")
        )
    except OSError:
        return []


def version_of(dist_info: str) -> str:
    return dist_info[: -len(".dist-info")].split("-", 1)[1]


def read_literals(path: str) -> dict[str, object]:
    """The module-level `NAME = <literal>` assignments of a Python file, without running it."""
    if os.path.exists(path) and not os.path.isfile(path):  # open() on a FIFO blocks forever
        raise OSError("not a regular file")
    with open(path, "rb") as fh:
        tree = ast.parse(fh.read().decode("utf-8", "replace"))
    vals: dict[str, object] = {}
    for node in tree.body:
        targets: list[ast.expr]
        value: ast.expr | None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        for t in targets:
            if isinstance(t, ast.Name) and value is not None:
                try:
                    vals[t.id] = ast.literal_eval(value)
                except Exception:
                    pass
    return vals


def pip_toolkits(site: str) -> list[tuple[str, str]]:
    """(root, version) of each CUDA toolkit installed as a pip wheel (nvidia-cuda-nvcc-*)."""
    nvd = os.path.join(site, "nvidia")
    found: list[tuple[str, str]] = []
    for n in dists(site, "nvidia_cuda_nvcc"):
        ver = version_of(n)
        # nvidia-cuda-nvcc-cu12 installs nvidia/cuda_nvcc; the 13.x wheels install nvidia/cu13
        tag = n.split("-")[0].rsplit("_", 1)[-1]
        subs = (
            ["cuda_nvcc"]
            if tag[:2] == "cu" and tag[2:].isdigit()
            else ["cu" + ver.split(".")[0], "cuda_nvcc"]
        )
        for sub in subs:
            if os.path.isfile(os.path.join(nvd, sub, "bin", "nvcc")):
                found.append((os.path.join(nvd, sub), ver))
                break
    return found


def pip_ptxas(site: str) -> list[str]:
    """nvidia-cuda-nvcc wheels that hold ptxas but no nvcc (what Triton needs): not toolkits."""
    nvd = os.path.join(site, "nvidia")
    return [
        os.path.join(nvd, sub)
        for sub in ("cuda_nvcc", "cu13")
        if os.path.isfile(os.path.join(nvd, sub, "bin", "ptxas"))
        and not os.path.isfile(os.path.join(nvd, sub, "bin", "nvcc"))
    ]


# The CUDA libraries torch loads from its nvidia/ wheels, by soname, and the wheel that ships
# each (nvidia/<package>/lib for CUDA 12 wheels, nvidia/cu13/lib for CUDA 13 ones).
PIP_LIB = re.compile(
    r"^lib(cudart|nvJitLink|cublas|cublasLt|cusparse|cusolver|cufft|curand|nvrtc)\.so\.\d+$"
)
_LIB_PACKAGE = {
    "cudart": "cuda_runtime",
    "nvJitLink": "nvjitlink",
    "cublas": "cublas",
    "cublasLt": "cublas",
    "cusparse": "cusparse",
    "cusolver": "cusolver",
    "cufft": "cufft",
    "curand": "curand",
    "nvrtc": "cuda_nvrtc",
}


def pip_libs(site: str) -> list[tuple[str, str, str]]:
    """(soname, wheel version, folder) of each CUDA library in the nvidia/ wheels."""
    versions: dict[str, str] = {}
    for n in dists(site, "nvidia_"):
        name = n.split("-")[0][len("nvidia_") :]
        name = re.sub(r"_cu\d+$", "", name)
        versions[name] = version_of(n)
    nvd = os.path.join(site, "nvidia")
    out: list[tuple[str, str, str]] = []
    try:
        subs = sorted(os.listdir(nvd))
    except OSError:
        return out
    for sub in subs:
        lib = os.path.join(nvd, sub, "lib")
        try:
            names = sorted(os.listdir(lib))
        except OSError:
            continue
        for name in names:
            m = PIP_LIB.match(name)
            ver = versions.get(_LIB_PACKAGE[m.group(1)]) if m else None
            if m and ver:
                out.append((name, ver, lib))
    return out


# "nvidia-nccl-cu12==2.21.5; ..." as today's wheels write it, "nvidia-nccl-cu12 (==2.18.1) ; ..."
# as older ones (torch 2.1 and before) did.
_NVIDIA_REQ = re.compile(
    r"^Requires-Dist:\s*(nvidia-[\w.-]+?)\s*\(?\s*==\s*([0-9][\w.]*)", re.MULTILINE
)


def nvidia_required(metadata: str) -> dict[str, str]:
    """{distribution: version} of every nvidia-* wheel torch's METADATA pins with ==."""
    try:
        if not os.path.isfile(metadata):
            return {}
        with open(metadata, "rb") as fh:
            text = fh.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return {}
    return {m.group(1).lower(): m.group(2) for m in _NVIDIA_REQ.finditer(text)}


def nvidia_dists(site: str) -> dict[str, str]:
    """{distribution: version} of the nvidia-* distributions installed in `site`."""
    out = {}
    for n in dists(site, "nvidia_"):
        name = n[: -len(".dist-info")].split("-", 1)[0].replace("_", "-").lower()
        out[name] = version_of(n)
    return out


_NCCL_REQ = re.compile(
    r"^Requires-Dist:\s*(nvidia-nccl-cu\d+)\s*\(?\s*==\s*([0-9][\w.]*)", re.MULTILINE
)


def nccl_required(metadata: str) -> list[str] | None:
    """[package, version] of the NCCL wheel torch's METADATA pins (nvidia-nccl-cu12==2.21.5)."""
    try:
        if not os.path.isfile(metadata):
            return None
        with open(metadata, "rb") as fh:
            m = _NCCL_REQ.search(fh.read(1 << 20).decode("utf-8", "replace"))
    except OSError:
        return None
    return [m.group(1), m.group(2)] if m else None


def probe() -> dict[str, object]:
    out: dict[str, object] = {"python": sys.executable, "bin_dir": os.path.dirname(sys.executable)}
    try:
        spec = importlib.util.find_spec("torch")
    except Exception as e:
        spec = None
        out["problem"] = f"finding torch failed: {e}"
    if spec is None or not spec.origin:
        return out
    d = os.path.dirname(spec.origin)
    out["location"] = d
    vals: dict[str, object] = {}
    version_py = os.path.join(d, "version.py")
    try:
        vals = read_literals(version_py)
    except Exception as e:
        out["problem"] = f"can't read {version_py}: {e}"
    out["version"] = vals.get("__version__")
    out["cuda"] = vals.get("cuda")
    out["hip"] = vals.get("hip")
    site = os.path.dirname(d)
    td = dists(site, "torch-")
    if td and not out.get("version"):
        out["version"] = td[-1][len("torch-") : -len(".dist-info")]
    elif not td and not out.get("version"):
        try:
            import importlib.metadata as md  # noqa: PLC0415 - needed only when no torch-*.dist-info names the version

            out["version"] = md.version("torch")
        except Exception:
            pass
    wheels = []
    for n in dists(site, "nvidia_nccl_cu"):
        out["nccl"] = version_of(n)
        out["nccl_from"] = n[: -len(".dist-info")].split("-", 1)[0].replace("_", "-")
        wheels.append([out["nccl_from"], out["nccl"]])
    out["nccl_wheels"] = wheels
    if td:
        out["nccl_required"] = nccl_required(os.path.join(site, td[-1], "METADATA"))
        out["requires"] = nvidia_required(os.path.join(site, td[-1], "METADATA"))
    out["nvidia_dists"] = nvidia_dists(site)
    out["pip_toolkits"] = pip_toolkits(site)
    out["pip_ptxas"] = pip_ptxas(site)
    out["pip_libs"] = pip_libs(site)
    return out


if __name__ == "__main__":
    print(json.dumps(probe()))
