"""A node's fingerprint: what must match across the nodes of one run for its ranks to work
together, and the comparison of several (docs/multinode.md, "One environment across nodes").

``gather`` reads what the doctor's probes read, cheaply (no compiler, no nvcc, no ldconfig: the
torch probe, NVML's inventory, a few files): the driver's branch and CUDA, the GPUs, the ranks'
torch and its CUDA, the NCCL and cuDNN torch will load (LD_PRELOAD first, then LD_LIBRARY_PATH,
then torch's own wheels, as the loader takes them), Python, the ``NCCL_*`` / ``TORCH_*`` /
``CUDA_*`` variables the ranks get, /dev/shm, the interfaces and InfiniBand devices NCCL would
use, the kernel and the container. ``compare`` says, field by field, which node differs from the
others, how much that matters (``stop``: the run cannot work; ``warn``: it runs slower or not
alike) and the command that makes it alike; what differs harmlessly says nothing.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import socket
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from xl.doctor import wheels
from xl.doctor.facts import TorchInfo, major_minor, vtuple
from xl.doctor.probes import libraries, system
from xl.doctor.probes.commands import run_cmd

Value = str | int | None

STOP, WARN = "stop", "warn"
ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_")
# Variables of those families whose values differ between nodes with no harm: the devices each
# node chose, each node's own interface names (a missing one is judged on its own), logging, and
# places on each node's disk.
_ENV_SILENT = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NCCL_SOCKET_IFNAME",
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_FILE",
        "TORCH_CPP_LOG_LEVEL",
        "TORCH_DISTRIBUTED_DEBUG",
        "TORCH_SHOW_CPP_STACKTRACES",
        "TORCH_LOGS",
    }
)
_ENV_PLACES = ("PATH", "HOME", "DIR", "CACHE", "FILE")
# NCCL leaves these interfaces out when NCCL_SOCKET_IFNAME is unset (its default "^docker,lo").
_NCCL_SKIPS = ("docker", "lo")
_SHM_SMALLER = 0.9  # a /dev/shm under this share of the others' is smaller
# What each field is called in a line for people.
LABELS = {
    "driver": "NVIDIA driver branch",
    "driver_cuda": "the driver's CUDA",
    "gpu_model": "GPU model",
    "gpu_count": "GPUs",
    "gpu_memory_mib": "GPU memory (MiB)",
    "torch": "torch",
    "torch_cuda": "torch's CUDA",
    "nccl": "NCCL",
    "cudnn": "cuDNN",
    "python": "Python",
    "shm_bytes": "/dev/shm size",
    "nccl_ifaces": "interfaces NCCL_SOCKET_IFNAME selects",
    "ib_devices": "InfiniBand devices",
    "kernel": "kernel",
    "container": "container image",
}


@dataclass(frozen=True)
class Fingerprint:
    """One node's facts: ``fields`` as LABELS names them, ``env`` the ranks' NCCL_*/TORCH_*/
    CUDA_* variables, ``python`` the ranks' interpreter (for fixes), ``nproc`` the ranks it
    starts (0: not known, as for ``xl doctor``), and where torch's NCCL came from."""

    host: str
    fields: Mapping[str, Value]
    env: Mapping[str, str] = field(default_factory=dict)
    python: str = ""
    nproc: int = 0
    nccl_from: str = ""  # "wheel nvidia-nccl-cu12", "LD_PRELOAD PATH", "LD_LIBRARY_PATH DIR"
    ifname: str | None = None  # NCCL_SOCKET_IFNAME as the ranks get it
    ld_library_path: str = ""  # the ranks' (a fix takes a folder out of it)

    def to_json(self) -> dict[str, object]:
        return {
            "host": self.host,
            "fields": dict(self.fields),
            "env": dict(self.env),
            "python": self.python,
            "nproc": self.nproc,
            "nccl_from": self.nccl_from,
            "ifname": self.ifname,
            "ld_library_path": self.ld_library_path,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Fingerprint:
        """The fingerprint another node sent (checked on the wire: flat scalars and strings)."""
        fields = data.get("fields")
        env = data.get("env")
        nproc = data.get("nproc")
        return cls(
            host=str(data.get("host") or ""),
            fields={
                str(k): v
                for k, v in (fields.items() if isinstance(fields, dict) else ())
                if k in LABELS and (v is None or type(v) in (str, int))
            },
            env={str(k): str(v) for k, v in (env.items() if isinstance(env, dict) else ())},
            python=str(data.get("python") or ""),
            nproc=nproc if type(nproc) is int and nproc >= 0 else 0,
            nccl_from=str(data.get("nccl_from") or ""),
            ifname=str(data["ifname"]) if isinstance(data.get("ifname"), str) else None,
            ld_library_path=str(data.get("ld_library_path") or ""),
        )


@dataclass(frozen=True)
class Diff:
    """One field in which one node differs: the ``env_diff`` event's fields
    (docs/contracts.md, "env_diff")."""

    node: int
    host: str
    field: str
    value: Value
    others: Value
    severity: str  # STOP | WARN
    fix: str | None

    def to_json(self) -> dict[str, object]:
        return {
            "node": self.node,
            "host": self.host,
            "field": self.field,
            "value": self.value,
            "others": self.others,
            "severity": self.severity,
            "fix": self.fix,
        }

    @property
    def label(self) -> str:
        if self.field.startswith("env."):
            return self.field[4:]
        return LABELS.get(self.field, self.field)

    def line(self) -> str:
        """One line for a person: which node, what differs, what the others have, the fix."""
        where = f"node {self.node} ({self.host or '?'})"
        said = f"{where}: {self.label} {_shown(self.field, self.value)}"
        said += f" where the others have {_shown(self.field, self.others)}"
        if self.severity == STOP:
            said += " (the run cannot work so)"
        return said + (f"; fix there: {self.fix}" if self.fix else "")


def _shown(name: str, value: Value) -> str:
    if value is None or value == "":
        return "unset" if name.startswith("env.") else "none"
    if name == "shm_bytes" and isinstance(value, int):
        return f"{value / (1 << 30):.1f} GiB" if value >= 1 << 30 else f"{value >> 20} MiB"
    return str(value)


def node_lines(diffs: Iterable[Diff]) -> list[str]:
    """One line per odd node: what differs there, what the others have, the fixes."""
    by_node: dict[int, list[Diff]] = {}
    for diff in diffs:
        by_node.setdefault(diff.node, []).append(diff)
    lines = []
    for node, found in sorted(by_node.items()):
        what = ", ".join(
            f"{d.label} {_shown(d.field, d.value)} (others {_shown(d.field, d.others)})"
            for d in found
        )
        fixes = "; ".join(dict.fromkeys(d.fix for d in found if d.fix))
        worst = "stops the run" if any(d.severity == STOP for d in found) else "warning"
        line = f"node {node} ({found[0].host or '?'}) differs [{worst}]: {what}"
        lines.append(line + (f"; fix there: {fixes}" if fixes else ""))
    return lines


# ---------------------------------------------------------------------------------- gathering
def _ranks_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}


def nccl_interfaces(ifname: str | None, present: Sequence[str]) -> list[str]:
    """The interfaces NCCL would use here under NCCL_SOCKET_IFNAME (a comma list of prefixes;
    ``^`` leaves them out; ``=`` names exact ones), or without it every one but docker* and lo."""
    spec = (ifname or "").strip()
    if not spec:
        return [n for n in present if not n.startswith(_NCCL_SKIPS)]
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    names = [n for n in spec.lstrip("=").split(",") if n]

    def hit(name: str) -> bool:
        return any(name == n if exact else name.startswith(n) for n in names)

    return [n for n in present if hit(n) != exclude]


def ib_devices(env: Mapping[str, str], present: Sequence[str]) -> list[str]:
    """The InfiniBand devices NCCL would use here: none under NCCL_IB_DISABLE=1, those
    NCCL_IB_HCA selects (the interfaces' syntax, each device's ``:port`` aside), else all."""
    if env.get("NCCL_IB_DISABLE", "").strip() == "1":
        return []
    hca = re.sub(r":\d+", "", env.get("NCCL_IB_HCA", "")).strip()
    return nccl_interfaces(hca, present) if hca else list(present)


def _loaded(soname_prefix: str, env: Mapping[str, str]) -> tuple[str | None, str]:
    """(version, where) of the library the loader takes first for ``soname_prefix``: LD_PRELOAD,
    then LD_LIBRARY_PATH's folders; (None, "") when neither has it (torch's own then)."""
    for path, soname, version in libraries.scan_preload(env.get("LD_PRELOAD")):
        if soname.startswith(soname_prefix):
            return version, f"LD_PRELOAD {path}"
    for entry in libraries.scan_ld_library_path(env.get("LD_LIBRARY_PATH")):
        for soname, version in sorted(entry.cuda_libs.items()):
            if soname.startswith(soname_prefix):
                return version, f"LD_LIBRARY_PATH {entry.path}"
    return None, ""


def _torch_fields(torch: TorchInfo, env: Mapping[str, str]) -> tuple[dict[str, Value], str]:
    out: dict[str, Value] = {"torch": torch.version if torch.found else None}
    out["torch_cuda"] = torch.cuda if torch.found else None
    out["nccl"] = out["cudnn"] = None
    nccl_from = ""
    if torch.found and torch.cuda:  # a CPU or ROCm torch loads neither
        nccl, nccl_from = _loaded("libnccl.so", env)
        if nccl is None and torch.nccl:
            nccl, nccl_from = torch.nccl, f"wheel {torch.nccl_from or 'nvidia-nccl'}"
        cudnn, _ = _loaded("libcudnn.so", env)
        if cudnn is None:
            cudnn = next((v for s, v, _ in torch.pip_libs if s.startswith("libcudnn.so")), None)
        out["nccl"], out["cudnn"] = nccl, cudnn
    return out, nccl_from


def _gpu_fields() -> dict[str, Value]:
    from xl.gpu import nvml  # noqa: PLC0415 - NVML loads only when a fingerprint is taken

    inv = nvml.inventory(processes=False)
    gpus = [g for g in inv.gpus if not g.lost]
    driver = inv.driver.version if not inv.driver.error else None
    memory = [int(g.memory_total_mib) for g in gpus if g.memory_total_mib]
    return {
        "driver": driver.split(".")[0] if driver else None,
        "driver_cuda": inv.driver.cuda_version if driver else None,
        "gpu_model": ", ".join(sorted({g.name for g in gpus})) or None,
        "gpu_count": len(gpus),
        "gpu_memory_mib": min(memory) if memory else None,
    }


def _container(env: Mapping[str, str]) -> str | None:
    """The image this runs in, where the runtime says (Apptainer, enroot/pyxis, NGC's images),
    else the kind of container (docker, podman), else None."""
    for name in ("CONTAINER_IMAGE", "APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"):
        if env.get(name):
            return env[name]
    if env.get("NVIDIA_PYTORCH_VERSION"):
        return f"NGC PyTorch {env['NVIDIA_PYTORCH_VERSION']}"
    return system.container_kind()


def gather(
    python: str, env: Mapping[str, str], *, nproc: int = 0, shm_path: str | None = None
) -> Fingerprint:
    """This node's fingerprint for ranks run by ``python`` with ``env`` (their whole
    environment); ``nproc`` the ranks this node starts (0: not known)."""
    from xl.doctor.probes.pytorch import probe_torch  # noqa: PLC0415 - the probe's script is read only when asked

    torch = probe_torch(python, env)
    fields, nccl_from = _torch_fields(torch, env)
    fields.update(_gpu_fields())
    fields["python"] = _python_version(torch.python or python)
    total, _, _ = system.shm_size(shm_path or env.get("XL_DOCTOR_SHM") or "/dev/shm")
    fields["shm_bytes"] = total
    ifname = env.get("NCCL_SOCKET_IFNAME")
    fields["nccl_ifaces"] = ",".join(nccl_interfaces(ifname, system.net_interfaces()))
    fields["ib_devices"] = ",".join(ib_devices(env, sorted(system.infiniband_devices())))
    fields["kernel"] = platform.release()
    fields["container"] = _container(env)
    return Fingerprint(
        host=socket.gethostname(),
        fields=fields,
        env=_ranks_env(env),
        python=python,
        nproc=nproc,
        nccl_from=nccl_from,
        ifname=ifname,
        ld_library_path=env.get("LD_LIBRARY_PATH", ""),
    )


def _python_version(python: str) -> str | None:
    """X.Y.Z of ``python``: this interpreter's own, else asked (one short subprocess)."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return platform.python_version()
    res = run_cmd([python, "-c", "import platform; print(platform.python_version())"])
    return res.stdout.strip() or None if res.ok else None


# ---------------------------------------------------------------------------------- comparing
def _differs_mm(a: Value, b: Value) -> bool:
    return major_minor(str(a)) != major_minor(str(b)) if a and b else a != b


def _severity(name: str, value: Value, others: Value) -> str | None:
    """How much ``value`` differing from the others' matters; None: not at all."""
    if name in ("torch", "nccl"):
        if name == "nccl" and (value is None or others is None):
            return None  # not known there (torch's NCCL inside its own library)
        return STOP if _differs_mm(value, others) else WARN
    if name == "torch_cuda":
        a, b = vtuple(str(value or "")), vtuple(str(others or ""))
        return STOP if a[:1] != b[:1] else WARN
    if name == "python":
        return WARN if _differs_mm(value, others) else None
    if name == "shm_bytes":
        small = isinstance(value, int) and isinstance(others, int)
        return WARN if small and value < others * _SHM_SMALLER else None  # type: ignore[operator]
    if name == "ib_devices":
        return WARN if not value and others else None
    if name in ("gpu_count", "nccl_ifaces"):
        return None  # judged on each node alone (_absolute)
    if name.startswith("env."):
        var = name[4:]
        if var in _ENV_SILENT or any(p in var for p in _ENV_PLACES):
            return None
        return WARN
    if name == "cudnn" and (value is None or others is None):
        return None
    return WARN


def _reference(values: list[tuple[int, Value]]) -> Value:
    """What "the others" have: the most common value, node 0's (the first) on a tie."""
    counts = Counter(v for _, v in values)
    best = max(counts.values())
    return next(v for _, v in values if counts[v] == best)


def compare(prints: Sequence[tuple[int, Fingerprint]]) -> list[Diff]:
    """Every field in which a node differs from the others (by node, then field), with its
    severity and fix; harmless differences are left out. ``prints``: (node rank, fingerprint)."""
    if len(prints) < 2:
        return _absolute(prints)
    names = sorted({n for _, fp in prints for n in fp.fields})
    names += sorted({f"env.{k}" for _, fp in prints for k in fp.env})
    diffs = _absolute(prints)
    for name in names:
        values = [(node, _value(fp, name)) for node, fp in prints]
        if len({v for _, v in values}) < 2:
            continue
        others = _reference(values)
        for node, value in values:
            if value == others:
                continue
            severity = _severity(name, value, others)
            if severity is not None:
                fp = dict(prints)[node]
                fix = _fix(name, value, others, fp, prints)
                diffs.append(Diff(node, fp.host, name, value, others, severity, fix))
    return sorted(diffs, key=lambda d: (d.node, d.severity != STOP, d.field))


def _value(fp: Fingerprint, name: str) -> Value:
    return fp.env.get(name[4:]) if name.startswith("env.") else fp.fields.get(name)


def _absolute(prints: Sequence[tuple[int, Fingerprint]]) -> list[Diff]:
    """What breaks a node whatever the others have: fewer GPUs than the ranks it starts (when the
    run uses GPUs), an NCCL_SOCKET_IFNAME that selects no interface there."""
    diffs = []
    uses_gpus = any(fp.fields.get("gpu_count") for _, fp in prints)
    for node, fp in prints:
        count = fp.fields.get("gpu_count")
        if uses_gpus and fp.nproc and isinstance(count, int) and count < fp.nproc:
            has = [f.fields.get("gpu_count") for n, f in prints if n != node]
            fix = f"give every node's xl launch --nproc {count}" if count else None
            others = max((h for h in has if isinstance(h, int)), default=None)
            diffs.append(Diff(node, fp.host, "gpu_count", count, others, STOP, fix))
        if fp.ifname and not fp.fields.get("nccl_ifaces"):
            usable = [str(f.fields.get("nccl_ifaces") or "") for n, f in prints if n != node]
            others_have = next((u for u in usable if u), None)
            # unset, NCCL picks an interface itself (every one but docker* and lo)
            fix = "unset NCCL_SOCKET_IFNAME"
            diffs.append(Diff(node, fp.host, "nccl_ifaces", "", others_have, STOP, fix))
    return diffs


def _fix(
    name: str,
    value: Value,
    others: Value,
    fp: Fingerprint,
    prints: Sequence[tuple[int, Fingerprint]],
) -> str | None:
    """The command that makes this node alike, run there; None when no command does."""
    python = shlex.quote(fp.python or "python")
    if name.startswith("env."):
        var = name[4:]
        return f"unset {var}" if others is None else f"export {var}={shlex.quote(str(others))}"
    if name == "torch" and isinstance(others, str):
        cuda = next(
            (
                str(f.fields.get("torch_cuda") or "")
                for _, f in prints
                if f.fields.get("torch") == others
            ),
            "",
        )
        tag = wheels.tag_of(cuda) if cuda else "cpu"
        if tag is None:
            return None
        if tag == "cpu":
            base = wheels.base_version(others)
            return (
                f"{python} -m pip install --force-reinstall torch=={base} "
                "--index-url https://download.pytorch.org/whl/cpu"
                if base and re.fullmatch(r"\d+\.\d+\.\d+", base)
                else None
            )
        return wheels.install_command(python, tag, others)
    if name == "nccl" and isinstance(others, str):
        where = fp.nccl_from
        if where.startswith("LD_PRELOAD"):
            return "unset LD_PRELOAD (it loads " + where.split(" ", 1)[1] + " before torch's)"
        if where.startswith("LD_LIBRARY_PATH"):
            folder = where.split(" ", 1)[1]
            kept = [p for p in fp.ld_library_path.split(":") if p and p != folder]
            if not kept:
                return "unset LD_LIBRARY_PATH"
            return f"export LD_LIBRARY_PATH={shlex.quote(':'.join(kept))}"
        wheel = where.split(" ", 1)[1] if where.startswith("wheel ") else "nvidia-nccl-cu12"
        return f"{python} -m pip install {wheel}=={others}"
    if name == "shm_bytes" and isinstance(others, int):
        size = max(1, others >> 30)
        return f"sudo mount -o remount,size={size}G /dev/shm"
    return None
