"""`xl doctor --nodes`, for real: the real `xl` asks each host over `ssh`, here a stand-in on
PATH that runs the command on this machine with that host's own environment (its variables, its
PYTHONPATH); each difference is named on the right node with its fix, alike hosts say nothing,
a host that cannot be reached is said, and inside a Slurm allocation its nodes are asked."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from procs import XL

pytestmark = pytest.mark.e2e

FAKE_SSH = r"""#!/bin/sh
# ssh as xl doctor --nodes runs it: ssh -o ... -- HOST COMMAND
echo "$*" >> "$FAKE_SSH_DIR/calls"
while [ $# -gt 0 ]; do
  case "$1" in -o) shift 2;; --) shift; break;; -*) shift;; *) break;; esac
done
host=$1; shift
if [ -f "$FAKE_SSH_DIR/$host.down" ]; then
  echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255
fi
set -a; [ -f "$FAKE_SSH_DIR/$host.env" ] && . "$FAKE_SSH_DIR/$host.env"; set +a
exec sh -c "$*"
"""
FAKE_SCONTROL = r"""#!/bin/sh
[ "$1 $2" = "show hostnames" ] && printf '%s\n' $FAKE_ALLOCATION && exit 0
exit 1
"""


def _hosts(tmp_path: Path, envs: dict[str, dict[str, str]]) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("ssh", FAKE_SSH), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    for host, env in envs.items():
        if env.get("DOWN"):
            (hosts / f"{host}.down").write_text("")
        (hosts / f"{host}.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NCCL_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", FAKE_SSH_DIR=str(hosts))
    return env


def _doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*XL, "doctor", "--nodes", *args], env=env, capture_output=True, text=True, timeout=120
    )


def _fake_torch(site: Path) -> Path:
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "version.py").write_text("__version__ = '2.12.1+cpu'\ncuda = None\n")
    return site


def test_the_odd_host_is_named_with_its_difference_and_fix(tmp_path: Path) -> None:
    site = _fake_torch(tmp_path / "site")
    env = _hosts(
        tmp_path,
        {
            "gpu-a": {"UNRELATED": "1"},
            "gpu-b": {"NCCL_DEBUG": "INFO"},
            "gpu-c": {"NCCL_ALGO": "Tree", "PYTHONPATH": str(site)},
        },
    )
    got = _doctor(env, "gpu-a", "gpu-b", "gpu-c")
    assert got.returncode == 1, got.stdout + got.stderr
    # One line for the odd node, all it differs in: as `xl launch` prints it.
    node, verdict = got.stdout.splitlines()
    odd = "node 2 (gpu-c) differs [stops the run]: torch 2.12.1+cpu (others "
    assert node.startswith(odd), node
    assert ", NCCL_ALGO Tree (others unset); fix there: " in node and "pip install" in node
    assert node.endswith("; unset NCCL_ALGO"), node
    assert verdict.startswith("a run across these nodes cannot work")
    # every host asked non-interactively, with a connection timeout
    calls = (tmp_path / "hosts" / "calls").read_text().splitlines()
    assert len(calls) == 3 and all("-o BatchMode=yes -o ConnectTimeout=10 --" in c for c in calls)
    # --json: the same diff objects as a launch's env_diff events
    doc = json.loads(_doctor(env, "gpu-a", "gpu-b", "gpu-c", "--json").stdout)
    assert [(d["node"], d["host"], d["field"], d["severity"]) for d in doc["diffs"]] == [
        (2, "gpu-c", "torch", "stop"),
        (2, "gpu-c", "env.NCCL_ALGO", "warn"),
    ], doc["diffs"]
    assert set(doc["diffs"][0]) == {"node", "host", "field", "value", "others", "severity", "fix"}


def test_alike_hosts_say_so_and_exit_0_and_a_warning_alone_exits_0(tmp_path: Path) -> None:
    env = _hosts(tmp_path, {"a": {"HOME_ONLY": "x"}, "b": {"NCCL_DEBUG": "WARN"}, "c": {}})
    got = _doctor(env, "a", "b")
    assert got.returncode == 0, got.stdout + got.stderr
    assert got.stdout == "2 nodes alike in everything a run needs to match\n"
    (tmp_path / "hosts" / "c.env").write_text("NCCL_IB_DISABLE=1\n")
    warned = _doctor(env, "a", "b", "c")
    assert warned.returncode == 0 and warned.stdout.splitlines()[0] == (
        "node 2 (c) differs [warning]: NCCL_IB_DISABLE 1 (others unset); "
        "fix there: unset NCCL_IB_DISABLE"
    ), warned.stdout


def test_each_odd_node_is_one_line_with_all_it_differs_in(tmp_path: Path) -> None:
    """Two odd nodes of four: a line each, by node, the one with two differences on one line;
    the nodes alike are not named."""
    env = _hosts(
        tmp_path,
        {
            "n0": {},
            "n1": {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"},
            "n2": {},
            "n3": {"NCCL_IB_DISABLE": "1"},
        },
    )
    got = _doctor(env, "n0", "n1", "n2", "n3")
    assert got.returncode == 0, got.stdout + got.stderr
    assert got.stdout.splitlines() == [
        "node 1 (n1) differs [warning]: NCCL_ALGO Tree (others unset), NCCL_PROTO Simple "
        "(others unset); fix there: unset NCCL_ALGO; unset NCCL_PROTO",
        "node 3 (n3) differs [warning]: NCCL_IB_DISABLE 1 (others unset); "
        "fix there: unset NCCL_IB_DISABLE",
    ], got.stdout


def test_a_host_that_cannot_be_reached_is_said_and_fails(tmp_path: Path) -> None:
    env = _hosts(tmp_path, {"a": {}, "down": {"DOWN": "1"}})
    got = _doctor(env, "a", "down")
    assert got.returncode == 1, got.stdout
    assert got.stdout.splitlines()[0] == (
        "node 1 (down): could not be asked (ssh: connect to host down port 22: Connection refused)"
    ), got.stdout
    assert "Traceback" not in got.stderr


def test_inside_an_allocation_its_nodes_are_asked(tmp_path: Path) -> None:
    env = _hosts(tmp_path, {"gpu07": {}, "gpu08": {"NCCL_ALGO": "Ring"}})
    env.update(SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="gpu[07-08]", FAKE_ALLOCATION="gpu07 gpu08")
    got = _doctor(env)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "node 1 (gpu08) differs [warning]: NCCL_ALGO Ring (others unset)" in got.stdout
    outside = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    refused = _doctor(outside)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "xl doctor: --nodes needs hosts outside a Slurm allocation: "
        "xl doctor --nodes HOST [HOST ...]"
    )
