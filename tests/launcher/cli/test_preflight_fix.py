"""`xl launch`'s warnings about the chosen GPUs: a warning with a command says it as its fix; a
warning with none is its own words, never an empty ``(fix: )``."""

from __future__ import annotations

import pytest
from gpus import idle_gpu

from xl import envnames
from xl.gpu import health
from xl.gpu.health import Problem
from xl.gpu.inventory import Driver, Inventory
from xl.launcher.cli.preflight import check_launch
from xl.launcher.plan import Plan
from xl.launcher.spec import LaunchSpec


def _warnings(monkeypatch: pytest.MonkeyPatch, problems: list[Problem]) -> list[str]:
    monkeypatch.setenv(envnames.SIMULATED_GPUS, "1")  # no torch to ask: the GPUs' words alone
    monkeypatch.setattr(health, "health", lambda indices: {})
    monkeypatch.setattr(health, "judge_all", lambda gpus, found: {0: problems})
    plan = Plan(argv=["torchrun"], env={}, devices=[idle_gpu(0)], nproc=1)
    inv = Inventory(Driver("570.124.06", "12.8"), (idle_gpu(0),))
    check_launch(LaunchSpec(script="train.py"), plan, inv, gpus_given=True)
    return plan.warnings


def test_a_gpu_warning_says_its_command_and_one_without_says_no_empty_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_fix = Problem("warn", "GPU 0 is in use by pid 42 (python)", "kill 42")
    said = _warnings(monkeypatch, [with_fix])
    assert said == ["GPU 0 is in use by pid 42 (python) (fix: kill 42)"]
    none = Problem("fail", "GPU 0 failed to remap a memory row: it needs replacing", "")
    assert _warnings(monkeypatch, [none]) == [
        "xl doctor calls this a failure: GPU 0 failed to remap a memory row: it needs replacing"
    ]
