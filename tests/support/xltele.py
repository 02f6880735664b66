"""Helpers for the telemetry tests: a torchrun run driven with an in-process Telemetry.

This stands in for the supervisor: it starts Telemetry, gives the ranks the env docs/contracts.md
names (XL_COLLECTOR, XL_TOKEN, XL_RUN_DIR, XL_RUN_ID), feeds every rank output line to
``feed_log_line`` and reports rank pids through ``set_ranks``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from eventlines import Lines
from procs import free_port

from xl.launcher.telemetry.roster import RankInfo
from xl.launcher.telemetry.service import Telemetry

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parent.parent
PREFIX = re.compile(r"^\[(?:default|rank)(\d+)\]:(.*)$")


def rank_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith(("XL_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_")):
            del env[key]
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "HF_HOME": str(Path(os.environ.get("TMPDIR", "/tmp")) / "xl-test-hf-home"),
        }
    )
    env.update(extra or {})
    return env


@dataclass
class Run:
    run_dir: Path
    returncode: int
    output: str
    events: list[dict[str, Any]] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)

    def metrics(self, kind: str | None = None) -> list[dict[str, Any]]:
        path = self.run_dir / "metrics.jsonl"
        out = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [r for r in out if kind is None or r["kind"] == kind]

    def train(self, rank: int | None = None) -> list[dict[str, Any]]:
        return [r for r in self.metrics("train") if rank is None or r["rank"] == rank]


def _rank_pids(root: psutil.Process) -> dict[int, int]:
    found: dict[int, int] = {}
    try:
        kids = root.children(recursive=True)
    except psutil.Error:
        return found
    for kid in kids:
        try:
            env = kid.environ()
        except (psutil.Error, OSError):
            continue
        if "RANK" in env and "LOCAL_RANK" in env and "TORCHELASTIC_RUN_ID" in env:
            found[int(env["RANK"])] = kid.pid
    return found


def torchrun(
    run_dir: Path,
    script: str | Path,
    args: list[str] | None = None,
    *,
    nproc: int = 2,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    telemetry: bool = True,
    during: Any = None,
    inventory: Any = False,
) -> Run:
    """Run ``script`` on ``nproc`` CPU ranks under torchrun with telemetry; wait for the end."""
    run_dir.mkdir(parents=True, exist_ok=True)
    events = Lines()
    tel = None
    extra = dict(env or {})
    if telemetry:
        tel = Telemetry(run_dir, token="test-token", emit_event=events, inventory=inventory)
        extra.update(tel.start())
        extra.update({"XL_RUN_DIR": str(run_dir), "XL_RUN_ID": run_dir.name})
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "--tee=3",
        str(script),
        *(args or []),
    ]
    proc = subprocess.Popen(
        argv,
        env=rank_env(extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=str(REPO),
        start_new_session=True,
    )
    root = psutil.Process(proc.pid)
    pids: set[int] = {proc.pid}
    lines: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            m = PREFIX.match(line.rstrip("\n"))
            if m and tel is not None:
                tel.feed_log_line(int(m.group(1)), m.group(2))

    def ranks() -> None:
        known: dict[int, int] = {}
        while not stop.wait(0.3):
            found = _rank_pids(root)
            pids.update(found.values())
            if found and found != known and tel is not None:
                known = found
                tel.set_ranks([RankInfo(r, pid=p, local_rank=r) for r, p in sorted(found.items())])

    threads = [
        threading.Thread(target=reader, daemon=True),
        threading.Thread(target=ranks, daemon=True),
    ]
    for th in threads:
        th.start()
    try:
        if during is not None:
            during(tel, proc)
        rc = proc.wait(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, 9)
        proc.wait(10)
        raise
    finally:
        stop.set()
        for th in threads:
            th.join(10)
        if tel is not None:
            tel.stop()
    run = Run(run_dir, rc, "".join(lines), events, pids)
    assert_gone(run.pids)
    return run


def assert_gone(pids: set[int], grace: float = 10.0) -> None:
    deadline = time.monotonic() + grace
    while True:
        alive = [p for p in pids if psutil.pid_exists(p) and _not_zombie(p)]
        if not alive:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"processes outlived the run: {alive}")
        time.sleep(0.1)


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
