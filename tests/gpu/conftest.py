"""The GPU acceptance suite runs only where a CUDA device is visible; elsewhere every test here
skips with one line saying why (CI and the development machines have no GPU and no driver).

Run it all, with a summary: ``.venv/bin/python bench/gpu_acceptance.py``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def _load(name: str) -> ModuleType:
    # tests/gpu is not on sys.path (importlib mode); load the sibling module by its path.
    spec = importlib.util.spec_from_file_location(f"xl_gpu_acceptance_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpubox = _load("gpubox")


@pytest.fixture(scope="session")
def machine() -> object:
    m = gpubox.probe()
    if m.why_not:
        pytest.skip(f"{m.why_not} (the GPU acceptance suite: bench/gpu_acceptance.py)")
    return m


@pytest.fixture(autouse=True)
def _needs_a_cuda_device(machine: object) -> None:
    """Every test here needs the machine: skipping it skips them all, with its reason."""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A clean environment with a private XL_HOME: every GPU in nvidia-smi order."""
    return gpubox.clean_env(XL_HOME=str(tmp_path / "xl-home"), PYTHONUNBUFFERED="1")


@pytest.fixture(scope="session")
def box() -> ModuleType:
    return gpubox
