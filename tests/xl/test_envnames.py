"""xl's environment variables are named once (xl.envnames) and each one a person may set or a rank
gets is documented (docs/contracts.md, docs/multinode.md); host:port is written once
(xl.address)."""

from __future__ import annotations

import pytest
from where import REPO

from xl import envnames
from xl.address import format_address, url_host

NAMES = {k: v for k, v in vars(envnames).items() if k.isupper() and isinstance(v, str)}
FOR_TESTS = {
    envnames.SIMULATED_GPUS,
    envnames.DEBUG_TIMING,
    envnames.DOCTOR_SHM,
    envnames.NODE_END_WAIT,
}


def test_each_name_is_its_variable() -> None:
    assert all(value == f"XL_{key}" for key, value in NAMES.items()), NAMES
    assert set(envnames.RUN_VARS) <= set(NAMES.values())


@pytest.mark.parametrize("name", sorted(set(NAMES.values()) - FOR_TESTS))
def test_each_variable_is_documented(name: str) -> None:
    docs = "".join((REPO / "docs" / page).read_text() for page in ("contracts.md", "multinode.md"))
    assert f"`{name}`" in docs, f"{name} is not in docs/contracts.md or docs/multinode.md"


@pytest.mark.parametrize(
    ("host", "port", "written"),
    [
        ("node0", 29500, "node0:29500"),
        ("10.0.0.2", 1, "10.0.0.2:1"),
        ("fd00::1", 29500, "[fd00::1]:29500"),
        ("[fd00::1]", 80, "[fd00::1]:80"),
    ],
)
def test_host_port_one_way(host: str, port: int, written: str) -> None:
    assert format_address(host, port) == written
    assert url_host(host) == written.rsplit(":", 1)[0]
