"""XL_* tunables: one rule for every one of them (xl/settings.py), seen through real users of it."""

from __future__ import annotations

import pytest

from xl import settings
from xl.launcher.supervisor.hub import node_timeout
from xl.launcher.supervisor.stopping import grace_from_env
from xl.launcher.telemetry.diagnose import Thresholds


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, 10.0),
        ("3.5", 3.5),
        ("-1", 0.0),
        ("soon", 10.0),
        ("nan", 10.0),
        ("inf", 10.0),
        ("0", 0.0),
    ],
)
def test_stop_grace(monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: float) -> None:
    if raw is None:
        monkeypatch.delenv("XL_STOP_GRACE", raising=False)
    else:
        monkeypatch.setenv("XL_STOP_GRACE", raw)
    assert grace_from_env() == expected


def test_node_timeout_has_a_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XL_NODE_TIMEOUT", "0.1")
    assert node_timeout() == 2.0
    monkeypatch.setenv("XL_NODE_TIMEOUT", "45")
    assert node_timeout() == 45.0


def test_diagnosis_thresholds_refuse_zero_and_garbage() -> None:
    t = Thresholds.from_env(
        {"XL_STALL_MIN_S": "0", "XL_STALL_FACTOR": "inf", "XL_GPU_MEM_HIGH": "0.8"}
    )
    assert (t.stall_min_s, t.stall_factor, t.gpu_mem_high) == (30.0, 10.0, 0.8)


def test_the_rule() -> None:
    env = {"A": "2", "B": "x", "C": "-3"}
    assert settings.number("A", 1.0, env=env) == 2.0
    assert settings.number("B", 1.0, env=env) == 1.0
    assert settings.number("C", 1.0, env=env) == -3.0
    assert settings.number("C", 1.0, floor=0.0, env=env) == 0.0
    assert settings.number("C", 1.0, positive=True, env=env) == 1.0
    assert settings.number("MISSING", 7.0, env=env) == 7.0
