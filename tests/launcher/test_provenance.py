"""run.json's ``versions`` (xl.launcher.provenance): torch's and CUDA's read from torch/version.py
without importing torch, the script's git commit with a "+" when it has changes, None where
unknown."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from xl._version import __version__
from xl.launcher import provenance


def _fake_torch(folder: Path, version_py: str) -> str:
    (folder / "torch").mkdir(parents=True)
    (folder / "torch" / "__init__.py").write_text("raise ImportError('never imported')\n")
    (folder / "torch" / "version.py").write_text(version_py)
    return str(folder / "torch" / "__init__.py")


def test_torch_and_cuda_come_from_version_py_literals(tmp_path: Path) -> None:
    origin = _fake_torch(
        tmp_path, "__version__ = '2.5.1+cu124'\ncuda: str | None = '12.4'\ngit_version = 'abc'\n"
    )
    assert provenance.torch_versions(origin) == ("2.5.1+cu124", "12.4")


def test_a_cpu_build_or_no_torch_is_none(tmp_path: Path) -> None:
    assert provenance.torch_versions(
        _fake_torch(tmp_path, "__version__ = '2.5.1+cpu'\ncuda = None\n")
    ) == ("2.5.1+cpu", None)
    assert provenance.torch_versions(None) == (None, None)
    assert provenance.torch_versions(str(tmp_path / "nowhere" / "__init__.py")) == (None, None)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_script_s_commit_with_a_plus_when_changed(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tmp_path), *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "train.py").write_text("print('hi')\n")
    git("add", "train.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    head = git("rev-parse", "HEAD")
    assert provenance.git_commit("train.py", str(tmp_path)) == head
    (tmp_path / "train.py").write_text("print('changed')\n")
    assert provenance.git_commit("train.py", str(tmp_path)) == head + "+"
    assert provenance.git_commit(None, str(tmp_path)) is None


def test_outside_a_repository_and_on_cpu_the_rest_is_none(tmp_path: Path) -> None:
    versions = provenance.collect(
        {"script": "train.py", "cwd": str(tmp_path), "python": None}, gpu_run=False
    )
    assert versions["xl"] == __version__ and versions["driver"] is None
    assert set(versions) == {"xl", "torch", "cuda", "driver", "git"}
