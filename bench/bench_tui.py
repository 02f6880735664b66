"""How much CPU the xl app costs while it watches things, next to nvitop watching the same GPUs.

    .venv/bin/python bench/bench_tui.py [--seconds 20]

In one run, each in its own tmux server (a real terminal, 200x50):
  1. xl's Monitor on a run of 64 simulated ranks logging at 10 Hz (a writer process appends to
     the run dir's metrics.jsonl) — CPU % of the app process;
  2. xl's GPUs screen on 8 simulated GPUs (polls NVML every 1 s) — CPU %;
  3. nvitop on the same 8 simulated GPUs, at 1 s like xl — CPU % (the anchor), measured over the
     same window as 2 (both run at once), so load from elsewhere hits both alike;
  4. the floor: the same app and widgets on the same GPUs, polling once — what Textual itself costs.
Then, headless in this process: the time to apply one Monitor refresh (reader poll + table,
header, charts update) for the 64-rank run. Prints the figures and their ratios to nvitop.
Goal (issue 6): <= 15 % of one core, and no more than nvitop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

import runfixtures  # noqa: E402
import simnvml  # noqa: E402

WRITER = """
import sys, time
sys.path.insert(0, {support!r})
import runfixtures
from pathlib import Path
run_dir = Path({run_dir!r})
step = 1000
while True:
    step += 1
    runfixtures.append_live(run_dir, ranks=64, step=step)
    time.sleep(0.1)
"""


class Pane:
    """One program in its own tmux server (a real terminal, 200x50)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], match: str) -> None:
        self.name = name
        self.sock = f"xl-bench-{uuid.uuid4().hex[:8]}"
        cmd = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
        exports = " ".join(f"{k}='{v}'" for k, v in env.items())
        subprocess.run(["tmux", "-L", self.sock, "new-session", "-d", "-s", name, "-x", "200", "-y", "50",
                        f"env {exports} {cmd}"], check=True, timeout=20)
        deadline = time.monotonic() + 30
        self.proc: psutil.Process | None = None
        while self.proc is None and time.monotonic() < deadline:
            for p in psutil.process_iter(["cmdline"]):
                if match in " ".join(p.info["cmdline"] or []) and "tmux" not in (p.info["cmdline"] or [""])[0]:
                    self.proc = p
                    break
            time.sleep(0.2)
        if self.proc is None:
            self.close()
            raise RuntimeError(f"{name} did not start")

    def screen(self) -> str:
        return subprocess.run(["tmux", "-L", self.sock, "capture-pane", "-p", "-t", self.name],
                              capture_output=True, text=True, timeout=20).stdout

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True, timeout=20)


def measure(panes: list[Pane], warmup: float, seconds: float) -> list[float]:
    """CPU % of one core of each pane's program, over the same window (same load on the machine)."""
    time.sleep(warmup)
    procs = [p.proc for p in panes if p.proc is not None]
    t0 = [p.cpu_times() for p in procs]
    w0 = time.monotonic()
    time.sleep(seconds)
    t1 = [p.cpu_times() for p in procs]
    wall = time.monotonic() - w0
    for pane in panes:
        if not pane.screen().strip():
            raise RuntimeError(f"{pane.name} shows nothing")
    return [100.0 * ((b.user - a.user) + (b.system - a.system)) / wall for a, b in zip(t0, t1, strict=True)]


def tmux_cpu(name: str, argv: list[str], env: dict[str, str], warmup: float, seconds: float, match: str) -> float:
    """CPU % of one core used by the process whose command line contains ``match``."""
    pane = Pane(name, argv, env, match)
    try:
        return measure([pane], warmup, seconds)[0]
    finally:
        pane.close()


async def refresh_time(run_dir: Path, rounds: int = 30) -> tuple[float, float]:
    """Median seconds for one reader poll, and for applying one view to the Monitor."""
    from xl.launcher.reader import RunReader
    from xl.tui.app import build_app

    app = build_app(monitor_run_dir=run_dir, poll_interval=3600)
    polls, applies = [], []
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause(0.5)
        screen = app.screen
        reader = RunReader(run_dir)
        reader.poll()
        for _ in range(rounds):
            await asyncio.sleep(0.1)  # let the writer append one more round of 64 lines
            t = time.perf_counter()
            view = reader.poll()
            polls.append(time.perf_counter() - t)
            t = time.perf_counter()
            screen._render_view(view)
            await pilot.pause()  # includes the repaint
            applies.append(time.perf_counter() - t)
    return statistics.median(polls), statistics.median(applies)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        print("tmux is required", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="xl-bench-"))
    writer = None
    try:
        lib = simnvml.build(tmp / "lib")
        gpus = [simnvml.SimGPU(util_seq=(20, 60, 95, 40), util_seq_ms=700, memory_used_mib=20_000 + 5000 * i)
                for i in range(8)]
        sim = simnvml.SimNVML(lib, tmp / "simnvml.conf", gpus)
        home = tmp / "xlhome"
        run_dir = runfixtures.make_run(home / "runs", "wide", t0=time.time() - 60, run_id="bench-64")
        writer = subprocess.Popen([sys.executable, "-c", WRITER.format(support=str(ROOT / "tests" / "support"), run_dir=str(run_dir))])
        env = {**sim.env, "XL_HOME": str(home), "XL_CONFIG_HOME": str(tmp / "config"),
               "TERM": "xterm-256color", "PATH": os.environ.get("PATH", "")}
        py = sys.executable
        monitor_cpu = tmux_cpu("monitor", [py, "-c", f"from xl.tui.app import run_monitor; run_monitor({str(run_dir)!r})  # xl-bench-monitor"],
                               env, args.warmup, args.seconds, "xl-bench-monitor")
        # The floor: the same app and widgets showing the same GPUs, but polling only once.
        floor_cpu = tmux_cpu("floor", [py, "-c", "from xl.tui.app import build_app; build_app(poll_interval=1e6).run()  # xl-bench-floor"],
                             env, args.warmup, args.seconds, "xl-bench-floor")
        # xl's GPUs screen and nvitop side by side over the same window: whatever else loads the
        # machine loads both, so their ratio holds still from run to run.
        nvitop = shutil.which("nvitop") or str(Path(sys.executable).with_name("nvitop"))
        panes = [Pane("gpus", [py, "-c", "from xl.tui.app import main; main([])  # xl-bench-gpus"], env, "xl-bench-gpus")]
        nvitop_cpu: float | None = None
        try:
            try:
                panes.append(Pane("nvitop", [nvitop, "--interval", "1"], env, "nvitop"))
            except RuntimeError as exc:
                print(f"nvitop could not run here: {exc}")
            cpus = measure(panes, args.warmup, args.seconds)
        finally:
            for pane in panes:
                pane.close()
        gpus_cpu = cpus[0]
        if len(cpus) > 1:
            nvitop_cpu = cpus[1]
        poll_s, apply_s = asyncio.run(refresh_time(run_dir))
    finally:
        if writer is not None:
            writer.kill()
            writer.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"xl Monitor, 64 ranks at 10 Hz : {monitor_cpu:5.1f} % of one core")
    print(f"xl GPUs screen, 8 GPUs (1 s)  : {gpus_cpu:5.2f} % of one core")
    print(f"  floor: same app, no polling : {floor_cpu:5.2f} % of one core")
    if nvitop_cpu is not None:
        print(f"nvitop, 8 GPUs (1 s)          : {nvitop_cpu:5.2f} % of one core   (anchor, same window as xl GPUs)")
        if nvitop_cpu > 0:
            print(f"ratio xl GPUs / nvitop        : {gpus_cpu / nvitop_cpu:5.2f}")
            print(f"ratio xl Monitor / nvitop     : {monitor_cpu / nvitop_cpu:5.2f}")
    print(f"one refresh, 64 ranks         : reader poll {poll_s * 1e3:.1f} ms + apply/paint {apply_s * 1e3:.1f} ms")
    ok = max(monitor_cpu, gpus_cpu) <= 15.0 and (nvitop_cpu is None or gpus_cpu <= nvitop_cpu)
    print("goal (<= 15 % of a core, no more than nvitop):", "met" if ok else "NOT met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
