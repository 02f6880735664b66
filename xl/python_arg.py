"""The ``--python PY`` rule, one for ``xl doctor`` and ``xl launch``: a bare name is looked up on
PATH, anything with a slash is taken as a path, and either must be an executable file. It lives
in the lowest layer because the doctor may not import the launcher (docs/architecture.md, Layers);
each command words its own error around the reason given here."""

from __future__ import annotations

import os
import shutil


def find_python(value: str) -> tuple[str | None, str]:
    """(the interpreter's path, "") or (None, why not: "not found on PATH", "no such file",
    "not executable"). A path is returned as given; a bare name as PATH resolves it."""
    if os.sep not in value:
        found = shutil.which(value)
        return (found, "") if found else (None, "not found on PATH")
    if not os.path.isfile(value):
        return None, "no such file"
    if not os.access(value, os.X_OK):
        return None, "not executable"
    return value, ""
