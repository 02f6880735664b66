"""Where xl keeps things (xl.paths): ``XL_HOME`` / ``XL_CONFIG_HOME`` first, else the XDG
folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from xl import envnames, paths


def test_xl_home_is_taken_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(envnames.HOME, str(tmp_path / "home"))
    assert paths.xl_home() == tmp_path / "home" and paths.runs_dir() == tmp_path / "home" / "runs"


def test_without_it_the_xdg_data_and_config_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in (envnames.HOME, envnames.CONFIG_HOME):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert (
        paths.xl_home() == tmp_path / "data" / "xl"
        and paths.config_dir() == tmp_path / "config" / "xl"
    )


def test_a_relative_xdg_folder_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(envnames.HOME, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths.xl_home() == tmp_path / ".local" / "share" / "xl"


def test_xl_config_home_is_taken_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(envnames.CONFIG_HOME, str(tmp_path / "cfg"))
    assert paths.config_dir() == tmp_path / "cfg"
