"""Every file location xl uses, computed in one place."""

from __future__ import annotations

import os
from pathlib import Path

from xl import envnames


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    if value and os.path.isabs(value):
        return Path(value)
    return Path.home() / fallback


def xl_home() -> Path:
    """Where runs live: ``$XL_HOME``, else the user data dir (``~/.local/share/xl``)."""
    value = os.environ.get(envnames.HOME)
    if value:
        return Path(value).expanduser()
    return _xdg("XDG_DATA_HOME", ".local/share") / "xl"


def runs_dir() -> Path:
    return xl_home() / "runs"


def config_dir() -> Path:
    """User settings (e.g. the launch form's last values): ``$XDG_CONFIG_HOME/xl``."""
    value = os.environ.get(envnames.CONFIG_HOME)
    if value:
        return Path(value).expanduser()
    return _xdg("XDG_CONFIG_HOME", ".config") / "xl"
