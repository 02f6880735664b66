"""Type-check xl as it is installed: one ``xl`` namespace, not four folders.

The repo maps folders into ``xl`` (pyproject's package-dir: ``xl.doctor`` is ``doctor/``), which
mypy cannot follow: run on the folders, every ``from xl.launcher...`` in ``tui/`` is a missing
module and silently ``Any``, so a wrong call across packages passes. This builds the installed
shape as a tree of symlinks in a temp dir, runs mypy on the package ``xl`` with the project's
settings, and prints each error with the path as it is in the repo.

    .venv/bin/python tests/support/typecheck.py     # exit 0 clean, 1 type errors, 2 could not run
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

import tomllib
from mypy import api

ROOT = Path(__file__).resolve().parents[2]
# Training scripts (they import torch at the top, as scripts do): not part of the typed product.
SKIP = {"xl.examples"}


def link_tree(dest: Path) -> dict[str, str]:
    """``dest/xl`` shaped like the installed package; returns {path in the tree: path in the
    repo}."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    top = dest / "xl"
    top.mkdir()
    for entry in (ROOT / "xl").iterdir():
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    back = {"xl/": "xl/"}
    for name, folder in package_dir.items():
        parts = name.split(".")
        if name in SKIP or len(parts) != 2 or folder.startswith("xl/"):
            continue  # subpackages come with their folder; xl's own come with xl/
        (top / parts[1]).symlink_to(ROOT / folder, target_is_directory=True)
        back[f"xl/{parts[1]}/"] = f"{folder}/"
    return back


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="xl-typecheck-") as tmp:
        back = link_tree(Path(tmp))
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            out, err, code = api.run(
                [
                    "--config-file", str(ROOT / "pyproject.toml"),
                    "--cache-dir", str(ROOT / ".mypy_cache" / "namespace"),
                    "-p", "xl",
                ]
            )
        finally:
            os.chdir(cwd)
    # Longest prefix first: xl/doctor/ before xl/.
    pattern = re.compile(
        "^(" + "|".join(re.escape(k) for k in sorted(back, key=len, reverse=True)) + ")", re.M
    )
    sys.stdout.write(pattern.sub(lambda m: back[m.group(1)], out))
    sys.stderr.write(err)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
