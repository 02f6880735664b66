"""A dead rank's evidence for the causes' tests: the doctor's facts of an ordinary GPU machine,
the kernel's lines of an OOM kill in a memory cgroup, and ``why``: a rank's words as a cause."""

from __future__ import annotations

from gpus import idle_gpu

from xl.doctor.facts import Facts, TorchInfo
from xl.gpu.nvml import Driver
from xl.launcher.causes import Evidence, explain
from xl.launcher.causes.doctor_facts import Doctor
from xl.launcher.rundir.outcome import Cause

PY = "/opt/venv/bin/python3"
LAUNCH = ["--nproc", "2", "--", "train.py", "--batch", "64"]
TORCH = TorchInfo(
    python=PY,
    found=True,
    version="2.6.0+cu126",
    cuda="12.6",
    nccl="2.21.5",
    location="/opt/venv/lib/python3.11/site-packages/torch",
)

KERNEL = [
    "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
    "memory: usage 65536kB, limit 65536kB, failcnt 0",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/xl-test-b863b7dc,"
    "task_memcg=/xl-test-b863b7dc,task=python3,pid=10513,uid=0",
    "Memory cgroup out of memory: Killed process 10513 (python3) total-vm:229844kB, "
    "anon-rss:72960kB, file-rss:6404kB, "
    "shmem-rss:0kB, UID:0 pgtables:220kB oom_score_adj:0",
]


def make_doctor(**facts: object) -> Doctor:
    base: dict[str, object] = {
        "env": {},
        "python": PY,
        "driver": Driver("570.124.06", "12.8"),
        "gpus": (idle_gpu(0),),
        "torch": TORCH,
        "net_ifaces": ["eth0", "lo"],
        "ib_devices": [],
        "shm_total": 64 << 30,
        "shm_free": 64 << 30,
    }
    base.update(facts)
    return Doctor(PY, facts=Facts(**base))  # type: ignore[arg-type]


def why(
    error: str | None = None, code: int | None = 1, tail: list[str] | None = None,
    doctor: Doctor | None = None, kernel: list[str] | None = None, **kw: object,
) -> Cause:
    ev = Evidence(
        rank=1,
        exit_code=code,
        error=error,
        traceback="Traceback ...\n" + (error or "") if error else None,
        log_tail=tail or [],
        python=PY,
        launch_args=LAUNCH,
        **kw,
    )  # type: ignore[arg-type]
    return explain(ev, doctor or make_doctor(), kernel if kernel is not None else [])
