"""The one --python rule (xl.python_arg), which `xl doctor` and `xl launch` both word their
errors around."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from xl.python_arg import find_python


def test_a_path_is_taken_as_given() -> None:
    assert find_python(sys.executable) == (sys.executable, "")


def test_a_bare_name_is_looked_up_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "mypython"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_python("mypython") == (str(exe), "")
    assert find_python("nothere") == (None, "not found on PATH")


def test_a_path_must_be_an_executable_file(tmp_path: Path) -> None:
    assert find_python(str(tmp_path / "nope")) == (None, "no such file")
    assert find_python(str(tmp_path)) == (None, "no such file")
    plain = tmp_path / "python"
    plain.write_text("")
    plain.chmod(0o644)
    if os.access(plain, os.X_OK):  # root reads every mode bit as allowed
        pytest.skip("running as root: every file counts as executable")
    assert find_python(str(plain)) == (None, "not executable")
