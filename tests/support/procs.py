"""Helpers for tests that start real runs: run `xl`, wait for a run, find its processes.

A run's processes are found the way a person would check for orphans: every process whose
environment carries the run's ``XL_RUN_ID`` (torchrun and every rank, whatever their parent),
plus the supervisor recorded in run.json. Exit codes are never trusted for this.

``launched_run(...)`` is the one way an e2e test launches a run, waits for what it asks and, at
the end, checks that no process of the run is left (and kills what is).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import psutil

T = TypeVar("T")
XL = [sys.executable, "-m", "xl"]


def xl_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment for an `xl` subprocess: XL_HOME in a tmp dir, and its settings (the
    Launch form's memory) there too, so that no test's form opens filled in by another's run;
    a short stop grace."""
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    # A Textual test earlier in this worker leaves COLUMNS/LINES in os.environ; an `xl` whose
    # output is piped fits COLUMNS, so a test sees the width it asks for, or none.
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    env.update({
        "XL_HOME": str(home),
        "XL_CONFIG_HOME": str(home / "config"),
        "XL_STOP_GRACE": "1",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra)
    return env


def xl(
    args: Sequence[str], env: Mapping[str, str], *, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*XL, *args], env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def wait_for(
    predicate: Callable[[], T],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``
    (with what ``explain`` says of the state it was left in)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}"
                + (f"\n{explain()}" if explain else "")
            )
        time.sleep(interval)


def describe_run(run_dir: Path) -> str:
    """What a run dir shows, for a test that timed out waiting on it: run.json's status and
    ranks, each file's size, the last events, the supervisor log's tail, and which of its
    processes live."""
    run = run_json(run_dir)
    lines = [
        f"run.json: status={run.get('status')!r} supervisor={run.get('supervisor_pid')} "
        f"torchrun={run.get('torchrun_pid')}"
    ]
    lines += [
        f"  rank {r.get('rank')}: pid={r.get('pid')} state={r.get('state')!r}"
        for r in run.get("ranks") or []
    ]
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        with contextlib.suppress(OSError):
            lines.append(f"  {path.relative_to(run_dir)}: {path.stat().st_size} bytes")
    for name, keep in (("events.jsonl", 15), ("supervisor.log", 30)):
        with contextlib.suppress(OSError):
            lines += [
                f"{name}, the end:",
                *(run_dir / name).read_text(errors="replace").splitlines()[-keep:],
            ]
    with contextlib.suppress(Exception):
        lines += [
            f"live: {p.pid} {p.status()} {' '.join(p.cmdline())[:160]}"
            for p in run_processes(run_dir)
        ]
    return "\n".join(lines)


def only_run(home: Path) -> Path:
    runs = run_dirs(home)
    assert len(runs) == 1, runs
    return runs[0]


def run_json(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def run_dirs(home: Path) -> list[Path]:
    """The run dirs under ``home``, sorted: folders only (``xl launch`` proves runs/ writable with a
    ``.probe-<pid>`` file it removes at once; a wait that took it for the run waited on nothing)."""
    try:
        return sorted(
            p for p in (home / "runs").iterdir() if not p.name.startswith(".") and p.is_dir()
        )
    except OSError:
        return []


def first_run(home: Path) -> Path | None:
    dirs = run_dirs(home)
    return dirs[0] if dirs else None


def wait_run(home: Path, *, timeout: float = 60) -> Path:
    """The run dir of the only run under ``home`` once it exists."""
    return wait_for(lambda: first_run(home), timeout=timeout, what="the run dir")


def wait_ranks_running(run_dir: Path, n: int, *, timeout: float = 60) -> dict[str, Any]:
    """run.json once ``n`` ranks have reported their PIDs and the script printed 'ready'."""

    def ready() -> dict[str, Any] | None:
        run = run_json(run_dir)
        ranks = run.get("ranks") or []
        if len([r for r in ranks if r.get("pid")]) < n:
            return None
        for r in range(n):
            log = run_dir / "logs" / f"rank-{r}.log"
            if not log.exists() or "ready" not in log.read_text(errors="replace"):
                return None
        return run

    return wait_for(
        ready, timeout=timeout, what=f"{n} ranks to start", explain=lambda: describe_run(run_dir)
    )


def wait_final(run_dir: Path, *, timeout: float = 60) -> dict[str, Any]:
    return wait_for(
        lambda: (r := run_json(run_dir)).get("status") in ("succeeded", "failed", "stopped") and r,
        timeout=timeout,
        what="the run to end",
        explain=lambda: describe_run(run_dir),
    )


def run_processes(run_dir: Path) -> list[psutil.Process]:
    """Live processes of a run: XL_RUN_ID in their environment, or its recorded supervisor."""
    run = run_json(run_dir)
    run_id = run.get("run_id") or run_dir.name
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("XL_RUN_ID") == run_id:
                found[proc.pid] = proc
        except (psutil.Error, OSError):
            continue
    pids = [run.get("supervisor_pid"), run.get("torchrun_pid")]
    pids += [r.get("pid") for r in run.get("ranks") or []]
    for pid in pids:
        if not pid or pid in found:
            continue
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() <= time.time():
                found[pid] = proc
        except psutil.Error:
            continue
    return list(found.values())


def describe(procs: Sequence[psutil.Process]) -> str:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid}: {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            out.append(f"{p.pid}: (gone)")
    return "; ".join(out)


def wait_no_processes(run_dir: Path, *, timeout: float) -> None:
    """Fail unless every process of the run is gone within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    left = run_processes(run_dir)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = run_processes(run_dir)
    assert not left, f"processes of the run still alive after {timeout}s: {describe(left)}"


def kill_run(run_dir: Path) -> None:
    """Test cleanup: SIGKILL whatever is left of a run (a failing test must not leak it)."""
    for proc in run_processes(run_dir):
        try:
            proc.kill()
        except psutil.Error:
            pass


def end_run(
    launch: subprocess.Popen[Any] | None, run_dir: Path | None, *, timeout: float = 60
) -> None:
    """Test cleanup: the launch command gone (killed if it is still there), then every process
    of its run, checked gone (and SIGKILLed if not, the check failing the test)."""
    if launch is not None and launch.poll() is None:
        launch.kill()
        launch.wait(timeout=30)
    if run_dir is not None:
        try:
            wait_no_processes(run_dir, timeout=timeout)
        finally:
            kill_run(run_dir)


@dataclass
class Launched:
    """A run ``launched_run`` started: its home, environment and run dir; the foreground
    ``xl launch`` while it runs (``launch``), and what a launch that ended printed (``done``:
    the whole run's output, or `--detach`'s run id)."""

    home: Path
    env: dict[str, str]
    run_dir: Path
    launch: subprocess.Popen[str] | None = None
    done: subprocess.CompletedProcess[str] | None = None

    @property
    def result(self) -> subprocess.CompletedProcess[str]:
        """What the launch that ended printed, and its exit code."""
        assert self.done is not None, "the launch has not ended: finish() it"
        return self.done

    def run(self) -> dict[str, Any]:
        return run_json(self.run_dir)

    def ranks_running(self, n: int = 2, *, timeout: float = 90) -> dict[str, Any]:
        return wait_ranks_running(self.run_dir, n, timeout=timeout)

    def final(self, *, timeout: float = 90) -> dict[str, Any]:
        return wait_final(self.run_dir, timeout=timeout)

    def finish(self, *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """The foreground launch waited on to its end: its exit code and output in ``done``."""
        assert self.launch is not None, "finish() is for a foreground launch"
        out, err = self.launch.communicate(timeout=timeout)
        self.done = subprocess.CompletedProcess(self.launch.args, self.launch.returncode, out, err)
        return self.done

    def xl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Another `xl` command (`stop`, `runs`, `attach`...) with the run's environment."""
        return xl(args, self.env, timeout=timeout)


How = Literal["foreground", "detach", "to_end"]


@contextlib.contextmanager
def launched_run(
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    cwd: Path,
    how: How = "foreground",
    ranks: int = 0,
    timeout: float = 90,
    gone_within: float = 60,
    merge_stderr: bool = False,
    **popen: Any,
) -> Iterator[Launched]:
    """`xl launch ARGS` (its plain view: output piped), waited on until the run dir exists and
    ``ranks`` ranks printed "ready"; ``how``: "foreground" keeps the command running (``launch``),
    "detach" launches with --detach, "to_end" waits for the command to end (``done``).

    When the test's block ends, every process of the run must be gone within ``gone_within``
    seconds (a generous wait: the check is that they go, on a machine however busy); whatever is
    left is killed either way. A block that raised has its run killed at once, its error kept.
    """
    home = Path(env["XL_HOME"])
    before = set(run_dirs(home))
    mode = ["--detach"] if how == "detach" else ["--no-tui"]
    command = [*XL, "launch", *mode, *args]
    stderr = subprocess.STDOUT if merge_stderr else subprocess.PIPE
    launch: subprocess.Popen[str] | None = None
    done: subprocess.CompletedProcess[str] | None = None
    io: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": stderr, "text": True, **popen}
    if how == "foreground":
        launch = subprocess.Popen(command, env=dict(env), cwd=cwd, **io)
    else:
        done = subprocess.run(command, env=dict(env), cwd=cwd, timeout=timeout, **io)

    def said() -> str:
        if launch is not None and launch.poll() is not None:
            return "xl launch ended: " + "".join(o or "" for o in launch.communicate())[-3000:]
        return f"xl launch: {done}" if done else ""

    run_dir: Path | None = None
    try:
        if how == "detach":
            assert done is not None and done.returncode == 0, f"{done}"
            run_dir = home / "runs" / done.stdout.strip()
        else:
            run_dir = wait_for(
                lambda: next(iter(sorted(set(run_dirs(home)) - before)), None),
                timeout=timeout,
                what="the run dir",
                explain=said,
            )
        launched = Launched(home, dict(env), run_dir, launch, done)
        if ranks:
            launched.ranks_running(ranks, timeout=timeout)
        yield launched
    except BaseException:
        _kill_launch(launch)
        if run_dir is not None:
            kill_run(run_dir)
        raise
    _kill_launch(launch)
    end_run(None, run_dir, timeout=gone_within)


def _kill_launch(launch: subprocess.Popen[str] | None) -> None:
    if launch is not None:
        if launch.poll() is None:
            launch.kill()
        launch.communicate(timeout=30)


def free_port(host: str = "127.0.0.1", count: int = 1) -> int:
    """A port free on ``host``, with the ``count - 1`` after it free too, outside the kernel's
    ephemeral range. A port the kernel hands out (a bind to 0, or any outgoing connection of
    another test running beside this one) can be handed out again between this choice and its
    use; a port below that range is only ever taken by a bind that names it."""
    import random  # noqa: PLC0415 - kept beside their one user
    import socket  # noqa: PLC0415

    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    spans = [
        (lo, hi - count) for lo, hi in ((10000, low - 1), (high + 1, 65535)) if hi - count > lo
    ]
    if not spans:
        raise AssertionError(f"the ephemeral range {low}-{high} leaves no port outside it")
    for _ in range(200):
        lo, hi = random.choice(spans)
        port = random.randint(lo, hi)
        with contextlib.ExitStack() as stack:
            try:
                for p in range(port, port + count):
                    stack.enter_context(socket.socket()).bind((host, p))
            except OSError:
                continue
        return port
    raise AssertionError(f"no {count} free ports in a row on {host}")


def rdzv_port(host: str = "127.0.0.1") -> int:
    """A free port whose next one (node 0's collector: rdzv port + 1) is free too."""
    return free_port(host, count=2)
