"""The run the app starts is the plan its Launch form showed: one plan a launch. A multi-node
run's rendezvous id comes from node 0's token, made only as the run starts, so the shown plan is
started with that id put in, and nothing else of it changes; start_run plans nothing itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from procs import free_port

from xl import envnames
from xl.launcher import control
from xl.launcher.plan import Plan, rdzv_id
from xl.launcher.spec import LaunchSpec
from xl.tui.backend import LocalBackend


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[LaunchSpec, Plan | None, Any]]:
    """start_run's calls, recorded instead of starting anything; a plan made there fails."""
    calls: list[tuple[LaunchSpec, Plan | None, Any]] = []

    def start_run(spec: LaunchSpec, plan: Plan | None = None, **kw: Any) -> str:
        calls.append((spec, plan, kw.get("env")))
        return "handle"

    def no_plan(*args: Any, **kwargs: Any) -> Plan:
        raise AssertionError("start_run planned again")

    monkeypatch.setattr(control, "start_run", start_run)
    monkeypatch.setattr(control, "build_plan", no_plan)
    monkeypatch.delenv(envnames.TOKEN, raising=False)
    return calls


def _shown(rdzv: str) -> Plan:
    host, port = rdzv.rsplit(":", 1)
    argv = [
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        rdzv,
        "--rdzv-id",
        rdzv_id(host, int(port), {}),
        "train.py",
    ]
    return Plan(argv=argv, env={"OMP_NUM_THREADS": "1"}, nproc=2, cwd="/work")


def test_node_0_of_several_starts_the_shown_plan_with_its_token_s_rendezvous_id(
    tmp_path: Path, started: list[Any]
) -> None:
    rdzv = f"127.0.0.1:{free_port()}"
    spec = LaunchSpec(
        script="train.py", nproc=2, nnodes=2, node_rank=0, rdzv=rdzv, cwd=str(tmp_path)
    )
    shown = _shown(rdzv)
    handle, join = LocalBackend().start(spec, shown)
    ((_, plan, env),) = started
    token = env[envnames.TOKEN]
    assert handle == "handle" and join is not None and token in join
    assert plan is not None and plan is not shown
    at = plan.argv.index("--rdzv-id")
    assert plan.argv[at + 1] == rdzv_id("ignored", 0, {envnames.TOKEN: token}) != shown.argv[at + 1]
    # Everything else is what the form showed.
    assert (
        plan.argv[: at + 1] == shown.argv[: at + 1] and plan.argv[at + 2 :] == shown.argv[at + 2 :]
    )
    assert (plan.env, plan.nproc, plan.cwd) == (shown.env, shown.nproc, shown.cwd)


def test_one_node_starts_the_shown_plan_as_it_is(tmp_path: Path, started: list[Any]) -> None:
    spec = LaunchSpec(script="train.py", nproc=2, cwd=str(tmp_path))
    shown = Plan(argv=["python", "-m", "torch.distributed.run", "train.py"], env={}, nproc=2)
    LocalBackend().start(spec, shown)
    ((_, plan, _),) = started
    assert plan is shown
