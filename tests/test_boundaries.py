"""The layout's boundaries, enforced: what each part may load (DESIGN.md, 'Boundaries')."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("textual", "rich", "torch")


def _loaded_after(statement: str) -> set[str]:
    code = (
        f"{statement}\n"
        "import sys, json\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_xl_loads_no_ui_and_no_torch() -> None:
    loaded = _loaded_after("import xl")
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


@pytest.mark.parametrize("package", ["xl.doctor", "xl.launcher"])
def test_headless_packages_never_load_textual_or_torch(package: str) -> None:
    # Import every module of the package, not just its __init__.
    statement = (
        "import importlib, pkgutil\n"
        f"import {package} as pkg\n"
        "for m in pkgutil.iter_modules(pkg.__path__):\n"
        "    importlib.import_module(pkg.__name__ + '.' + m.name)\n"
    )
    loaded = _loaded_after(statement)
    assert "textual" not in loaded
    assert "torch" not in loaded
    assert "tui" not in loaded


def test_repo_folders_are_not_importable_as_top_level_packages(tmp_path) -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for name in ("doctor", "launcher", "tui"):
        proc = subprocess.run(
            [sys.executable, "-c", f"import {name}"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0
        assert f"import it as 'xl.{name}'" in proc.stderr
