"""Contract: what one real `xl launch` leaves for users and other tools (docs/contracts.md).

Two short real runs start once for the whole module, side by side, each in its own XL_HOME:

- ``ok``: 2 ranks on 2 simulated GPUs (``--gpus 1,0``) running fixtures/rank_probe.py, which
  records what each rank sees (its XL_* variables, argv, devices), logs 5 steps with ``xl.log``
  and then waits for a go file, so the test can read the live processes' /proc entries;
- ``fail``: 2 CPU ranks running the same probe, rank 1 raising.

Pinned (fixtures/run_dir.json, recorded from the code before the package moves): run.json's keys
(top level, ``ranks[]``, ``devices[]``, ``failure``, ``spec``), the status values, the event kinds
of a plain run and each kind's keys, the keys of ``train`` and ``sys`` metrics lines, the files of
a run dir and their permissions, the XL_* variables a rank gets, the module paths in the
processes' command lines and the supervisor's process name, and that the run's token reaches no
file and no command line. Nothing here imports xl's internals: everything is read off disk,
/proc and the `xl` command.

Re-record the fixtures on purpose (a contract change) with ``XL_CONTRACTS_RECORD=1``.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import simnvml as _sim
from golden import FIXTURES, golden
from procs import kill_run, run_json, run_processes, wait_for, wait_ranks_running

pytestmark = pytest.mark.e2e

PROBE = FIXTURES / "rank_probe.py"
GPU_FIGURES = {"gpu", "gpu_util", "gpu_mem_used_mib", "gpu_mem_total_mib"} | {
    # what holds the GPU back (xl.gpu.clocks), with the GPU's figures
    "clock_event_reasons", "sm_clock_mhz", "sm_clock_max_mhz", "temp_c", "power_w",
    "power_limit_w", "ecc_volatile",
}  # fmt: skip
XL = [sys.executable, "-m", "xl"]



def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment without anything that would steer xl (XL_*, CUDA_*, a driver path)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("XL_", "CUDA_", "NCCL_", "FORCE_COLOR", "NO_COLOR", "COLUMNS"))
        and k not in ("LD_LIBRARY_PATH", "RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_JOB_ID")
    }
    env.update(XL_HOME=str(home), XL_STOP_GRACE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def read_proc(pid: int) -> dict[str, Any]:
    """argv and process name (comm) of a live process, as ps and top show them."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return {}
    return {"argv": [a.decode(errors="replace") for a in raw.split(b"\0") if a], "comm": comm}


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class Run:
    name: str
    home: Path
    out: Path  # where rank_probe.py writes what each rank saw
    cwd: Path
    proc: subprocess.Popen[str] | None = None
    stdout: Path | None = None
    returncode: int | None = None
    found_dir: Path | None = None
    live: dict[str, Any] = field(default_factory=dict)  # /proc snapshots while ranks ran
    given: dict[str, str] = field(default_factory=dict)  # the XL_* variables `xl launch` got

    @property
    def run_dir(self) -> Path:
        assert self.found_dir is not None, f"run {self.name} never made its run dir"
        return self.found_dir

    def seen(self, rank: int) -> dict[str, Any]:
        return json.loads((self.out / f"rank-{rank}.json").read_text())

    @property
    def output(self) -> str:
        return self.stdout.read_text(errors="replace") if self.stdout else ""


def _start(run: Run, args: Sequence[str], env: dict[str, str]) -> None:
    run.stdout = run.cwd / f"{run.name}.out"
    run.given = {k: v for k, v in env.items() if k.startswith("XL_")}
    with open(run.stdout, "w") as fh:
        run.proc = subprocess.Popen(
            [*XL, "launch", "--no-tui", *args],
            cwd=run.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
        )


def _the_run_dir(home: Path) -> Path:
    def find() -> Path | None:
        root = home / "runs"
        dirs = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
        return dirs[0] if len(dirs) == 1 and (dirs[0] / "run.json").exists() else None

    return wait_for(find, timeout=30, what=f"the run dir under {home}")


def _snapshot(run_dir: Path) -> dict[str, Any]:
    run = run_json(run_dir)
    return {
        "supervisor": read_proc(run["supervisor_pid"]),
        "torchrun": read_proc(run["torchrun_pid"]),
        "ranks": {r["rank"]: read_proc(r["pid"]) for r in run["ranks"]},
    }


def _ranks_with_gpu_figures(run_dir: Path) -> set[int]:
    ranks = set()
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue  # a line being appended right now
        if m.get("kind") == "sys" and "gpu_util" in m:
            ranks.add(m["rank"])
    return ranks


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory,
    _simnvml_builds: Callable[[Sequence[str]], Path],
) -> Iterator[dict[str, Run]]:
    base = tmp_path_factory.mktemp("contract-runs")
    sim = _sim.SimNVML(_simnvml_builds(()), base / "simnvml.conf", 2)
    ok = Run("ok", base / "home-ok", base / "seen-ok", base)
    fail = Run("fail", base / "home-fail", base / "seen-fail", base)
    go = base / "go"
    ok_env = clean_env(ok.home, **sim.env)
    fail_env = clean_env(fail.home)
    try:
        _start(
            ok,
            [
                "--gpus",
                "1,0",
                "--env",
                f"CONTRACT_OUT={ok.out}",
                "--env",
                f"CONTRACT_GO={go}",
                "--",
                str(PROBE),
            ],
            ok_env,
        )
        _start(
            fail,
            [
                "--nproc",
                "2",
                "--env",
                f"CONTRACT_OUT={fail.out}",
                "--env",
                "CONTRACT_FAIL_RANK=1",
                "--",
                str(PROBE),
            ],
            fail_env,
        )
        ok.found_dir = _the_run_dir(ok.home)
        fail.found_dir = _the_run_dir(fail.home)
        wait_ranks_running(ok.run_dir, 2, timeout=45)
        ok.live = _snapshot(ok.run_dir)
        # The 1 Hz sampler's lines with GPU figures for both ranks, so sys lines can be checked.
        wait_for(
            lambda: _ranks_with_gpu_figures(ok.run_dir) >= {0, 1},
            timeout=15,
            what="sys metrics with GPU figures of both ranks",
        )
        go.touch()
        for run in (ok, fail):
            assert run.proc is not None
            run.returncode = run.proc.wait(timeout=60)
        yield {"ok": ok, "fail": fail}
    finally:
        go.touch()
        for run in (ok, fail):
            if run.proc is not None and run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait(timeout=10)
            if run.found_dir is not None:
                kill_run(run.found_dir)


# -- the runs' outcome -----------------------------------------------------------------------


def test_launch_exits_0_on_success_and_1_on_failure(runs: dict[str, Run]) -> None:
    ok, fail = runs["ok"], runs["fail"]
    assert ok.returncode == 0, ok.output[-3000:]
    assert fail.returncode == 1, fail.output[-3000:]
    assert "Traceback" not in ok.output
    # The root cause reaches the person: the failing rank's exception, not only an exit code.
    assert "contract probe: rank 1 fails on purpose" in fail.output
    assert run_json(ok.run_dir)["status"] == "succeeded"
    assert run_json(fail.run_dir)["status"] == "failed"


def test_no_process_of_either_run_is_left(runs: dict[str, Run]) -> None:
    for run in runs.values():
        deadline = time.monotonic() + 15
        while (left := run_processes(run.run_dir)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"{run.name}: processes left: {[p.pid for p in left]}"


# -- run.json ----------------------------------------------------------------------------------


def test_run_json_keys_and_values(runs: dict[str, Run]) -> None:
    ok, fail = runs["ok"], runs["fail"]
    run, failed = run_json(ok.run_dir), run_json(fail.run_dir)
    golden(
        "run_json_keys.json",
        {
            "top": sorted(run),
            "top_failed": sorted(failed),
            "spec": sorted(run["spec"]),
            "ranks": sorted({k for r in run["ranks"] for k in r}),
            "devices": sorted({k for d in run["devices"] for k in d}),
            "failure": sorted(failed["failure"]),
        },
    )
    assert run["run_id"] == ok.run_dir.name and failed["run_id"] == fail.run_dir.name
    assert run["failure"] is None
    # Devices as chosen, in order; every rank row is filled in.
    uuid = _sim.default_uuid
    assert [(d["index"], d["uuid"]) for d in run["devices"]] == [(1, uuid(1)), (0, uuid(0))]
    assert all(d["name"] == "NVIDIA A100-SXM4-80GB" for d in run["devices"])
    rows = sorted(run["ranks"], key=lambda r: r["rank"])
    assert [
        (r["rank"], r["local_rank"], r["gpu"], r["gpu_uuid"], r["exit_code"]) for r in rows
    ] == [
        (0, 0, 1, uuid(1), 0),
        (1, 1, 0, uuid(0), 0),
    ]
    assert all(isinstance(r["pid"], int) and r["pid"] > 0 for r in rows)
    assert run["world_size"] == 2 and run["nproc_per_node"] == 2 and run["nnodes"] == 1
    assert isinstance(run["started_at"], float) and run["ended_at"] >= run["started_at"]
    # argv is the torchrun command; rank_env what xl set (the --env values included); env the
    # nodes' environments compared, nothing to compare on one node.
    assert run["argv"][1:3] == ["-m", "torch.distributed.run"]
    assert run["rank_env"]["CUDA_VISIBLE_DEVICES"] == "1,0"
    assert run["rank_env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert run["rank_env"]["CONTRACT_OUT"] == str(ok.out)
    assert run["env"] == {"diffs": []} and failed["env"] == {"diffs": []}
    # The root cause of the failed run.
    failure = failed["failure"]
    assert failure["rank"] == 1 and failure["exit_code"] == 1
    assert "RuntimeError: contract probe: rank 1 fails on purpose" in failure["traceback"]
    assert failed["devices"] == [] and {r["gpu"] for r in failed["ranks"]} == {None}


def test_run_json_status_values(runs: dict[str, Run]) -> None:
    allowed = {"running", "succeeded", "failed", "stopped"}
    assert run_json(runs["ok"].run_dir)["status"] in allowed
    assert run_json(runs["fail"].run_dir)["status"] in allowed


# -- events.jsonl and metrics.jsonl -----------------------------------------------------------


def test_events_kinds_and_keys(runs: dict[str, Run]) -> None:
    ok_events = jsonl(runs["ok"].run_dir / "events.jsonl")
    fail_events = jsonl(runs["fail"].run_dir / "events.jsonl")
    for ev in ok_events + fail_events:
        assert isinstance(ev["t"], float) and isinstance(ev["kind"], str)
        assert isinstance(ev["message"], str) and ev["message"]
        assert "rank" in ev
    keys: dict[str, list[str]] = {}
    for ev in ok_events:
        keys.setdefault(ev["kind"], sorted(ev))
        assert sorted(ev) == keys[ev["kind"]], ev
    failure_events = [e for e in fail_events if e["kind"] == "failure"]
    assert len(failure_events) == 1 and failure_events[0]["rank"] == 1
    golden(
        "events_keys.json",
        {
            "plain_run_kinds_in_order": [
                e["kind"] for e in ok_events if e["kind"] in ("run_started", "run_ended")
            ],
            "plain_run_keys": keys,
            "failure": sorted(failure_events[0]),
            "failed_run_has": sorted(
                {e["kind"] for e in fail_events}
                & {"run_started", "rank_started", "rank_exited", "failure", "run_ended"}
            ),
        },
    )
    assert ok_events[0]["kind"] == "run_started" and ok_events[-1]["kind"] == "run_ended"
    assert sorted(e["rank"] for e in ok_events if e["kind"] == "rank_exited") == [0, 1]
    assert ok_events[-1]["status"] == "succeeded" and fail_events[-1]["status"] == "failed"


def test_metrics_lines_keys(runs: dict[str, Run]) -> None:
    recs = jsonl(runs["ok"].run_dir / "metrics.jsonl")
    train = [m for m in recs if m["kind"] == "train"]
    sys_lines = [m for m in recs if m["kind"] == "sys"]
    assert {m["kind"] for m in recs} == {"train", "sys"}
    for m in recs:
        assert isinstance(m["t"], float) and m["rank"] in (0, 1)
    for rank in (0, 1):
        mine = [m for m in train if m["rank"] == rank]
        assert [m["step"] for m in mine] == [1, 2, 3, 4, 5]
        assert [m["loss"] for m in mine] == [1.0 / s for s in range(1, 6)]
        assert all(m["samples_per_s"] > 0 for m in mine[1:])
    first = sorted(train[0])
    later = sorted({k for m in train if m["step"] > 1 for k in m})
    # A sys line carries the process figures, plus the GPU figures once the rank's GPU is known.
    with_gpu = {tuple(sorted(m)) for m in sys_lines if "gpu_util" in m}
    assert len(with_gpu) == 1, with_gpu
    sys_gpu = list(next(iter(with_gpu)))
    for m in sys_lines:
        assert sorted(m) in (sys_gpu, [k for k in sys_gpu if k not in GPU_FIGURES]), m
    golden(
        "metrics_keys.json",
        {"train_first": first, "train_later": later, "sys_with_gpu": sys_gpu},
    )
    # The GPU figures of the simulated GPUs reach each rank's sys lines.
    for rank in (0, 1):
        gpu = [m for m in sys_lines if m["rank"] == rank and "gpu_util" in m]
        assert gpu, f"no sys line with GPU figures for rank {rank}"
        assert gpu[-1]["gpu_mem_total_mib"] == 81920


# -- files and permissions ---------------------------------------------------------------------


def test_run_dir_files_and_permissions(runs: dict[str, Run]) -> None:
    for run in runs.values():
        d = run.run_dir
        for rank in (0, 1):
            log = d / "logs" / f"rank-{rank}.log"
            assert log.is_file(), log
            assert log.read_text().splitlines()[:2] == ["ready", "rank probe on stderr"], _late_log(
                run, log
            )
        for name in ("run.json", "events.jsonl", "metrics.jsonl"):
            assert (d / name).is_file(), name
        # run.json may hold the environment xl set (and a user's --env values): private.
        assert stat.S_IMODE((d / "run.json").stat().st_mode) == 0o600
        for path in d.rglob("*"):
            mode = stat.S_IMODE(path.lstat().st_mode)
            assert not mode & (stat.S_IWGRP | stat.S_IWOTH), f"{path} is writable by others"
    names = sorted(
        str(p.relative_to(runs["ok"].run_dir))
        for p in runs["ok"].run_dir.rglob("*")
        # The spool holds a rank's records only while the collector can't be reached.
        if p.is_file() and p.parts[len(runs["ok"].run_dir.parts)] != "spool"
    )
    golden("run_dir_files.json", names)


def test_the_token_reaches_no_file_and_no_command_line(runs: dict[str, Run]) -> None:
    ok = runs["ok"]
    token = ok.seen(0)["xl_env"]["XL_TOKEN"]
    assert len(token) >= 16
    for path in ok.run_dir.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), f"the run's token is in {path}"
    live = ok.live
    for proc in [live["supervisor"], live["torchrun"], *live["ranks"].values()]:
        assert token not in " ".join(proc["argv"])
    assert token not in ok.output


# -- processes: module paths in argv, the supervisor's name -----------------------------------


def test_processes_argv_and_names(runs: dict[str, Run]) -> None:
    live = runs["ok"].live
    sup, torchrun, ranks = live["supervisor"], live["torchrun"], live["ranks"]
    assert sup and torchrun and len(ranks) == 2, live
    # The forked supervisor renames itself, so ps/top do not show a second `xl launch`.
    assert sup["comm"] == "xl-supervisor"
    argv = torchrun["argv"]
    assert argv[1:3] == ["-m", "torch.distributed.run"], argv
    i = argv.index("xl.launcher.entry")
    assert argv[i - 1] == "-m" and argv[i + 1] == str(PROBE)
    for rank, proc in ranks.items():
        a = proc["argv"]
        assert "-m" in a and a[a.index("xl.launcher.entry") - 1] == "-m", (rank, a)
        assert a[a.index("xl.launcher.entry") + 1] == str(PROBE)
        # What the script itself sees as sys.argv: its own path, as `python train.py` gives.
        assert runs["ok"].seen(rank)["argv"] == [str(PROBE)]


# -- what a rank sees --------------------------------------------------------------------------


def test_rank_environment(runs: dict[str, Run]) -> None:
    ok = runs["ok"]
    collector = json.loads((ok.run_dir / "collector.json").read_text())
    names: set[str] | None = None
    for rank in (0, 1):
        seen = ok.seen(rank)
        env = seen["xl_env"]
        # XL_* variables of the launching environment reach the ranks as they were.
        assert {k: env.get(k) for k in ok.given} == ok.given
        mine = set(env) - set(ok.given)
        names = mine if names is None else names
        assert mine == names
        assert env["XL_RUN_ID"] == ok.run_dir.name
        assert Path(env["XL_RUN_DIR"]) == ok.run_dir
        host, _, port = env["XL_COLLECTOR"].rpartition(":")
        assert host and int(port) == collector["port"]
        assert re.fullmatch(r"[A-Za-z0-9_.~+/=-]{16,256}", env["XL_TOKEN"])
        assert seen["torch_env"] == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": "1,0",
        }
    assert ok.seen(0)["xl_env"]["XL_TOKEN"] == ok.seen(1)["xl_env"]["XL_TOKEN"]
    assert names is not None and names >= {"XL_RUN_ID", "XL_RUN_DIR", "XL_COLLECTOR", "XL_TOKEN"}
    golden("rank_env.json", sorted(names))


# -- reading the runs back with the CLI --------------------------------------------------------


def _late_log(run: Run, log: Path) -> str:
    """Evidence for a rank log found short once `xl launch` exited: does it fill in later?"""
    before = log.stat().st_size
    time.sleep(3)
    sup = run.run_dir / "supervisor.log"
    return (
        f"run {run.name}: {log.name} held {before} bytes as xl launch exited, "
        f"{log.stat().st_size} 3 s later; "
        f"status {run_json(run.run_dir).get('status')}; supervisor.log ends: "
        f"{sup.read_text()[-1500:] if sup.exists() else None!r}"
    )


def _xl(args: Sequence[str], home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*XL, *args],
        env=clean_env(home),
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


def test_runs_json_and_logs(runs: dict[str, Run]) -> None:
    ok = runs["ok"]
    listed = _xl(["runs", "--json"], ok.home)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["run_id"] for r in rows] == [ok.run_dir.name]
    assert rows[0]["status"] == "succeeded"
    golden("runs_json_keys.json", sorted(rows[0]))
    one = _xl(["logs", "last", "--rank", "1"], ok.home)
    assert one.returncode == 0 and one.stdout == "ready\nrank probe on stderr\n", one
    every = _xl(["logs", ok.run_dir.name[:10]], ok.home)  # a unique prefix of the id
    assert every.returncode == 0
    assert sorted(every.stdout.splitlines()) == sorted(
        f"[rank {r}] {line}" for r in (0, 1) for line in ("ready", "rank probe on stderr")
    )


@pytest.mark.parametrize("command", ["stop", "logs", "attach"])
def test_unknown_run_is_bad_usage(runs: dict[str, Run], command: str) -> None:
    proc = _xl([command, "nosuchrun"], runs["ok"].home)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "nosuchrun" in proc.stderr


def test_stop_of_an_ended_run_exits_0(runs: dict[str, Run]) -> None:
    proc = _xl(["stop", "last"], runs["ok"].home)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
