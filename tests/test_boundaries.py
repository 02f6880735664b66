"""The layout's boundaries, enforced: what each part may load (docs/architecture.md, 'What the
layout tests enforce').

- `xl.doctor` and `xl.launcher` never import `textual` or `xl.tui`;
- nothing imports torch at module level (only rank processes do, e.g. through
  `xl.integrations`, whose whole point is to subclass transformers'/accelerate's classes);
- `import xl` stays cheap (~20 ms) and pulls in neither Rich, Textual nor torch.

Module names are compared whole: `xl.tui.app` is `xl.tui`'s, not "xl"'s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("textual", "rich", "torch")


def _loaded_after(statement: str) -> set[str]:
    """Every module name in sys.modules after `statement` runs in a fresh interpreter."""
    code = f"{statement}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _under(loaded: set[str], package: str) -> set[str]:
    """The loaded modules that are `package` or inside it."""
    return {m for m in loaded if m == package or m.startswith(package + ".")}


def _import_all(package: str, skip: tuple[str, ...] = ()) -> str:
    """A statement importing every module of `package`, subpackages included."""
    return (
        "import importlib, pkgutil\n"
        f"import {package} as pkg\n"
        "for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        f"    if not m.name.startswith({skip!r}):\n"
        "        importlib.import_module(m.name)\n"
    )


def test_under_compares_whole_names() -> None:
    loaded = {"xl", "xl.doctor", "xl.tuition", "xl.tui.app", "textualize", "textual.app"}
    assert _under(loaded, "xl.tui") == {"xl.tui.app"}
    assert _under(loaded, "textual") == {"textual.app"}


def test_import_xl_loads_no_ui_and_no_torch() -> None:
    loaded = _loaded_after("import xl")
    for heavy in HEAVY:
        assert not _under(loaded, heavy), _under(loaded, heavy)
    # The training-script client (and its thread) loads only when a script first uses it.
    assert not _under(loaded, "xl.client")


@pytest.mark.parametrize("package", ["xl.doctor", "xl.launcher"])
def test_headless_packages_never_load_textual_tui_or_torch(package: str) -> None:
    loaded = _loaded_after(_import_all(package))
    assert _under(loaded, package) - {package}, "no module of the package was imported"
    for forbidden in ("textual", "xl.tui", "torch"):
        assert not _under(loaded, forbidden), (forbidden, sorted(_under(loaded, forbidden)))


@pytest.mark.parametrize(
    ("package", "skip"),
    # xl.examples is left out too: its modules are training scripts (they import torch at the
    # top, as scripts do); an editable install's finder may hide them from the walk, a regular
    # install does not.
    [("xl", ("xl.integrations", "xl.__main__", "xl.examples")), ("xl.tui", ())],
    ids=["xl", "xl.tui"],
)
def test_nothing_imports_torch_at_module_level(package: str, skip: tuple[str, ...]) -> None:
    """xl.integrations is left out: it subclasses transformers'/accelerate's classes and only
    rank processes import it (xl.__main__ would run the app; xl.examples are training scripts)."""
    loaded = _loaded_after(_import_all(package, skip))
    assert len(_under(loaded, package)) > 3, sorted(_under(loaded, package))
    assert not _under(loaded, "torch"), sorted(_under(loaded, "torch"))[:5]


def test_import_xl_stays_cheap() -> None:
    """docs/architecture.md: `import xl` in a training script stays cheap. The modules it adds to
    a bare interpreter are counted (the same on a busy machine as on an idle one); the CPU they
    take is bench/bench_imports.py's to print, never a test's to assert."""
    code = (
        "import sys, json\n"
        "before = set(sys.modules)\n"
        "import xl\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    added = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(added) <= 15, added
    assert all(
        m == "xl" or m.startswith(("xl.", "typing", "_typing", "collections")) for m in added
    ), added


def test_repo_folders_are_not_importable_as_top_level_packages() -> None:
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
