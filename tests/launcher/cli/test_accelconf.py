"""Direct test: launcher/cli/accelconf.py, an Accelerate config read into launch settings. Its
main process's address becomes the rendezvous written as xl writes every address (xl.address):
an IPv6 one in brackets, so the plan reads it back as HOST:PORT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xl.launcher.cli.accelconf import read_settings


def _config(tmp_path: Path, **data: object) -> Path:
    path = tmp_path / "default_config.json"
    path.write_text(json.dumps({"num_machines": 2, "num_processes": 8, "machine_rank": 1, **data}))
    return path


@pytest.mark.parametrize(
    ("ip", "rdzv"),
    [
        ("10.0.0.1", "10.0.0.1:29500"),
        ("fd00::1", "[fd00::1]:29500"),
        ("[fd00::1]", "[fd00::1]:29500"),
    ],
)
def test_the_main_process_is_the_rendezvous(tmp_path: Path, ip: str, rdzv: str) -> None:
    settings = read_settings(_config(tmp_path, main_process_ip=ip, main_process_port=29500))
    assert (settings.rdzv, settings.nnodes, settings.nproc, settings.node_rank) == (rdzv, 2, 4, 1)


def test_one_machine_has_no_rendezvous(tmp_path: Path) -> None:
    assert (
        read_settings(
            _config(tmp_path, num_machines=1, main_process_ip="10.0.0.1", main_process_port=29500)
        ).rdzv
        is None
    )
