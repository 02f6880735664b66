"""One environment across nodes, for real: two and three `xl launch` nodes on loopback
(tests/support/twonodes.py's script, CPU/gloo ranks), one node given an environment of its own.

A difference that breaks a run (an NCCL_SOCKET_IFNAME naming no interface there, another torch)
stops the launch before any rank starts, naming that node, what it has, what the others have and
the fix, on every node, exit 1; ``--allow-env-diff`` starts it anyway. A difference that slows or
unsettles a run (an NCCL variable on one node only) is a warning and the run trains. Nodes that
differ only in what does not matter (their XL_HOME, unrelated variables, NCCL_DEBUG) say nothing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from procs import first_run, rdzv_port, run_json, wait_for, wait_no_processes
from simnvml import SimGPU
from twonodes import SCRIPT, cleanup, finish, launch_node, run_events

pytestmark = pytest.mark.e2e

# A torch as the doctor's probe reads it (torch/version.py, its dist-info, the NCCL wheel beside
# it), put first on one node's PYTHONPATH: that node's ranks would import another torch.
FAKE_TORCH_VERSION = "2.12.1+cu126"
FAKE_NCCL = "2.26.2"


def _fake_torch(site: Path) -> Path:
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('a fake torch')\n")
    (site / "torch" / "version.py").write_text(
        f"__version__ = '{FAKE_TORCH_VERSION}'\ncuda = '12.6'\nhip = None\n"
    )
    (site / "torch-2.12.1.dist-info").mkdir()
    (site / "torch-2.12.1.dist-info" / "METADATA").write_text(
        f"Name: torch\nVersion: 2.12.1\nRequires-Dist: nvidia-nccl-cu12=={FAKE_NCCL}\n"
    )
    (site / f"nvidia_nccl_cu12-{FAKE_NCCL}.dist-info").mkdir()
    return site


def _start(
    tmp_path: Path, envs: list[dict[str, str]], *extra: str, steps: str = "3"
) -> tuple[list[subprocess.Popen[str]], list[Path]]:
    """Every node's `xl launch --no-tui` at once (each its own XL_HOME), one CPU rank each."""
    (tmp_path / "mn.py").write_text(SCRIPT)
    rdzv = f"127.0.0.1:{rdzv_port()}"
    homes = [tmp_path / f"node{n}" for n in range(len(envs))]
    procs = [
        launch_node(
            tmp_path, home, node, rdzv, *extra, nnodes=len(envs), MN_WORLD=str(len(envs)),
            MN_STEPS=steps, **own,
        )
        for node, (home, own) in enumerate(zip(homes, envs, strict=True))
    ]  # fmt: skip
    return procs, homes


def _run_dir(home: Path) -> Path:
    [run_dir] = list((home / "runs").iterdir())
    return run_dir


def _diffs(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in run_events(run_dir) if e["kind"] == "env_diff"]


def _node_lines(out: str, node: int) -> list[str]:
    """The view's lines about one odd node (its failure line names it too, in brief)."""
    return [
        line for line in out.splitlines() if f"xl: node {node} (" in line and " differs [" in line
    ]


def _gone(homes: list[Path]) -> None:
    for home in homes:
        wait_no_processes(_run_dir(home), timeout=60)


def test_an_interface_node_1_lacks_stops_the_launch_before_any_rank(tmp_path: Path) -> None:
    procs, homes = _start(tmp_path, [{}, {"NCCL_SOCKET_IFNAME": "=xlnosuch9"}])
    try:
        (code0, out0), (code1, out1) = finish(procs, timeout=120)
        assert (code0, code1) == (1, 1), out0 + out1
        run0, run1 = _run_dir(homes[0]), _run_dir(homes[1])
        [diff] = _diffs(run0)
        assert diff["node"] == 1 and diff["field"] == "nccl_ifaces", diff
        assert diff["severity"] == "stop" and diff["value"] == "" and diff["others"], diff
        assert diff["fix"] == "unset NCCL_SOCKET_IFNAME", diff
        # The variable's own value differs too, which alone would not matter: said once.
        assert [d["field"] for d in _diffs(run0)] == ["nccl_ifaces"]
        record = run_json(run0)
        assert record["status"] == "failed" and record["env"]["diffs"] == [
            {k: diff[k] for k in ("node", "host", "field", "value", "others", "severity", "fix")}
        ]
        prints = json.loads((run0 / "fingerprints.json").read_text())
        assert sorted(prints) == ["0", "1"]
        assert prints["1"]["ifname"] == "=xlnosuch9" and prints["0"]["ifname"] is None
        # Node 0 says which node, what it has and the fix, and why the run ended; node 1 too.
        [line] = _node_lines(out0, 1)
        assert "differs [stops the run]: interfaces NCCL_SOCKET_IFNAME selects none" in line
        assert line.endswith("; fix there: unset NCCL_SOCKET_IFNAME"), line
        assert "--allow-env-diff" in out0 and "--allow-env-diff" in out1, out1
        assert "node 1 (" in out1, out1
        # No rank started anywhere: node 0 decided before its torchrun (the rendezvous) began.
        for run_dir in (run0, run1):
            assert not list((run_dir / "ranks").glob("rank-*.json")), run_dir
            assert "rank_started" not in {e["kind"] for e in run_events(run_dir)}
        _gone(homes)
    finally:
        cleanup((homes[0], homes[1]), procs)


def test_a_node_that_differs_in_two_fields_is_one_line_naming_both(tmp_path: Path) -> None:
    """Node 1 has an interface it lacks and another torch: one env_diff event a field, one
    line for the node with each field, its value beside the others' and each fix; node 0,
    alike with itself, is never named."""
    site = _fake_torch(tmp_path / "site")
    envs = [{}, {"NCCL_SOCKET_IFNAME": "=xlnosuch9", "PYTHONPATH": str(site)}]
    procs, homes = _start(tmp_path, envs)
    try:
        (code0, out0), (code1, out1) = finish(procs, timeout=120)
        assert (code0, code1) == (1, 1), out0 + out1
        run0 = _run_dir(homes[0])
        fields = [d["field"] for d in _diffs(run0)]
        assert sorted(fields) == ["nccl_ifaces", "torch", "torch_cuda"], fields
        assert run_json(run0)["env"]["diffs"] == [
            {k: d[k] for k in ("node", "host", "field", "value", "others", "severity", "fix")}
            for d in _diffs(run0)
        ]
        [line] = _node_lines(out0, 1)
        assert "interfaces NCCL_SOCKET_IFNAME selects none (others " in line, line
        assert f"torch {FAKE_TORCH_VERSION} (others 2.13" in line, line
        assert "torch's CUDA 12.6 (others none)" in line, line
        assert "fix there: unset NCCL_SOCKET_IFNAME; " in line, line
        assert "-m pip install --force-reinstall torch==" in line, line
        assert "where the others have" not in out0, out0  # no line a field
        assert not _node_lines(out0, 0) and "node 0 (" not in out0, out0
        # The failure, on both nodes: the odd node and its fields, in one line.
        failure = run_json(run0)["failure"]["message"]
        assert "node 1 (" in failure and "torch, torch's CUDA" in failure, failure
        assert failure.endswith("start anyway with --allow-env-diff"), failure
        assert failure in out1 and not _node_lines(out1, 1), out1
        _gone(homes)
    finally:
        cleanup((homes[0], homes[1]), procs)


def test_allow_env_diff_starts_the_run_anyway(tmp_path: Path) -> None:
    procs, homes = _start(tmp_path, [{}, {"NCCL_SOCKET_IFNAME": "=xlnosuch9"}], "--allow-env-diff")
    try:
        (code0, out0), (code1, out1) = finish(procs, timeout=180)
        assert (code0, code1) == (0, 0), out0 + out1  # gloo does not read NCCL_SOCKET_IFNAME
        run0 = _run_dir(homes[0])
        assert [(d["node"], d["severity"]) for d in _diffs(run0)] == [(1, "stop")]
        assert "fix there: unset NCCL_SOCKET_IFNAME" in out0, out0
        assert run_json(run0)["status"] == "succeeded"
        _gone(homes)
    finally:
        cleanup((homes[0], homes[1]), procs)


def test_an_nccl_variable_on_one_node_only_warns_and_the_run_trains(tmp_path: Path) -> None:
    procs, homes = _start(tmp_path, [{"NCCL_IB_DISABLE": "1"}, {}])
    try:
        (code0, out0), (code1, out1) = finish(procs, timeout=180)
        assert (code0, code1) == (0, 0), out0 + out1
        run0 = _run_dir(homes[0])
        # With two nodes the others' value is node 0's (a tie): node 1 lacks the variable.
        [diff] = _diffs(run0)
        assert (diff["node"], diff["field"], diff["severity"]) == (1, "env.NCCL_IB_DISABLE", "warn")
        assert (diff["value"], diff["others"], diff["fix"]) == (
            None,
            "1",
            "export NCCL_IB_DISABLE=1",
        )
        [line] = _node_lines(out0, 1)
        assert line.endswith(
            " differs [warning]: NCCL_IB_DISABLE unset (others 1); "
            "fix there: export NCCL_IB_DISABLE=1"
        ), line
        assert not _node_lines(out0, 0) and not _node_lines(out1, 1), out0 + out1
        assert run_json(run0)["status"] == "succeeded"
        _gone(homes)
    finally:
        cleanup((homes[0], homes[1]), procs)


def test_three_nodes_one_with_another_torch_is_named_alone(tmp_path: Path) -> None:
    """Node 2's ranks would import another torch (its PYTHONPATH): node 2 is named with torch's
    version, its CUDA and its NCCL, each with the others' and the fix; nodes 0 and 1, alike
    though their unrelated variables and XL_HOME differ, are not named."""
    site = _fake_torch(tmp_path / "site")
    envs = [{"XL_SOMETHING": "a"}, {"NCCL_DEBUG": "INFO"}, {"PYTHONPATH": str(site)}]
    procs, homes = _start(tmp_path, envs)
    try:
        results = finish(procs, timeout=120)
        assert [code for code, _ in results] == [1, 1, 1], results
        out0 = results[0][1]
        run0 = _run_dir(homes[0])
        diffs = _diffs(run0)
        assert {d["node"] for d in diffs} == {2}, diffs
        by_field = {d["field"]: d for d in diffs}
        torch = by_field["torch"]
        assert torch["value"] == FAKE_TORCH_VERSION and torch["severity"] == "stop", torch
        assert torch["others"].startswith("2.13"), torch
        assert "-m pip install --force-reinstall torch==" in torch["fix"], torch
        assert "--index-url https://download.pytorch.org/whl/cpu" in torch["fix"], torch
        cuda = by_field["torch_cuda"]
        assert (cuda["value"], cuda["others"], cuda["severity"]) == ("12.6", None, "stop")
        # Its NCCL is not compared: the others' CPU torch loads none.
        assert "nccl" not in by_field
        # One line for node 2, with both fields; the failure that ends the launch names node 2
        # alone.
        [line] = _node_lines(out0, 2)
        assert "torch " in line and "torch's CUDA 12.6 (others none)" in line, line
        said = run_json(run0)["failure"]["message"]
        assert "node 2 (" in said and "in torch, torch's CUDA;" in said, said
        assert "node 0 (" not in out0 and "node 1 (" not in out0, out0
        assert "node 2 (" in results[1][1] and "node 2 (" in results[2][1], results
        _gone(homes)
    finally:
        cleanup((homes[0], homes[1]), procs)
        for home in homes[2:]:
            cleanup((home, home))


def test_nodes_that_differ_in_nothing_that_matters_say_nothing(tmp_path: Path) -> None:
    procs, homes = _start(
        tmp_path,
        [{"XL_SOMETHING": "a", "NCCL_DEBUG": "WARN"}, {"OTHER_VAR": "b", "NCCL_DEBUG": "INFO"}],
    )
    try:
        (code0, out0), (code1, out1) = finish(procs, timeout=180)
        assert (code0, code1) == (0, 0), out0 + out1
        run0 = _run_dir(homes[0])
        assert _diffs(run0) == [] and run_json(run0)["env"]["diffs"] == []
        assert run_json(run0)["env"]["compared"] == [0, 1]
        assert "differs" not in out0 and "(others " not in out0, out0
        assert "differs" not in out1 and "(others " not in out1, out1
        _gone(homes)
    finally:
        cleanup((homes[0], homes[1]), procs)


def test_a_node_that_joins_after_node_0_stopped_waiting_is_judged_as_it_comes(
    tmp_path: Path,
) -> None:
    """Node 0 waits XL_NODE_TIMEOUT (3 s here) for the nodes, then starts its rendezvous; node 1,
    started later with an interface it lacks, is judged as its link comes, before any rank of
    the run starts, and the launch ends on both nodes."""
    (tmp_path / "mn.py").write_text(SCRIPT)
    rdzv = f"127.0.0.1:{rdzv_port()}"
    homes = [tmp_path / "node0", tmp_path / "node1"]

    def launch(node: int, **own: str) -> subprocess.Popen[str]:
        return launch_node(tmp_path, homes[node], node, rdzv, **own)

    procs = [launch(0, XL_NODE_TIMEOUT="3")]
    try:
        run0 = wait_for(lambda: first_run(homes[0]), timeout=60, what="node 0's run")
        wait_for(lambda: run_json(run0).get("torchrun_pid"), timeout=60, what="node 0's torchrun")
        procs.append(launch(1, NCCL_SOCKET_IFNAME="=xlnosuch9"))
        (code0, out0), (code1, out1) = finish(procs, timeout=120)
        assert (code0, code1) == (1, 1), out0 + out1
        [diff] = _diffs(run0)
        assert (diff["node"], diff["field"], diff["severity"]) == (1, "nccl_ifaces", "stop")
        assert "fix there: unset NCCL_SOCKET_IFNAME" in out0 and "--allow-env-diff" in out1
        for run_dir in (run0, _run_dir(homes[1])):
            assert not list((run_dir / "ranks").glob("rank-*.json")), run_dir
        _gone(homes)
    finally:
        cleanup((homes[0], homes[1]), procs)


def test_nodes_on_simulated_gpus_of_another_model_warn_and_train(
    tmp_path: Path, simnvml: Any
) -> None:
    """Each node's NVML (the simulated driver, one H100 on node 0, one A100 on node 1): another
    GPU model is a warning with no fix, the run trains; the driver, alike, says nothing."""
    h100 = simnvml(gpus=[SimGPU(model="H100")], driver_version="570.86.15", cuda_version=12080)
    a100 = simnvml(gpus=[SimGPU(model="A100")], driver_version="570.86.15", cuda_version=12080)
    procs, homes = _start(tmp_path, [dict(h100.env), dict(a100.env)])
    try:
        (code0, out0), (code1, out1) = finish(procs, timeout=180)
        assert (code0, code1) == (0, 0), out0 + out1
        run0 = _run_dir(homes[0])
        by_field = {d["field"]: d for d in _diffs(run0)}
        model = by_field["gpu_model"]
        assert (model["node"], model["severity"], model["fix"]) == (1, "warn", None)
        assert "A100" in model["value"] and "H100" in model["others"], model
        assert not {"driver", "driver_cuda", "gpu_count"} & set(by_field), by_field
        assert all(d["severity"] == "warn" for d in by_field.values()), by_field
        prints = json.loads((run0 / "fingerprints.json").read_text())
        assert prints["0"]["fields"]["gpu_count"] == prints["1"]["fields"]["gpu_count"] == 1
        assert prints["0"]["fields"]["driver"] == "570"
        _gone(homes)
    finally:
        cleanup((homes[0], homes[1]), procs)
