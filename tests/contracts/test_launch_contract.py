"""Contract: `xl launch --dry-run --json` (docs/contracts.md, "`xl launch --dry-run --json`").

The full document `{"argv": [...], "env": {...}}` for a set of specs is pinned against
fixtures/dry_run.json, recorded from the code before the package moves. Volatile parts are
normalised: the interpreter (``sys.executable``) becomes ``<python>``. The GPUs are simulated
(tests/support/simnvml.py), so every machine gives the same answers; "no driver" is the simulated
driver failing nvmlInit with library_not_found, which is what a machine without one looks like.

Also pinned: the rendezvous id of a multi-node run is ``xl-`` and the first 12 hex digits of the
SHA-256 of XL_TOKEN (docs/multinode.md, "The rendezvous"), the token never reaches the printed
command, and bad specs exit 2 with one line on stderr.

Re-record the fixture on purpose (a contract change) with ``XL_CONTRACTS_RECORD=1``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import simnvml as _sim
from golden import golden_entry

pytestmark = pytest.mark.e2e

XL = [sys.executable, "-m", "xl"]
UUID = _sim.default_uuid

# Free memory decides `auto:N`: GPU 4 is emptiest, then 2, then 5.
BUSY_MIB = [40000, 30000, 1000, 20000, 0, 10000, 50000, 60000]

# name -> (xl launch arguments after `--dry-run --json`, driver setup, extra environment)
CASES: dict[str, tuple[list[str], str, dict[str, str]]] = {
    "gpus_0_2": (["--gpus", "0,2", "train.py", "--lr", "1e-3"], "8", {}),
    "gpus_2_0_order_kept": (["--gpus", "2,0", "train.py"], "8", {}),
    "gpus_uuid_and_index": (["--gpus", f"{UUID(5)},1", "train.py"], "8", {}),
    "gpus_all": (["--gpus", "all", "train.py"], "8", {}),
    "gpus_auto_2": (["--gpus", "auto:2", "train.py"], "8busy", {}),
    "no_gpus_flag": (["train.py"], "8", {}),
    "no_gpus_flag_cuda_visible_devices": (["train.py"], "8", {"CUDA_VISIBLE_DEVICES": "3,1"}),
    "cpu_nproc_2": (["--nproc", "2", "train.py"], "none", {}),
    "cpu_default": (["train.py"], "none", {}),
    "env": (["--gpus", "1", "--env", "K=V", "--env", "A=b=c", "train.py"], "8", {}),
    "mixed_precision_bf16": (["--gpus", "0", "--mixed-precision", "bf16", "train.py"], "8", {}),
    "mixed_precision_fp16_cpu": (
        ["--nproc", "1", "--mixed-precision", "fp16", "train.py"],
        "none",
        {},
    ),
    "module": (["--gpus", "0,1", "-m", "contract_pkg.train", "--epochs", "3"], "8", {}),
    "script_args_after_separator": (
        ["--gpus", "0", "--", "train.py", "--gpus", "7", "-m", "x"],
        "8",
        {},
    ),
    "name_detach_no_tui": (
        ["--gpus", "0", "--name", "n1", "--detach", "--no-tui", "train.py"],
        "8",
        {},
    ),
    "multinode_node1": (
        ["--nnodes", "2", "--node-rank", "1", "--rdzv", "host:29500", "--gpus", "0", "train.py"],
        "8",
        {},
    ),
    "multinode_node0_token": (
        [
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--rdzv",
            "10.0.0.1:29500",
            "--nproc",
            "2",
            "train.py",
        ],
        "8",
        {"XL_TOKEN": "contract-token-0123456789abcdef"},
    ),
    "multinode_node1_token": (
        [
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--rdzv",
            "10.0.0.1:29500",
            "--nproc",
            "2",
            "train.py",
        ],
        "8",
        {"XL_TOKEN": "contract-token-0123456789abcdef"},
    ),
}



def _env(extra: dict[str, str], sim_env: dict[str, str]) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("XL_", "CUDA_", "ACCELERATE_", "SLURM_", "HF_", "NCCL_"))
        and k not in ("LD_LIBRARY_PATH", "RANK", "LOCAL_RANK", "WORLD_SIZE")
    }
    env.update(sim_env)
    env.update(extra)
    return env


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('train')\n")
    pkg = tmp_path / "contract_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("print('train')\n")
    (tmp_path / "home").mkdir()
    return tmp_path


def _driver(simnvml: Callable[..., Any], setup: str) -> dict[str, str]:
    if setup == "none":
        return dict(simnvml(gpus=0, init_error="library_not_found").env)
    if setup == "8busy":
        gpus = [_sim.SimGPU(memory_used_mib=m) for m in BUSY_MIB]
        return dict(simnvml(gpus=gpus).env)
    return dict(simnvml(gpus=int(setup)).env)


def _dry_run(
    args: Sequence[str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    env = {**env, "XL_HOME": str(cwd / "home")}
    return subprocess.run(
        [*XL, "launch", "--dry-run", "--json", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def _normalised(doc: dict[str, Any]) -> dict[str, Any]:
    argv = list(doc["argv"])
    assert argv[0] == sys.executable, argv
    argv[0] = "<python>"
    return {**doc, "argv": argv}


@pytest.mark.parametrize("case", list(CASES))
def test_dry_run_json(case: str, simnvml: Callable[..., Any], workdir: Path) -> None:
    args, setup, extra = CASES[case]
    proc = _dry_run(args, _env(extra, _driver(simnvml, setup)), workdir)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert sorted(doc) == ["argv", "env"]
    assert all(isinstance(v, str) for v in doc["env"].values())
    # Starts nothing: no run dir.
    assert not (workdir / "home" / "runs").exists() or not any(
        (workdir / "home" / "runs").iterdir()
    )
    # The token stays in the environment: never on the command line nor in the printed env.
    token = extra.get("XL_TOKEN")
    if token:
        assert token not in proc.stdout
    golden_entry("dry_run.json", case, _normalised(doc))


def test_multinode_rendezvous_id_is_derived_from_the_token(
    simnvml: Callable[..., Any], workdir: Path
) -> None:
    token = "another-contract-token-42"
    env = _env({"XL_TOKEN": token}, _driver(simnvml, "8"))
    ids = []
    for node_rank in ("0", "1"):
        args = [
            "--nnodes",
            "2",
            "--node-rank",
            node_rank,
            "--rdzv",
            "10.0.0.1:29500",
            "--gpus",
            "0",
            "train.py",
        ]
        proc = _dry_run(args, env, workdir)
        assert proc.returncode == 0, proc.stderr
        argv = json.loads(proc.stdout)["argv"]
        ids.append(argv[argv.index("--rdzv-id") + 1])
        assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29500"
        assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
        assert argv[argv.index("--rdzv-conf") + 1] == f"is_host={1 if node_rank == '0' else 0}"
    expected = "xl-" + hashlib.sha256(token.encode()).hexdigest()[:12]
    assert ids == [expected, expected]


BAD = {
    "unknown_index": ["--gpus", "9", "train.py"],
    "duplicate": ["--gpus", "0,0", "train.py"],
    "unknown_uuid": ["--gpus", "GPU-nope", "train.py"],
    "auto_too_many": ["--gpus", "auto:9", "train.py"],
    "bad_precision": ["--mixed-precision", "fp32", "train.py"],
    "env_without_equals": ["--env", "KV", "train.py"],
    "nnodes_without_rdzv": ["--nnodes", "2", "train.py"],
    "no_such_script": ["--gpus", "0", "nosuch.py"],
    "no_such_module": ["--gpus", "0", "-m", "no_such_contract_module"],
    "nproc_zero": ["--nproc", "0", "train.py"],
    "nproc_over_gpus": ["--nproc", "3", "--gpus", "0,1", "train.py"],
    "no_script": ["--gpus", "0"],
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_launch_specs_are_bad_usage(
    case: str, simnvml: Callable[..., Any], workdir: Path
) -> None:
    proc = _dry_run(BAD[case], _env({}, _driver(simnvml, "8")), workdir)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("xl launch: "), proc.stderr
    assert "Traceback" not in proc.stderr
