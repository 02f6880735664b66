"""One node's rendezvous (docs/launch.md, "One node's rendezvous"): the real `xl` and torchrun, 2
CPU ranks. Two runs started together each get a port of their own, held by their supervisor,
and both train; the ranks reach the store on the port run.json's argv names. With restarts the
run keeps c10d on port 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from procs import XL, run_dirs, run_json, wait_no_processes, xl, xl_env

pytestmark = pytest.mark.e2e

PROBE = """\
import json, os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
with open(os.path.join(sys.argv[1], f"rank-{os.environ['RANK']}.json"), "w") as fh:
    json.dump({k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "XL_RUN_ID")}, fh)
dist.destroy_process_group()
"""


def test_two_runs_at_once_each_hold_their_own_port(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    env = xl_env(tmp_path / "home")
    outs = [tmp_path / "a", tmp_path / "b"]
    procs = []
    for out in outs:
        out.mkdir()
        argv = [*XL, "launch", "--no-tui", "--nproc", "2", "--name", out.name, "probe.py", str(out)]
        procs.append(
            subprocess.Popen(
                argv,
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for proc in procs:
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out[-3000:]
    runs = run_dirs(tmp_path / "home")
    assert len(runs) == 2
    ports = set()
    for run_dir in runs:
        run = run_json(run_dir)
        argv = run["argv"]
        assert "--rdzv-backend" not in argv, argv
        assert argv[argv.index("--master-addr") + 1] == "127.0.0.1"
        port = argv[argv.index("--master-port") + 1]
        assert port != "0", argv  # the held port, not the plan's stand-in
        ports.add(port)
        seen = [json.loads((tmp_path / run["name"] / f"rank-{r}.json").read_text()) for r in (0, 1)]
        assert all(s["MASTER_PORT"] == port and s["MASTER_ADDR"] == "127.0.0.1" for s in seen), seen
        assert all(s["XL_RUN_ID"] == run["run_id"] for s in seen)
        wait_no_processes(run_dir, timeout=10)
    assert len(ports) == 2, ports


def test_restarts_keep_the_c10d_rendezvous(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    proc = xl(
        ["launch", "--dry-run", "--json", "--nproc", "2", "--max-restarts", "1", "probe.py"],
        xl_env(tmp_path / "home"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout)["argv"]
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "127.0.0.1:0"
    assert "--master-port" not in argv
    plain = json.loads(
        xl(
            ["launch", "--dry-run", "--json", "--nproc", "2", "probe.py"],
            xl_env(tmp_path / "home"),
            cwd=tmp_path,
        ).stdout
    )
    assert plain["argv"][plain["argv"].index("--master-port") + 1] == "0"
    assert sys.executable == argv[0]
