"""`xl launch` reads the GPUs once and plans once: the plan, the checks of its GPUs (the busy
ones are said) and run.json all see the same moment of the machine, and the launch does not pay
for a second NVML sweep or plan. Run in-process on the simulated driver, counting NVML sweeps."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from xl import envnames
from xl.gpu import nvml
from xl.launcher import plan as plan_module
from xl.launcher.cli import launch
from xl.launcher.cli.options import cpu_cores
from xl.launcher.multinode.join import make_token, prepare_launch
from xl.launcher.spec import LaunchSpec


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, int]]:
    counts = {"sweeps": 0, "plans": 0}
    sweep, build = nvml._sweep, plan_module.build_plan

    def counted_sweep(*args: object, **kwargs: object) -> nvml.Inventory:
        counts["sweeps"] += 1
        return sweep(*args, **kwargs)  # type: ignore[arg-type]

    def counted_build(*args: object, **kwargs: object) -> plan_module.Plan:
        counts["plans"] += 1
        return build(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(nvml, "_sweep", counted_sweep)
    monkeypatch.setattr(launch, "build_plan", counted_build)
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # The simulated driver's GPUs are run by this CPU torch (as under `xl demo` in the tests).
    monkeypatch.setenv(envnames.SIMULATED_GPUS, "1")
    yield counts


def _dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[dict[str, object], str]:
    assert launch.main(["--dry-run", "--json", *args]) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_a_launch_on_busy_gpus_sweeps_once_and_still_says_they_are_busy(
    counted: dict[str, int], simnvml, simnvml_gpu, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = simnvml(gpus=[simnvml_gpu(util_gpu=95), simnvml_gpu()])
    with sim.in_process():
        plan, err = _dry_run(capsys, "--gpus", "0,1", "train.py")
    assert plan["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"  # type: ignore[index]
    # The check of the chosen GPUs read the same sweep the plan was made from.
    assert "GPU 0 is 95% busy" in err and "GPU 1" not in err, err
    assert counted == {"sweeps": 1, "plans": 1}


def test_healthy_gpus_are_planned_once_without_a_word(
    counted: dict[str, int], simnvml, capsys: pytest.CaptureFixture[str]
) -> None:
    with simnvml(gpus=2).in_process():
        plan, err = _dry_run(capsys, "train.py")
    assert plan["env"]["CUDA_VISIBLE_DEVICES"] == "0,1" and err == ""  # type: ignore[index]
    assert counted == {"sweeps": 1, "plans": 1}


def test_nproc_auto_on_cpu_is_every_core_planned_once(
    counted: dict[str, int], simnvml, capsys: pytest.CaptureFixture[str]
) -> None:
    with simnvml(gpus=1, init_error="driver_not_loaded").in_process():
        plan, _ = _dry_run(capsys, "--nproc-per-node", "auto", "train.py")
    argv = plan["argv"]
    assert isinstance(argv, list)
    assert argv[argv.index("--nproc-per-node") + 1] == str(cpu_cores())
    assert counted["plans"] == 1


def test_nproc_gpu_on_cpu_is_refused_after_the_spec_s_own_checks(
    counted: dict[str, int], simnvml
) -> None:
    with simnvml(gpus=1, init_error="driver_not_loaded").in_process():
        # A wrong spec is said first, as before: the count of ranks is asked last.
        with pytest.raises(Exception, match="--nnodes > 1 needs --rdzv"):
            launch.main(["--dry-run", "--nproc-per-node", "gpu", "--nnodes", "2", "train.py"])
        with pytest.raises(Exception, match="no GPU is chosen here"):
            launch.main(["--dry-run", "--nproc-per-node", "gpu", "train.py"])


def _rdzv() -> str:
    """An --rdzv whose next port (node 0's collector's) is free here."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1] - 1}"


def test_node_0_makes_its_token_before_its_plan_and_prints_it() -> None:
    spec = LaunchSpec(script="train.py", nnodes=2, node_rank=0, rdzv=_rdzv())
    env: dict[str, str] = {}
    assert make_token(spec, env) is True
    token = env["XL_TOKEN"]
    assert make_token(spec, env) is False and env["XL_TOKEN"] == token  # made once
    text = prepare_launch(spec, env, made=True)
    assert text is not None and token in text and env["XL_TOKEN"] == token


def test_a_token_the_person_gave_is_kept_and_not_printed() -> None:
    spec = LaunchSpec(script="train.py", nnodes=2, node_rank=0, rdzv=_rdzv())
    given = "g" * 32
    env = {"XL_TOKEN": given}
    assert make_token(spec, env) is False
    text = prepare_launch(spec, env, made=False)
    assert text is not None and given not in text and env["XL_TOKEN"] == given
    # Another node never makes one: it must be given node 0's.
    assert make_token(LaunchSpec(script="train.py", nnodes=2, node_rank=1, rdzv="h:1"), {}) is False
