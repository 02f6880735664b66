"""What a run was made with, recorded as it starts: run.json's ``versions``.

``{"xl", "torch", "cuda", "driver", "git"}``: xl's version; torch's and its CUDA's as the run's
interpreter has them (read from torch/version.py, torch is never imported); the NVIDIA driver's
(GPU runs only); the commit of the git repository that holds the script, when it is in one.
``xl compare`` shows which of them changed between two runs (docs/compare.md). A value that
cannot be found is None; finding them never delays the ranks by more than a few seconds.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from xl._version import __version__

_TIMEOUT_S = 5.0
# Run by the run's own interpreter when it is another one: where its torch lives.
_FIND_TORCH = (
    "import importlib.util as u; s = u.find_spec('torch'); "
    "print(s.origin if s and s.origin else '')"
)


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """A short helper command, its output as text; never longer than ``_TIMEOUT_S``."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)


def torch_origin(python: str | None) -> str | None:
    """torch/__init__.py of ``python`` (None: this interpreter), without importing torch."""
    if not python or os.path.realpath(python) == os.path.realpath(sys.executable):
        try:
            spec = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            return None
        return spec.origin if spec is not None else None
    try:
        done = _run([python, "-c", _FIND_TORCH])
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def torch_versions(origin: str | None) -> tuple[str | None, str | None]:
    """(torch, its CUDA) from torch/version.py's literals; CUDA None for a CPU build."""
    if not origin:
        return None, None
    try:
        with open(os.path.join(os.path.dirname(origin), "version.py"), encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None, None
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    torch, cuda = found.get("__version__"), found.get("cuda")
    return (str(torch) if torch else None), (str(cuda) if cuda else None)


def git_commit(script: str | None, cwd: str | None) -> str | None:
    """HEAD of the repository holding ``script`` (a "+" when it has uncommitted changes)."""
    if not script:
        return None
    where = os.path.dirname(os.path.join(cwd or os.getcwd(), script)) or "."
    try:
        head = _run(["git", "-C", where, "rev-parse", "HEAD"])
        if head.returncode != 0:
            return None
        dirty = _run(["git", "-C", where, "status", "--porcelain", "--untracked-files=no"])
    except (OSError, subprocess.SubprocessError):
        return None
    commit = head.stdout.strip()
    return (commit + "+" if dirty.stdout.strip() else commit) or None


def driver_version(gpu_run: bool) -> str | None:
    if not gpu_run:
        return None
    from xl.gpu import nvml  # noqa: PLC0415 - NVML loads only for a run on GPUs

    try:
        return nvml.inventory(processes=False).driver.version
    except Exception:  # the versions are a courtesy: never a reason for a run not to start
        return None


def collect(spec: Mapping[str, object], gpu_run: bool) -> dict[str, str | None]:
    """run.json's ``versions`` for a run of ``spec`` (run.json's ``spec``, as another tool may
    have written it: a value that is not text is taken as absent)."""

    def text(key: str) -> str | None:
        value = spec.get(key)
        return value if isinstance(value, str) else None

    torch, cuda = torch_versions(torch_origin(text("python")))
    return {
        "xl": __version__,
        "torch": torch,
        "cuda": cuda,
        "driver": driver_version(gpu_run),
        "git": git_commit(text("script"), text("cwd")),
    }
