"""Why a rank died, from real failures: the real `xl launch --no-tui` on real torchrun with CPU
ranks, each run made to fail the way a person's does (a package not installed, argparse, a file
missing, the kernel's OOM killer in a memory cgroup, a tiny /dev/shm, a segfault, a taken port, a
signal from outside, SIGKILL of one DDP rank), and runs that did not fail of their own (a rank
that ends early, `xl stop`, an error that merely mentions memory) get no invented cause.

Each checks the cause in run.json, the one `failure` event, and the plain view's `cause:` and
`fix:` lines; a fix printed as a command is run. Every test checks that no process is left.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from procs import (
    XL,
    kill_run,
    run_json,
    wait_for,
    wait_no_processes,
    wait_ranks_running,
    wait_run,
    xl,
    xl_env,
)
from supervised import GRACE, popen_launch, write_script

from xl.launcher.causes import host

pytestmark = pytest.mark.e2e

DDP = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1_000_000):
    opt.zero_grad()
    model(torch.randn(16, 256)).sum().backward()
    opt.step()
    if step == 20:
        open(os.path.join(os.environ["MARK_DIR"], f"rank-{rank}.pid"), "w").write(str(os.getpid()))
"""


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _failure_events(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in _events(run_dir) if e["kind"] == "failure"]


def _said(stdout: str) -> tuple[list[str], list[str]]:
    """The plain view's `cause:` and `fix:` lines."""
    lines = stdout.splitlines()
    return [ln for ln in lines if ln.startswith("cause: ")], [
        ln for ln in lines if ln.startswith("fix: ")
    ]


def _launch(
    tmp_path: Path, body: str, *args: str, nproc: int = 2, prefix: list[str] | None = None,
    env: dict[str, str] | None = None, launch: tuple[str, ...] = (),
) -> tuple[subprocess.CompletedProcess[str], Path, dict[str, Any]]:
    """A failing run to its end: its outcome, run dir and run.json (after every process is gone)."""
    home = tmp_path / "home"
    script = write_script(tmp_path, "train.py", body)
    argv = [
        *(prefix or []), *XL, "launch", "--no-tui", "--nproc", str(nproc), *launch, str(script),
        *args,
    ]
    proc = subprocess.run(
        argv,
        env=xl_env(home, **(env or {})),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    run_dir = wait_run(home)
    wait_no_processes(run_dir, timeout=GRACE + 10)
    return proc, run_dir, run_json(run_dir)


def _cause_of(
    proc: subprocess.CompletedProcess[str], run_dir: Path, run: dict[str, Any], rank: int = 1
) -> dict[str, Any]:
    """The run failed on ``rank``; its one failure event, run.json and the plain view agree."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and run["status"] == "failed", out
    failure = run["failure"]
    assert failure["rank"] == rank, failure
    cause = failure["cause"]
    assert (
        set(cause) == {"kind", "summary", "fix", "evidence"}
        and cause["summary"]
        and cause["evidence"]
    ), cause
    events = _failure_events(run_dir)
    assert len(events) == 1 and events[0]["rank"] == rank and events[0]["cause"] == cause, events
    assert (
        "\n" not in failure["message"]
        and "\\n" not in failure["message"]
        and "\u240a" not in failure["message"]
    )
    causes, fixes = _said(proc.stdout)
    assert f"cause: {cause['summary']}" in causes, proc.stdout
    assert (f"fix: {cause['fix']}" in fixes) if cause["fix"] else not fixes, proc.stdout
    # The end of the plain view: the outcome line, then the cause and its fix, a line each.
    lines = proc.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith(f"xl: run {run['run_id']} failed"))
    assert lines[at + 1] == f"cause: {cause['summary']}", lines[at:]
    return cause


# ---------------------------------------------------------------- the true root cause
@pytest.mark.timeout(600)
def test_sigkill_of_one_ddp_rank_blames_the_killed_rank_every_time(tmp_path: Path) -> None:
    """SIGKILL of rank 1 in the middle of a 2-rank DDP (gloo) run: rank 1 is the root cause in
    every run, whatever rank 0's broken all-reduce said first; one failure event each, whose
    message does not glue rank 1's last log line on."""
    script = write_script(tmp_path, "ddp.py", DDP)
    survivor_errors = []
    for attempt in range(3):
        home, marks = tmp_path / f"home-{attempt}", tmp_path / f"marks-{attempt}"
        marks.mkdir()
        # The default stop grace (10 s), not the tests' 1 s: on a busy machine torchrun needs
        # more than a second to print its summary, which names the signal when the killed rank's
        # zombie was already reaped by torchrun.
        proc = popen_launch(
            ["--nproc", "2", str(script)],
            xl_env(home, MARK_DIR=str(marks), XL_STOP_GRACE="10"),
            tmp_path,
        )
        run_dir = wait_run(home, timeout=120)
        try:
            pidfile = marks / "rank-1.pid"
            wait_for(
                lambda pidfile=pidfile: pidfile.exists() and pidfile.read_text(),
                timeout=120,
                what="rank 1 training",
            )
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
            out, err = proc.communicate(timeout=120)
            run = run_json(run_dir)
            assert proc.returncode == 1 and run["status"] == "failed", out + err
            failure = run["failure"]
            assert (failure["rank"], failure["exit_code"]) == (1, -signal.SIGKILL), (
                attempt,
                failure,
            )
            assert failure["message"] == "rank 1 failed first: rank 1 was killed by SIGKILL", (
                failure
            )
            assert failure["cause"]["kind"] == "killed" and "SIGKILL" in failure["cause"]["summary"]
            assert failure["cause"]["fix"] is None
            events = _failure_events(run_dir)
            assert len(events) == 1 and events[0]["rank"] == 1, events
            assert {r["rank"]: r["state"] for r in run["ranks"]} == {0: "stopped", 1: "failed"}
            assert f"cause: {failure['cause']['summary']}" in out.splitlines()
            survivor_errors += [
                e["exit_code"]
                for e in _events(run_dir)
                if e["kind"] == "rank_exited" and e["rank"] == 0
            ]
            wait_no_processes(run_dir, timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
            kill_run(run_dir)
    # How rank 0 ended each time (its broken collective's error, or xl's stop): never the cause.
    print("rank 0's exit codes:", survivor_errors)


# ---------------------------------------------------------------- kinds from real failures
def test_a_missing_package_names_the_ranks_own_interpreter_and_the_distribution(
    tmp_path: Path,
) -> None:
    """`import PIL` where pillow is not installed: the fix installs pillow (not "PIL") into the
    interpreter the ranks run (--python's), and the printed command works as it is."""
    python = os.path.join(
        os.path.dirname(sys.executable), f"python{sys.version_info[0]}.{sys.version_info[1]}"
    )
    if not os.path.exists(python):
        pytest.skip("no pythonX.Y beside this interpreter")
    probe = subprocess.run([python, "-c", "import PIL"], capture_output=True, timeout=60)
    if probe.returncode == 0:
        pytest.skip("PIL is installed here: nothing is missing")
    body = "import os\nif os.environ['RANK'] == '1':\n    import PIL\nimport time\ntime.sleep(60)\n"
    proc, run_dir, run = _launch(tmp_path, body, launch=("--python", python))
    try:
        cause = _cause_of(proc, run_dir, run)
        assert (
            cause["kind"] == "module_not_found"
            and "'PIL'" in cause["summary"]
            and python in cause["summary"]
        )
        assert cause["fix"] == f"{python} -m pip install pillow"
        # The command works: here it installs into a folder of the test's (the same resolver,
        # index and interpreter; --target keeps the environment as it was).
        target = tmp_path / "site"
        words = [*shlex.split(cause["fix"]), "--quiet", "--no-deps", "--target", str(target)]
        done = subprocess.run(words, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        check = subprocess.run(
            [python, "-c", "import PIL"],
            env={**os.environ, "PYTHONPATH": str(target)},
            capture_output=True,
            timeout=60,
        )
        assert check.returncode == 0, check.stderr
    finally:
        kill_run(run_dir)


def test_an_argparse_usage_error_is_its_message_not_a_traceback(tmp_path: Path) -> None:
    body = (
        "import argparse, os, time\np = argparse.ArgumentParser()\np.add_argument('--lr', "
        "type=float)\n"
        "if os.environ['RANK'] == '1':\n    p.parse_args()\ntime.sleep(60)\n"
    )
    proc, run_dir, run = _launch(tmp_path, body, "--lr-warmup", "3")
    try:
        cause = _cause_of(proc, run_dir, run)
        assert cause["kind"] == "usage_error"
        assert cause["summary"].endswith("train.py: error: unrecognized arguments: --lr-warmup 3")
        assert (
            run["failure"]["message"]
            == "rank 1 failed first: rank 1 exited with code 2: train.py: error: unrecognized "
            "arguments: --lr-warmup 3"
        )
        assert (
            "traceback of rank 1" not in proc.stdout and "xl: last lines of rank 1:" in proc.stdout
        )
        # The fix shows the script's options: a command that works.
        shown = subprocess.run(
            shlex.split(cause["fix"]),
            env={**os.environ, "RANK": "1"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0 and "--lr LR" in shown.stdout, shown.stdout + shown.stderr
    finally:
        kill_run(run_dir)


@pytest.mark.timeout(300)
def test_a_missing_file_and_its_cause_shown_everywhere(tmp_path: Path) -> None:
    """A real file_not_found, then a run that succeeds, in one XL_HOME: the cause in `xl runs`
    and `xl runs --json`, `xl attach` on the ended run, `xl compare` (JSON and table), the
    exporter's xl_run_failure_info{kind} and the Monitor's banner; the run that succeeded has
    none."""
    body = (
        "import os, time\nif os.environ['RANK'] == '1':\n    open('data/train.bin', "
        "'rb')\ntime.sleep(60)\n"
    )
    proc, run_dir, run = _launch(tmp_path, body)
    home = tmp_path / "home"
    env = xl_env(home)
    try:
        cause = _cause_of(proc, run_dir, run)
        assert (
            cause["kind"] == "file_not_found"
            and cause["summary"] == f"no such file: data/train.bin (relative to {tmp_path})"
        )
        assert cause["fix"] is None  # nowhere else does it exist: no guess
        ok = xl(
            [
                "launch",
                "--no-tui",
                "--nproc",
                "1",
                str(write_script(tmp_path, "ok.py", "print('fine')\n")),
            ],
            env,
            cwd=tmp_path,
            timeout=180,
        )
        assert ok.returncode == 0, ok.stdout + ok.stderr
        ok_dir = next(d for d in (home / "runs").iterdir() if d != run_dir)
        # xl runs, and --json.
        table = xl(["runs"], env, timeout=60).stdout.splitlines()
        assert table[0].split()[-1] == "CAUSE"
        row = next(ln for ln in table if ln.startswith(run_dir.name))
        assert row.endswith(f"rank 1: file_not_found: {cause['summary']}"[:80].rstrip()), row
        listed = {
            r["run_id"]: r for r in json.loads(xl(["runs", "--json"], env, timeout=60).stdout)
        }
        assert (
            listed[run_dir.name]["cause"] == cause and listed[run_dir.name]["failure"]["rank"] == 1
        )
        assert listed[ok_dir.name]["cause"] is None and listed[ok_dir.name]["failure"] is None
        # xl attach on the ended run: the same end as the launch's plain view.
        attached = xl(["attach", run_dir.name, "--no-tui"], env, timeout=60)
        assert attached.stdout.splitlines()[-3:-1] == [
            f"xl: run {run_dir.name} failed after "
            f"{attached.stdout.split(' failed after ')[1].split('s:')[0]}s: "
            f"{run['failure']['message']}",
            f"cause: {cause['summary']}",
        ], attached.stdout
        # xl compare: the failure row.
        compared = json.loads(
            xl(["compare", run_dir.name, ok_dir.name, "--json"], env, timeout=60).stdout
        )
        assert compared["failure"]["a"] == {
            "rank": 1,
            "node_rank": 0,
            "message": run["failure"]["message"],
            "cause": cause,
        }
        assert compared["failure"]["b"] is None
        side = xl(["compare", run_dir.name, ok_dir.name], env, timeout=60).stdout.splitlines()
        failure_row = next(ln for ln in side if ln.lstrip().startswith("failure"))
        assert (
            "rank 1: file_not_found: no such file" in failure_row
            and failure_row.rstrip().endswith("-")
        ), failure_row
        # The exporter: the failed run's cause, kept after its end; none for the run that succeeded.
        from xl.launcher.exporter.metrics import RunsCollector  # noqa: PLC0415 - prometheus_client only here

        got = {f.name: f for f in RunsCollector(home / "runs", gpus=False).collect()}
        infos = [smp.labels for smp in got["xl_run_failure"].samples]
        assert infos == [
            {
                "run_id": run_dir.name,
                "rank": "1",
                "Hostname": run["failure"]["node"],
                "exit_code": "1",
                "kind": "file_not_found",
                "summary": cause["summary"],
                "fix": "",
            }
        ], infos
        # The Monitor's banner, drawn from the run as its reader gives it.
        from xl.launcher.view.reader import RunReader  # noqa: PLC0415 - the Monitor's own path
        from xl.tui.screens.monitor import failure_text  # noqa: PLC0415 - textual only here

        banner = failure_text(RunReader(run_dir).poll().failure, keep=3)
        assert banner is not None and f"cause: {cause['summary']}" in banner.plain.splitlines()
    finally:
        kill_run(run_dir)


def test_a_segfault_names_the_python_line(tmp_path: Path) -> None:
    body = (
        "import ctypes, os, time\nprint('ready', flush=True)\nif os.environ['RANK'] == '1':\n    "
        "time.sleep(0.3)\n"
        "    ctypes.string_at(0)\ntime.sleep(60)\n"
    )
    proc, run_dir, run = _launch(tmp_path, body)
    try:
        cause = _cause_of(proc, run_dir, run)
        assert run["failure"]["exit_code"] == -signal.SIGSEGV
        assert cause["kind"] == "segfault" and cause["fix"] is None
        assert f"called from {tmp_path / 'train.py'}:5 in <module> (inside " in cause["summary"], (
            cause
        )
        assert "string_at" in cause["summary"]
        assert run["failure"]["message"] == "rank 1 failed first: rank 1 was killed by SIGSEGV"
    finally:
        kill_run(run_dir)


def test_a_taken_port_names_its_holder(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    body = (
        f"import os, time\nif os.environ['RANK'] == '1':\n    import torch.distributed as dist\n"
        f"    dist.TCPStore('127.0.0.1', {port}, is_master=True, "
        "wait_for_workers=False)\ntime.sleep(60)\n"
    )
    try:
        proc, run_dir, run = _launch(tmp_path, body)
    finally:
        holder.close()
    try:
        cause = _cause_of(proc, run_dir, run)
        assert cause["kind"] == "port_in_use" and cause["summary"].startswith(
            f"port {port} is already in use, held by pid {os.getpid()}"
        )
    finally:
        kill_run(run_dir)


def test_a_signal_from_outside_is_killed(tmp_path: Path) -> None:
    """SIGTERM to rank 1 by someone else (not `xl stop`): killed, from outside xl."""
    body = (
        "import os, time\nopen(os.path.join(os.environ['MARK_DIR'], os.environ['RANK']), "
        "'w').write(str(os.getpid()))\ntime.sleep(120)\n"
    )
    home = tmp_path / "home"
    script = write_script(tmp_path, "train.py", body)
    proc = popen_launch(
        ["--nproc", "2", str(script)], xl_env(home, MARK_DIR=str(tmp_path)), tmp_path
    )
    run_dir = wait_run(home, timeout=120)
    try:
        wait_for(
            lambda: (tmp_path / "1").exists() and (tmp_path / "1").read_text(),
            timeout=120,
            what="rank 1 running",
        )
        os.kill(int((tmp_path / "1").read_text()), signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        cause = _cause_of(
            subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
            run_dir,
            run_json(run_dir),
        )
        assert cause["kind"] == "killed" and cause["summary"].startswith(
            "killed by SIGTERM from outside xl"
        ), cause
        wait_no_processes(run_dir, timeout=GRACE + 10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
        kill_run(run_dir)


def test_the_kernel_oom_killer_in_a_memory_cgroup_is_host_oom(tmp_path: Path) -> None:
    """Rank 1 moves itself into a cgroup v1 memory cgroup of 64 MiB and allocates past it: the
    kernel's OOM killer ends it; the cause names the cgroup, its limit and what the rank held."""
    root = Path("/sys/fs/cgroup/memory")
    if (
        os.geteuid() != 0
        or not (root / "cgroup.procs").exists()
        or not os.access("/dev/kmsg", os.R_OK)
    ):
        pytest.skip("needs root, the cgroup v1 memory controller and the kernel log")
    group = root / f"xl-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(64 << 20))
        if (group / "memory.memsw.limit_in_bytes").exists():
            # no swap to escape to
            (group / "memory.memsw.limit_in_bytes").write_text(str(64 << 20))
        body = (
            f"import os, time\nif os.environ['RANK'] == '1':\n    open('{group}/cgroup.procs', "
            "'w').write(str(os.getpid()))\n"
            "    chunks = []\n    for _ in range(64):\n        chunks.append(bytearray(8 << "
            "20))\ntime.sleep(60)\n"
        )
        proc, run_dir, run = _launch(tmp_path, body)
        try:
            cause = _cause_of(proc, run_dir, run)
            assert run["failure"]["exit_code"] == -signal.SIGKILL
            # What the kernel's log says of this cgroup now, to tell a line logged late from one
            # never logged when this fails on a loaded machine.
            assert cause["kind"] == "host_oom", (cause, run["ranks"], [
                line for line in host.kernel_lines() if group.name in line or "Killed" in line
            ][-6:])
            assert f"memory cgroup /{group.name} has a limit of 64 MiB" in cause["summary"], cause
            assert "Killed process" in cause["evidence"][0]
            # The rank's memory at death, as the kernel counted it (anon + file + shmem RSS):
            # most of the limit was the 8 MiB chunks it allocated.
            kb = [
                int(x) for x in re.findall(r"(?:anon|file|shmem)-rss:(\d+)kB", cause["evidence"][0])
            ]
            held = cause["summary"].split("it held ")[1].split(" when")[0]
            assert held == f"{round(sum(kb) / 1024)} MiB" and sum(kb) >= 48 << 10, (held, kb)
            assert "64 MiB" in cause["fix"]
        finally:
            kill_run(run_dir)
    finally:
        group.rmdir()


def test_a_tiny_dev_shm_fails_dataloader_workers_as_shm_full(tmp_path: Path) -> None:
    """/dev/shm of 1 MiB in a private mount namespace: DataLoader workers cannot hand their
    batches over; the cause says the mount's size and the doctor's way to grow it."""
    if (
        os.geteuid() != 0
        or subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30).returncode
        != 0
    ):
        pytest.skip("needs root and unshare -m")
    body = """
        import os, time, torch
        from torch.utils.data import DataLoader, Dataset
        class Big(Dataset):
            def __len__(self): return 64
            def __getitem__(self, i): return torch.zeros(1 << 20)
        if os.environ["RANK"] == "1":
            for batch in DataLoader(Big(), batch_size=4, num_workers=2):
                pass
        time.sleep(60)
    """
    prefix = [
        "unshare",
        "-m",
        "sh",
        "-c",
        'mount -t tmpfs -o size=1M tmpfs /dev/shm && exec "$@"',
        "sh",
    ]
    proc, run_dir, run = _launch(tmp_path, body, prefix=prefix)
    try:
        cause = _cause_of(proc, run_dir, run)
        assert cause["kind"] == "shm_full", cause
        assert cause["summary"].startswith("shared memory /dev/shm (1.0 MiB") or cause[
            "summary"
        ].startswith("shared memory /dev/shm (1 MiB"), cause
        assert "remount,size=" in cause["fix"] or "--shm-size" in cause["fix"], cause
        assert run["failure"]["error"].startswith(
            "RuntimeError: unable to allocate shared memory(shm)"
        ), run["failure"]["error"]
    finally:
        kill_run(run_dir)


def test_the_script_s_own_error_is_its_last_line_with_no_fix(tmp_path: Path) -> None:
    """An error that merely mentions memory and shared tables is the script's own: `exception`."""
    body = (
        "import os, time\nif os.environ['RANK'] == '1':\n"
        "    raise RuntimeError('shared memory table full: out of memory in the embedding "
        "cache\\nsee cache.py')\ntime.sleep(60)\n"
    )
    proc, run_dir, run = _launch(tmp_path, body)
    try:
        cause = _cause_of(proc, run_dir, run)
        assert cause == {
            "kind": "exception",
            "summary": "RuntimeError: shared memory table full: out of memory in the embedding "
            "cache",
            "fix": None,
            "evidence": [
                "RuntimeError: shared memory table full: out of memory in the embedding cache"
            ],
        }
        assert (
            run["failure"]["message"]
            == "rank 1 failed first: RuntimeError: shared memory table full: out of memory in the "
            "embedding cache"
        )
    finally:
        kill_run(run_dir)


# ---------------------------------------------------------------- no invented cause
@pytest.mark.timeout(300)
def test_a_rank_that_exits_early_and_a_stopped_run_have_no_cause(tmp_path: Path) -> None:
    body = (
        "import os, time\nif os.environ['RANK'] == '1':\n    raise SystemExit(0)\ntime.sleep(1)\n"
    )
    home = tmp_path / "home"
    script = write_script(tmp_path, "early.py", body)
    done = xl(
        ["launch", "--no-tui", "--nproc", "2", str(script)], xl_env(home), cwd=tmp_path, timeout=180
    )
    run_dir = wait_run(home)
    try:
        run = run_json(run_dir)
        assert done.returncode == 0 and run["status"] == "succeeded" and run["failure"] is None, (
            done.stdout + done.stderr
        )
        assert not _failure_events(run_dir) and _said(done.stdout) == ([], [])
    finally:
        kill_run(run_dir)
    # `xl stop`: a stop, not a failure.
    home2 = tmp_path / "home2"
    script = write_script(
        tmp_path, "long.py", "import time\nprint('ready', flush=True)\ntime.sleep(120)\n"
    )
    proc = popen_launch(["--nproc", "2", str(script)], xl_env(home2), tmp_path)
    run_dir = wait_run(home2, timeout=120)
    try:
        wait_ranks_running(run_dir, 2, timeout=120)
        stopped = xl(["stop", run_dir.name], xl_env(home2), timeout=60)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        out, _err = proc.communicate(timeout=120)
        run = run_json(run_dir)
        assert run["status"] == "stopped" and run["failure"] is None
        assert not _failure_events(run_dir) and _said(out) == ([], [])
        wait_no_processes(run_dir, timeout=GRACE + 10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
        kill_run(run_dir)
