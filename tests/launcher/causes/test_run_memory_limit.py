"""A rank the kernel's OOM killer ended in the run's own cgroup is told as the run's
--memory-limit, with the same launch at twice the limit; another memory cgroup's kill (a
container's, Slurm's) keeps its own words (the kernel's lines as v1 writes them)."""

from __future__ import annotations

import shlex

from xl.launcher.causes import Evidence, explain
from xl.launcher.rundir.outcome import CauseKind
from xl.launcher.spec import LaunchSpec, spec_to_argv


def _kernel(memcg: str, limit_kb: int) -> list[str]:
    return [
        "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
        f"memory: usage {limit_kb}kB, limit {limit_kb}kB, failcnt 57",
        f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        f"oom_memcg={memcg},task_memcg={memcg},task=python3,pid=6268,uid=0",
        "Memory cgroup out of memory: Killed process 6268 (python3) total-vm:524852kB, "
        "anon-rss:356224kB, file-rss:6144kB, shmem-rss:0kB, UID:0 pgtables:900kB "
        "oom_score_adj:0",
    ]


ARGS = spec_to_argv(
    LaunchSpec(script="train.py", args=["--batch", "64"], nproc=2, memory_limit="512M")
)


def _why(memcg: str, launch_args: list[str] | None = ARGS) -> tuple[str, str | None, CauseKind]:
    ev = Evidence(rank=1, exit_code=-9, pids={6268}, launch_args=launch_args)
    cause = explain(ev, kernel=_kernel(memcg, 512 << 10))
    return cause.summary, cause.fix, cause.kind


def test_the_run_s_own_limit_is_named_with_a_rerun_at_twice_it() -> None:
    memcg = "/process_api/b0bb/xl-run-20261207-063856-train-35c6"
    summary, fix, kind = _why(memcg)
    assert kind is CauseKind.HOST_OOM
    assert summary == (
        f"killed by the kernel's OOM killer: the run's --memory-limit of 512 MiB (its cgroup "
        f"{memcg}); it held 354 MiB when it died (pid 6268, python3)"
    )
    assert fix == "xl launch --memory-limit 1G --nproc 2 -- train.py --batch 64"
    assert shlex.split(fix)[2:4] == ["--memory-limit", "1G"]
    # No launch line to repeat (a run settled from what it left): the option, said in words.
    _, bare, _ = _why(memcg, None)
    assert bare == "launch it again with --memory-limit 1G, or use less memory per rank"


def test_another_memory_cgroup_keeps_its_own_words() -> None:
    summary, fix, kind = _why("/docker/4f2a")
    assert kind is CauseKind.HOST_OOM
    assert summary.startswith(
        "killed by the kernel's OOM killer: its memory cgroup /docker/4f2a has a limit of 512 MiB"
    )
    assert fix is not None and "--memory-limit" not in fix and "docker run --memory" in fix
