"""Kubernetes: two `xl launch` processes given only what a PyTorchJob gives its pods (PET_NNODES,
PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_NPROC_PER_NODE, and the run's token from a
Secret as XL_TOKEN) form one run, as two `torchrun` would; the dry run shows the multi-node
command; a flag on the command line wins over its variable, as in torchrun; a bad value is one
line naming the variable."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from procs import XL, rdzv_port, run_json, wait_no_processes, xl, xl_env
from twonodes import SCRIPT, TOKEN, cleanup, finish, run_events

pytestmark = pytest.mark.e2e


def _pod(port: int, node: int) -> dict[str, str]:
    return {
        "PET_NNODES": "2",
        "PET_NODE_RANK": str(node),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
        "PET_NPROC_PER_NODE": "1",
        "XL_TOKEN": TOKEN,
    }


def test_a_pytorchjob_s_variables_make_the_dry_run_multi_node(tmp_path: Path) -> None:
    (tmp_path / "mn.py").write_text(SCRIPT)
    env = xl_env(tmp_path / "home", **_pod(23456, 1))
    got = xl(["launch", "--dry-run", "--json", "mn.py"], env, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    argv = json.loads(got.stdout)["argv"]
    assert argv[argv.index("--nnodes") + 1] == "2", argv
    assert argv[argv.index("--rdzv-endpoint") + 1] == "127.0.0.1:23456", argv
    assert argv[argv.index("--nproc-per-node") + 1] == "1", argv
    # A flag given wins over its variable, as in torchrun.
    three = xl(["launch", "--dry-run", "--json", "--nproc", "3", "mn.py"], env, cwd=tmp_path)
    assert three.returncode == 0, three.stderr
    three_argv = json.loads(three.stdout)["argv"]
    assert three_argv[three_argv.index("--nproc-per-node") + 1] == "3", three_argv
    # Without any PET_* variable: one node, as before.
    plain = xl(["launch", "--dry-run", "--json", "mn.py"], xl_env(tmp_path / "h2"), cwd=tmp_path)
    plain_argv = json.loads(plain.stdout)["argv"]
    assert plain_argv[plain_argv.index("--nnodes") + 1] == "1", plain_argv


def test_a_bad_pet_value_is_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "mn.py").write_text(SCRIPT)
    env = xl_env(tmp_path / "home", **{**_pod(23456, 1), "PET_NODE_RANK": "one"})
    got = xl(["launch", "--dry-run", "mn.py"], env, cwd=tmp_path)
    assert got.returncode == 2 and got.stdout == "", got.stdout
    assert got.stderr.strip().splitlines() == [
        "xl launch: PET_NODE_RANK='one', torchrun's --node-rank: not a whole number"
    ]


def test_two_pods_given_a_pytorchjob_s_variables_form_one_run(tmp_path: Path) -> None:
    (tmp_path / "mn.py").write_text(SCRIPT)
    port = rdzv_port()
    homes = [tmp_path / "pod0", tmp_path / "pod1"]
    procs = []
    for node, home in enumerate(homes):
        argv = [*XL, "launch", "--no-tui", "mn.py"]  # the pod's command, nothing else
        procs.append(
            subprocess.Popen(
                argv,
                env=xl_env(home, MN_STEPS="3", **_pod(port, node)),
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        (code0, out0), (code1, out1) = finish(procs, timeout=180)
        assert (code0, code1) == (0, 0), out0 + out1
        [run0] = list((homes[0] / "runs").iterdir())
        [run1] = list((homes[1] / "runs").iterdir())
        record = run_json(run0)
        assert (record["nnodes"], record["node_rank"], record["world_size"]) == (2, 0, 2)
        assert run_json(run1)["node_rank"] == 1
        assert sorted((r["rank"], r["node_rank"]) for r in record["ranks"]) in (
            [(0, 0), (1, 1)],
            [(0, 1), (1, 0)],
        ), record["ranks"]
        assert all(r["state"] == "exited" for r in record["ranks"]), record["ranks"]
        # The pods' fingerprints were compared before the ranks started: alike, so not a word.
        assert record["env"]["compared"] == [0, 1] and record["env"]["diffs"] == []
        assert not [e for e in run_events(run0) if e["kind"] == "env_diff"]
        for run_dir in (run0, run1):
            wait_no_processes(run_dir, timeout=60)
    finally:
        cleanup((homes[0], homes[1]), procs)
