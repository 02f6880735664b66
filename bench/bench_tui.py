"""How much CPU the xl app costs while it watches a big run and 8 GPUs, next to nvitop.

    .venv/bin/python bench/bench_tui.py [--seconds 20] [--warmup 5] [--windows 5]

What the app's benchmark measures, in one run:

  1. The xl app as a person runs it, in a real terminal (its own tmux server, 200x50): the
     Monitor on a run of 64 simulated ranks (8 nodes x 8) that a writer process keeps appending
     to -- every rank logs a train line at 10 Hz (640 lines/s), and a sys line (its GPU's
     utilization and memory, from the 8 simulated GPUs) once a second as the supervisor's sampler
     would. The GPUs screen under the Monitor is paused, as in the product.
  2. nvitop on 8 simulated GPUs (NVML through tests/support/simnvml.c) at a 1 s interval, in its
     own tmux server -- the anchor. It runs CONCURRENTLY with the xl app and both are measured over
     the same wall windows (psutil CPU times at their ends): this machine's 2 cores are shared with
     other work, and whatever load lands during a window lands on both alike. Even so one window's
     ratio moves by about +-10%, so several windows run back to back (5 by default) and the
     verdict takes the median ratio; every window's figures are printed.
  3. The time to apply one refresh, measured inside the app process during the same window:
     reader poll (worker thread, reads the new metrics lines), then the Monitor's apply (rank
     table, header, progress, charts) through to the end of the repaint that follows it.
  4. Context, in a second shared window after the main one: an upper bound, the same app doing
     both jobs at once (the GPUs screen forced to keep polling the 8 GPUs under the Monitor, which
     the product never does: Textual repaints the screen on top for every change to the one below
     it, so this costs more than the two jobs apart), with the GPUs screen's apply time; the floor
     (the app on the same GPUs polling only once: Textual idle); and like for like, the app's GPUs
     screen alone against nvitop, both doing nvitop's whole job (8 GPUs polled every second), in
     that same window.

(An earlier version timed the Monitor's refresh headless under Pilot in this process; Pilot's
pause forces a full layout and repaint each time, so that figure said more about Pilot than about
the app. Item 3 times the refresh a person actually gets, inside the running app.)

Prints each figure, the xl/nvitop ratio and the verdict on the goal: the app <= 15 % of one core,
and no more than nvitop. Numbers move with the machine's load; run it twice before believing a
change of a few tenths of a percent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
SUPPORT = ROOT / "tests" / "support"
sys.path.insert(0, str(SUPPORT))

import runfixtures  # noqa: E402
import simnvml  # noqa: E402

RANKS = 64
GPUS = 8
GOAL_PCT = 15.0

WRITER = """
import json, math, sys, time
sys.path.insert(0, {support!r})
import runfixtures
from pathlib import Path
run_dir = Path({run_dir!r})
step, last_sys = 1000, 0.0
while True:
    step += 1
    runfixtures.append_live(run_dir, ranks={ranks}, step=step)  # every rank, one train line
    now = time.time()
    if now - last_sys >= 1.0:  # the supervisor's 1 Hz sampler: one sys line per rank
        last_sys = now
        rows = [json.dumps({{"t": now, "rank": r, "kind": "sys",
                             "gpu_util": 50 + 40 * math.sin(step / 10 + r),
                             "gpu_mem_used_mib": 40000 + 10 * (step % 100) + r,
                             "gpu_mem_total_mib": 81920, "rss_mib": 3000 + r}})
                for r in range({ranks})]
        with (run_dir / "metrics.jsonl").open("a") as fh:
            fh.write("\\n".join(rows) + "\\n")
    time.sleep(0.1)
"""


# -- the app process (run in tmux by the bench: `bench_tui.py --app RUN_DIR STATS MODE`) --------

APP_MARK = "xl-bench-app"


def run_app(run_dir: Path, stats: Path, mode: str) -> int:
    """The xl app on ``run_dir``'s Monitor; with ``mode`` "both" the GPUs screen keeps polling
    underneath ("monitor": paused there, as in the product). Writes what it did (polls applied,
    apply times) to ``stats`` when sent SIGUSR1 (dump_stats)."""

    from xl.launcher.view.reader import RunReader  # noqa: PLC0415 - only the measured child process loads the app
    from xl.tui.app import build_app  # noqa: PLC0415 - only the measured child process loads the app
    from xl.tui.screens.gpus import GPUsScreen  # noqa: PLC0415 - only the measured child process loads the app
    from xl.tui.screens.monitor import MonitorScreen  # noqa: PLC0415 - only the measured child process loads the app

    record: dict[str, list[float]] = {"reader_poll": [], "monitor_apply": [], "gpus_apply": []}

    if mode == "both":
        # Keep polling NVML while the Monitor covers the GPUs screen (the product pauses it there).
        GPUsScreen.on_screen_suspend = lambda self: None  # type: ignore[method-assign]

    reader_poll = RunReader.poll

    def timed_poll(self: Any, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return reader_poll(self, *args, **kwargs)
        finally:
            record["reader_poll"].append(time.perf_counter() - t)

    RunReader.poll = timed_poll  # type: ignore[method-assign]

    monitor_polled = MonitorScreen.on_monitor_screen_polled

    def timed_monitor(self: Any, message: Any) -> None:
        t = time.perf_counter()
        monitor_polled(self, message)
        # Until the repaint that shows it is done.
        def done() -> None:
            record["monitor_apply"].append(time.perf_counter() - t)

        self.call_after_refresh(done)

    MonitorScreen.on_monitor_screen_polled = timed_monitor  # type: ignore[method-assign]

    gpus_polled = GPUsScreen.on_gpus_screen_polled

    def timed_gpus(self: Any, message: Any) -> None:
        t = time.perf_counter()
        gpus_polled(self, message)
        record["gpus_apply"].append(time.perf_counter() - t)

    GPUsScreen.on_gpus_screen_polled = timed_gpus  # type: ignore[method-assign]

    def save(*_: Any) -> None:
        # Only when the bench asks, at a window's edges: writing the growing record every second
        # (or a thread of the bench's own waking up) would be counted as the app's CPU.
        tmp = stats.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(stats)

    signal.signal(signal.SIGUSR1, save)

    build_app(monitor_run_dir=run_dir, attach_only=False).run()
    return 0


# -- the bench ---------------------------------------------------------------------------------


class Pane:
    """One program in its own tmux server (a real terminal, 200x50)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], match: str) -> None:
        self.name = name
        self.sock = f"xl-bench-{uuid.uuid4().hex[:8]}"
        cmd = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
        exports = " ".join(f"{k}='{v}'" for k, v in env.items())
        subprocess.run(
            [
                "tmux", "-L", self.sock, "new-session", "-d", "-s", name, "-x", "200", "-y", "50",
                f"env {exports} {cmd}",
            ],
            check=True,
            timeout=20,
        )
        # The program is found from the pane's own pid (tmux's pane_pid: the shell that execs
        # it, or its parent), never by name across the machine: a stray process of an earlier
        # run with the same name must not be measured instead.
        deadline = time.monotonic() + 30
        self.proc: psutil.Process | None = None
        while self.proc is None and time.monotonic() < deadline:
            out = subprocess.run(
                ["tmux", "-L", self.sock, "list-panes", "-t", name, "-F", "#{pane_pid}"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.split()
            with contextlib.suppress(psutil.Error, ValueError, IndexError):
                root = psutil.Process(int(out[0]))
                for p in (root, *root.children(recursive=True)):
                    cmdline = p.cmdline() or [""]
                    if match in " ".join(cmdline) and not cmdline[0].endswith(("sh", "env")):
                        self.proc = p
                        break
            if self.proc is None:
                time.sleep(0.2)
        if self.proc is None:
            self.close()
            raise RuntimeError(f"{name} did not start")

    def screen(self) -> str:
        return subprocess.run(["tmux", "-L", self.sock, "capture-pane", "-p", "-t", self.name],
                              capture_output=True, text=True, timeout=20).stdout

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True, timeout=20)


def measure(
    panes: list[Pane], warmup: float, seconds: float, at_start: Any = None
) -> tuple[list[float], float]:
    """CPU % of one core of each pane's program over one shared wall window, and the window (s)."""
    time.sleep(warmup)
    procs = [p.proc for p in panes if p.proc is not None]
    if at_start is not None:
        at_start()
    t0 = [p.cpu_times() for p in procs]
    w0 = time.monotonic()
    time.sleep(seconds)
    t1 = [p.cpu_times() for p in procs]
    wall = time.monotonic() - w0
    for pane in panes:
        if not pane.screen().strip():
            raise RuntimeError(f"{pane.name} shows nothing")
    cpus = [
        100.0 * ((b.user - a.user) + (b.system - a.system)) / wall
        for a, b in zip(t0, t1, strict=True)
    ]
    return cpus, wall


def dump_stats(pane: Pane, path: Path) -> dict[str, list[float]]:
    """What the app in ``pane`` has recorded so far: asks it (SIGUSR1) to write ``path``."""
    path.unlink(missing_ok=True)
    if pane.proc is not None:
        with contextlib.suppress(psutil.Error):
            pane.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text())
        time.sleep(0.05)
    return {}


def _ms(values: list[float]) -> str:
    if not values:
        return "no samples"
    values = sorted(values)
    p95 = values[min(len(values) - 1, int(0.95 * len(values)))]
    return (
        f"median {statistics.median(values) * 1e3:5.1f} ms, p95 {p95 * 1e3:5.1f} ms "
        f"(n={len(values)})"
    )


def bench(seconds: float, warmup: float, windows: int) -> int:
    if shutil.which("tmux") is None:
        print("tmux is required", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="xl-bench-"))
    writer: subprocess.Popen[bytes] | None = None
    py = sys.executable
    try:
        home = tmp / "xlhome"
        run_dir = runfixtures.make_run(
            home / "runs", "wide", t0=time.time() - 60, run_id="bench-64"
        )
        writer = subprocess.Popen(
            [py, "-c", WRITER.format(support=str(SUPPORT), run_dir=str(run_dir), ranks=RANKS)]
        )
        lib = simnvml.build(tmp / "lib")
        # Busy GPUs whose utilization changes every 0.7 s, each with a process (the writer: a real
        # PID, so both tools read its /proc entry as they would a rank's).
        gpus = [
            simnvml.SimGPU(
                util_seq=(20, 60, 95, 40),
                util_seq_ms=700,
                memory_used_mib=20_000 + 5000 * i,
                processes=[simnvml.SimProcess(writer.pid, 1000.0)],
            )
            for i in range(GPUS)
        ]
        sim = simnvml.SimNVML(lib, tmp / "simnvml.conf", gpus)
        env = {**sim.env, "XL_HOME": str(home), "XL_CONFIG_HOME": str(tmp / "config"),
               "TERM": "xterm-256color", "PATH": os.environ.get("PATH", "")}
        stats = tmp / "app-stats.json"

        # 1-3: the xl app as shipped (Monitor) and nvitop, side by side over one window.
        me = str(Path(__file__).resolve())
        panes = [
            Pane(
                "xl",
                [py, me, "--app", str(run_dir), str(stats), "monitor", APP_MARK],
                env,
                APP_MARK,
            )
        ]
        nvitop = shutil.which("nvitop") or str(Path(py).with_name("nvitop"))
        nvitop_cpu: float | None = None
        start: dict[str, list[float]] = {}
        try:
            try:
                panes.append(Pane("nvitop", [nvitop, "--interval", "1"], env, "nvitop"))
            except RuntimeError as exc:
                print(f"nvitop could not run here: {exc}")
            # Several windows back to back, the same two programs running on: one window's ratio
            # moves by +-10% with whatever else the machine does; the median of several holds.
            per_window: list[list[float]] = []
            for i in range(windows):
                cpus, wall = measure(
                    panes,
                    warmup if i == 0 else 0.0,
                    seconds,
                    at_start=(lambda: start.update(dump_stats(panes[0], stats)))
                    if i == 0
                    else None,
                )
                per_window.append(cpus)
            end = dump_stats(panes[0], stats)
        finally:
            for pane in panes:
                pane.close()
        app_cpu = statistics.median(c[0] for c in per_window)
        ratios: list[float] = []
        if len(per_window[0]) > 1:
            nvitop_cpu = statistics.median(c[1] for c in per_window)
            ratios = [c[0] / c[1] for c in per_window if c[1] > 0]
        # What the app did during the window (its records only grow).
        window = {k: v[len(start.get(k, [])):] for k, v in end.items()}

        # 4: context, in a second shared window.
        both_stats = tmp / "both-stats.json"
        both: dict[str, list[float]] = {}
        context = [
            Pane(
                "both",
                [py, me, "--app", str(run_dir), str(both_stats), "both", "xl-bench-both"],
                env,
                "xl-bench-both",
            ),
            Pane(
                "floor",
                [
                    py,
                    "-c",
                    "from xl.tui.app import build_app; build_app(poll_interval=1e6).run()  # "
                    "xl-bench-floor",
                ],
                env,
                "xl-bench-floor",
            ),
            # Like for like: the app's GPUs screen alone, nvitop's whole job (8 GPUs at 1 s).
            Pane(
                "gpus",
                [
                    py,
                    "-c",
                    "from xl.tui.app import build_app; build_app(poll_interval=1.0).run()  # "
                    "xl-bench-gpus",
                ],
                env,
                "xl-bench-gpus",
            ),
        ]
        gpus_cpu: float | None = None
        nvitop2_cpu: float | None = None
        try:
            with contextlib.suppress(RuntimeError):
                context.append(Pane("nvitop", [nvitop, "--interval", "1"], env, "nvitop"))
            context_cpus, _ = measure(context, warmup, seconds)
            both_cpu, floor_cpu, gpus_cpu = context_cpus[:3]
            both = dump_stats(context[0], both_stats)
            if len(context_cpus) > 3:
                nvitop2_cpu = context_cpus[3]
        finally:
            for pane in context:
                pane.close()
    finally:
        if writer is not None:
            writer.kill()
            writer.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)

    monitor_polls = len(window.get("monitor_apply", []))
    print(
        f"{len(per_window)} windows of {wall:.0f} s, xl app and nvitop at once; {RANKS} ranks x "
        f"10 Hz = {RANKS * 10} lines/s; {GPUS} simulated GPUs"
    )
    for i, cpus in enumerate(per_window, 1):
        pair = (
            f"xl app {cpus[0]:4.2f} %, nvitop {cpus[1]:4.2f} %  ratio {cpus[0] / cpus[1]:4.2f}"
            if len(cpus) > 1 and cpus[1]
            else f"xl app {cpus[0]:4.2f} %"
        )
        print(f"  window {i}: {pair}")
    print(f"xl app: the Monitor on 64 ranks (as shipped), median   : {app_cpu:5.2f} % of one core"
          f"   [{monitor_polls} Monitor refreshes in the windows]")
    if nvitop_cpu is not None:
        print(
            f"nvitop, 8 GPUs at 1 s, median                          : {nvitop_cpu:5.2f} % of "
            "one core   (anchor, same windows)"
        )
    if ratios:
        print(
            "ratio xl app / nvitop, median of the windows           : "
            f"{statistics.median(ratios):5.2f}"
            f"   (range {min(ratios):.2f}-{max(ratios):.2f})"
        )
    print("one refresh, in the app, same windows:")
    print(f"  reader poll (worker thread)          : {_ms(window.get('reader_poll', []))}")
    print(f"  Monitor apply + repaint, 64 ranks    : {_ms(window.get('monitor_apply', []))}")
    print("context, a second window shared by these four:")
    print(
        "  upper bound: the app doing both jobs, GPUs screen polling under the Monitor : "
        f"{both_cpu:5.1f} % of one core"
    )
    print(f"    its GPUs screen apply, 8 GPUs      : {_ms(both.get('gpus_apply', []))}")
    print(
        f"  floor: the app on the same GPUs, polling once                   : {floor_cpu:5.2f} % "
        "of one core"
    )
    if gpus_cpu is not None:
        print(
            "  like for like: the app's GPUs screen alone, 8 GPUs at 1 s       : "
            f"{gpus_cpu:5.2f} % of one core"
        )
    if nvitop2_cpu is not None:
        print(
            "  nvitop, the same 8 GPUs, same window                            : "
            f"{nvitop2_cpu:5.2f} % of one core"
        )
        if nvitop2_cpu > 0 and gpus_cpu is not None:
            print(
                "  ratio GPUs screen / nvitop (the same job)                       : "
                f"{gpus_cpu / nvitop2_cpu:5.2f}"
            )
    if monitor_polls == 0:
        print("WARNING: the Monitor did not refresh during the window; the CPU figure means little")
    within = app_cpu <= GOAL_PCT
    ratio = statistics.median(ratios) if ratios else None
    below = ratio is None or ratio <= 1.0
    verdict = "met" if within and below else "NOT met"
    detail = f"median {app_cpu:.2f} % {'<=' if within else '>'} {GOAL_PCT:g} %"
    if ratio is not None:
        detail += f"; median ratio to nvitop {ratio:.2f} {'<=' if below else '>'} 1"
    else:
        detail += "; nvitop could not run, so only the 15 % half was checked"
    print(f"goal (<= {GOAL_PCT:g} % of a core, no more than nvitop): {verdict} ({detail})")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=20.0, help="length of the measured window")
    ap.add_argument(
        "--warmup", type=float, default=5.0, help="seconds before the first window opens"
    )
    ap.add_argument(
        "--windows", type=int, default=5, help="measured windows, back to back (the medians decide)"
    )
    ap.add_argument(
        "--app", nargs=4, metavar=("RUN_DIR", "STATS", "MODE", "MARK"), help=argparse.SUPPRESS
    )
    args = ap.parse_args(argv)
    if args.app:
        return run_app(Path(args.app[0]), Path(args.app[1]), args.app[2])
    return bench(args.seconds, args.warmup, max(1, args.windows))


if __name__ == "__main__":
    raise SystemExit(main())
