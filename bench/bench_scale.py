"""Where xl breaks with thousands of ranks: simulated nodes and ranks into a real node 0.

    .venv/bin/python bench/bench_scale.py --ranks N [--ranks-per-node 8] [--json]
        [--seconds 30] [--warmup 10] [--steps-per-s 2] [--stall-s 30] [--sim-procs K]

What runs, each in processes of its own:

- **node 0**: xl's real supervisor (``launcher/control.py`` start_run, as ``xl launch --nnodes N
  --node-rank 0`` starts it) with its collector, hub, diagnoses, hang capture and run dir writers,
  and 8 real rank processes under xl's real rank entry (relay, stacks door, ``xl.log`` sender).
  Only torchrun is stood in for (bench/scale_node0.py): its rendezvous would wait for the other
  nodes' agents, which are simulated.
- **the other nodes**: bench/scale_sim.py, in ``--sim-procs`` processes: each node is xl's own
  ``NodeLink`` carrying what a follower sends (events, ranks, output, stacks answers, and once a
  second what its telemetry forwards: a sys line per rank and xl's own summary of its ranks'
  train lines, one row a rank), its ranks stepping ``--steps-per-s`` with the client's encoder
  into their node's summary (a node's ranks talk to their own node, never to node 0).
- **the viewers**: the Monitor, as ``xl attach`` opens it, headless (bench/scale_monitor.py); and
  the exporter's collector (``RunsCollector``, launcher/exporter/metrics.py) in this process.

Then, once the Monitor showed the run, ``--warmup`` s and a ``--seconds`` window in which node 0's
supervisor process (its CPU and largest resident set; not its children, not the simulator) and the
Monitor's process are measured, the wire counted by the kernel (``ss``: bytes both ways on every
connection to node 0's collector, node 0's own ranks included), and the exporter scraped as
Prometheus does by default: once as the window opens (``scrape_first_s``: it reads the run's
history), then every 15 s (``scrape_s``: the slowest of those; one at the window's end if it is
shorter). Then one rank of the last node stops stepping (its connection and its node's sys lines
go on, as a rank stuck in the person's code) and, with ``--hang all`` (the default: a synchronous
job), every other rank then waits in the all-reduce for it; with ``--hang one`` they go on.
``hang_named_after_s`` runs from its last step to when the event naming it is in events.jsonl:
the ``hang`` (all), or its ``stalled`` (one). Then ``xl stop``'s signal ends the run.

Prints one JSON object as its last line (``--json``) and exits 0 when it ran, whatever the figures;
2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TextIO

import psutil

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(BENCH))

from procs import free_port  # noqa: E402
from scale_node0 import SHIM  # noqa: E402

from xl.launcher.plan import Plan  # noqa: E402
from xl.launcher.spec import LaunchSpec  # noqa: E402

SIM = BENCH / "scale_sim.py"
NODE0 = BENCH / "scale_node0.py"
MONITOR = BENCH / "scale_monitor.py"
TAG = "XL_BENCH_SCALE"
STALL_FACTOR = 10.0  # the diagnoser's default XL_STALL_FACTOR
SCRAPE_EVERY_S = 15.0  # Prometheus's default scrape interval
DIAGNOSES = (
    "stalled", "hang", "straggler", "nan_loss", "gpu_mem_high", "node_lost", "node_supervisor_lost",
    "node_quiet",
)


def _say(text: str) -> None:
    print(f"bench_scale: {text}", file=sys.stderr, flush=True)


class Worker:
    """One simulator process: JSON lines from its stdout, commands to its stdin."""

    def __init__(self, cfg: dict[str, Any], env: dict[str, str], log: Path) -> None:
        self.cfg = cfg
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(SIM), json.dumps(cfg)],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                bufsize=1,
            )
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, out: TextIO | None) -> None:
        assert out is not None
        for line in out:
            with contextlib.suppress(ValueError):
                self.lines.put(json.loads(line))

    def send(self, cmd: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(cmd + "\n")
            self.proc.stdin.flush()

    def wait_for(self, key: str, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.lines.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                if self.proc.poll() is not None:
                    return None
                continue
            if key in msg:
                return msg
        return None


def wire_bytes(port: int) -> int:
    """Bytes both ways so far on every established connection to node 0's collector (the kernel's
    tcp_info, read by ``ss``)."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, timeout=60).stdout
    total = 0
    for word in out.split():
        for key in ("bytes_sent:", "bytes_received:"):
            if word.startswith(key):
                total += int(word[len(key):])
    return total


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system  # the process's own, not its children's


def leftovers(tag: str) -> list[psutil.Process]:
    """Processes this bench started (``TAG`` in their environment) that are still there."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid != os.getpid() and proc.environ().get(TAG) == tag:
                found.append(proc)
    return found


def exporter(runs: Path) -> Any:
    """What `xl exporter` serves: its collector of every run under ``runs``, in a registry."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415 - the exporter's own dependency, loaded as `xl exporter` loads it

    from xl.launcher.exporter.metrics import RunsCollector  # noqa: PLC0415 - as above

    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunsCollector(runs))
    return registry


def timed_scrape(registry: Any) -> tuple[float, int]:
    """One scrape as the exporter's /metrics handler makes it: seconds, and the exposition's
    bytes."""
    from prometheus_client import generate_latest  # noqa: PLC0415 - as exporter()

    t = time.perf_counter()
    body = generate_latest(registry)
    return time.perf_counter() - t, len(body)


def watch_events(
    events: Path, offset: int, culprit: int, want: str, timeout: float
) -> dict[str, float]:
    """When (this clock) events naming ``culprit`` were in events.jsonl: its ``stalled`` and the
    ``hang`` that names it, until the one ``want`` ("stalled": either) came."""
    deadline = time.monotonic() + timeout
    buf = b""
    seen: dict[str, float] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), open(events, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
            offset += len(data)
            buf += data
        now = time.time()
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            with contextlib.suppress(ValueError):
                ev = json.loads(raw)
                if not isinstance(ev, dict):
                    continue
                if ev.get("kind") == "stalled" and ev.get("rank") == culprit:
                    seen.setdefault("stalled", now)
                elif ev.get("kind") == "hang" and culprit in (ev.get("ranks") or []):
                    seen.setdefault("hang", now)
        if want in seen or (want == "stalled" and seen):
            return seen
        time.sleep(0.2)
    return seen


def judged(events: Path, culprit: int, victims_stall: bool, since: int) -> tuple[list[str], int]:
    """False alarms in the run's events: every diagnosis of a node (none was lost), and of a rank
    other than ``culprit`` (before it stopped, any; after, when the others waited for it, any but
    their ``stalled``); and how many of the others were told whom they wait on (a ``stalled`` event
    with ``waiting_on`` [culprit]). ``since``: where events.jsonl ended when it stopped."""
    out: set[str] = set()
    told: set[int] = set()
    with open(events, "rb") as fh:
        at = 0
        for raw in fh:
            after = at >= since
            at += len(raw)
            with contextlib.suppress(ValueError):
                ev = json.loads(raw)
                if not isinstance(ev, dict) or ev.get("kind") not in DIAGNOSES:
                    continue
                if ev["kind"].startswith("node_"):
                    out.add(f"{ev['kind']} node {ev.get('node_rank')}")
                    continue
                named = [
                    r
                    for r in [ev.get("rank"), *(ev.get("ranks") or [])]
                    if isinstance(r, int) and r != culprit
                ]
                if ev["kind"] == "stalled" and victims_stall and after:
                    if ev.get("waiting_on") == [culprit]:
                        told.update(named)
                    continue
                out.update(f"{ev['kind']} {r}" for r in named)
    return sorted(out, key=lambda a: (a.split()[0], int(a.split()[-1]))), len(told)


def ranks_logging(metrics: Path, tail: int = 16 << 20) -> int:
    """Ranks with a train record in the last ``tail`` bytes of node 0's metrics.jsonl."""
    with open(metrics, "rb") as fh:
        fh.seek(max(0, fh.seek(0, os.SEEK_END) - tail))
        data = fh.read()
    seen = set()
    for raw in data.split(b"\n")[1:]:
        with contextlib.suppress(ValueError):
            rec = json.loads(raw)
            if isinstance(rec, dict) and rec.get("kind") == "train":
                seen.add(rec.get("rank"))
    return len(seen)


def profile(
    folder: Path | None, pids: dict[str, int], seconds: float
) -> list[subprocess.Popen[bytes]]:
    """py-spy on each process over the window, without pausing it (``--nonblocking``: its cost
    is py-spy's own process, not the measured one's), only samples of a thread holding the GIL
    (``--gil``: Python at work, not waiting in a select or a lock): collapsed stacks per thread in
    ``folder/NAME.txt``. Nothing when ``folder`` is None."""
    if folder is None:
        return []
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    folder.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                spy, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
                "--rate", "50", "--nonblocking", "--gil", "--threads", "--format", "raw",
                "--output", str(folder / f"{name}.txt"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]


def newest_train(metrics: Path, tail: int = 1 << 20) -> float | None:
    """The time of the newest train record node 0 has written (metrics.jsonl's last MiB)."""
    with open(metrics, "rb") as fh:
        fh.seek(max(0, fh.seek(0, os.SEEK_END) - tail))
        lines = fh.read().split(b"\n")[1:]
    newest = None
    for raw in lines:
        with contextlib.suppress(ValueError):
            rec = json.loads(raw)
            if (
                isinstance(rec, dict)
                and rec.get("kind") == "train"
                and isinstance(rec.get("t"), (int, float))
            ):
                newest = max(newest or 0.0, float(rec["t"]))
    return newest


def collector_count(run_dir: Path) -> tuple[float, int]:
    """(when, records stored so far) from collector.json, which node 0 rewrites every 5 s."""
    status = json.loads((run_dir / "collector.json").read_text())
    return float(status.get("updated") or 0.0), int(status.get("records") or 0)


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(0.95 * len(values)))], 4)


def bench(ns: argparse.Namespace) -> dict[str, Any]:
    ranks, rpn = ns.ranks, ns.ranks_per_node
    nodes = ranks // rpn
    tmp = Path(tempfile.mkdtemp(prefix="xl-bench-scale-"))
    home = tmp / "home"
    os.environ["XL_HOME"] = str(home)  # start_run makes the run dir under it
    token = os.urandom(16).hex()
    # in every process this bench starts: whoever checks for leftovers finds them by it
    tag = os.urandom(8).hex()
    port = free_port(count=2)
    env = dict(os.environ)
    env.update({"XL_HOME": str(home), "XL_TOKEN": token, "XL_COLLECTOR_PORT": str(port + 1),
                "XL_STALL_MIN_S": str(ns.stall_s), "XL_STOP_GRACE": "3", "PYTHONUNBUFFERED": "1",
                TAG: tag})
    env.pop("CUDA_VISIBLE_DEVICES", None)
    stall_threshold = max(ns.stall_s, STALL_FACTOR / ns.steps_per_s)
    culprit = ranks - rpn // 2 - 1  # a rank of the last node: another node's, not node 0's
    result: dict[str, Any] = {
        "ranks": ranks,
        "nodes": nodes,
        "ranks_per_node": rpn,
        "steps_per_s": ns.steps_per_s,
        "stall_threshold_s": stall_threshold,
        "culprit": culprit,
        "bench_id": tag,
    }
    workers: list[Worker] = []
    monitor: subprocess.Popen[bytes] | None = None
    sup: psutil.Process | None = None
    try:
        from xl.launcher.control import start_run  # noqa: PLC0415 - after XL_HOME is set: it names where runs go

        shim = tmp / "shim" / "torch" / "distributed" / "distributed_c10d.py"
        shim.parent.mkdir(parents=True)
        shim.write_text(SHIM)
        flag = tmp / "hang-all"  # node 0's ranks wait in the all-reduce once it exists
        rank_cmd = ["rank", "--steps-per-s", str(ns.steps_per_s), "--log-every", str(ns.log_every),
                    "--block-flag", str(flag), "--shim", str(shim)]
        spec = LaunchSpec(script=str(NODE0), args=rank_cmd, nproc=rpn, nnodes=nodes, node_rank=0,
                          rdzv=f"127.0.0.1:{port}", name=f"bench-scale-{ranks}", cwd=str(ROOT))
        argv = [
            sys.executable, str(NODE0), "torchrun", "--nproc", str(rpn), "--world", str(ranks),
            "--", sys.executable, "-m", "xl.launcher.entry", str(NODE0), *rank_cmd,
        ]
        handle = start_run(spec, Plan(argv=argv, env={}, nproc=rpn, cwd=str(ROOT)), env=env)
        run_dir = handle.run_dir
        result["run_id"] = handle.run_id
        sup = psutil.Process(handle.pid)
        _say(f"node 0's supervisor {handle.pid}, run dir {run_dir}")
        deadline = time.monotonic() + 60
        while not (run_dir / "collector.json").exists():
            if time.monotonic() > deadline or not sup.is_running():
                raise RuntimeError(
                    "node 0's collector did not start: "
                    f"{(run_dir / 'supervisor.log').read_text()[-2000:]}"
                )
            time.sleep(0.1)

        procs = ns.sim_procs or max(1, math.ceil(ranks / 2048))
        others = list(range(1, nodes))
        for i in range(procs):
            mine = others[i::procs]
            if not mine:
                continue
            cfg = {
                "host": "127.0.0.1",
                "port": port + 1,
                "token": token,
                "ranks_per_node": rpn,
                "world": ranks,
                "steps_per_s": ns.steps_per_s,
                "log_every": ns.log_every,
                "culprit": culprit,
                "nodes": mine,
                "seed": i,
            }
            workers.append(Worker(cfg, env, tmp / f"sim-{i}.log"))
        t_ready = time.monotonic()
        for w in workers:
            msg = w.wait_for("ready", 120 + ranks / 20)
            if msg is None:
                raise RuntimeError(
                    "a simulator did not connect its ranks: "
                    f"{(tmp / 'sim-0.log').read_text()[-2000:]}"
                )
            if msg.get("refused"):
                raise RuntimeError(f"{msg['refused']} simulated ranks could not connect")
        result["connect_s"] = round(time.monotonic() - t_ready, 2)
        result["sim_procs"] = len(workers)
        _say(
            f"{ranks - rpn} simulated ranks on {nodes - 1} nodes started in "
            f"{result['connect_s']} s"
        )

        mon_out = tmp / "monitor.json"
        monitor = subprocess.Popen(
            [sys.executable, str(MONITOR), str(run_dir), str(mon_out)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "monitor.log", "ab"),  # noqa: SIM115 - the child holds it
        )
        mon = psutil.Process(monitor.pid)
        deadline = time.monotonic() + 300
        # its start (Textual's imports, the first read) is not the window's
        while not mon_out.with_suffix(".shown").exists():
            if time.monotonic() > deadline or monitor.poll() is not None:
                raise RuntimeError(
                    f"the Monitor did not show the run: {(tmp / 'monitor.log').read_text()[-2000:]}"
                )
            time.sleep(0.2)
        time.sleep(ns.warmup)

        registry = exporter(home / "runs")
        counted0 = collector_count(run_dir)
        result["scrape_first_s"] = round(timed_scrape(registry)[0], 4)  # reads the run's history
        sims = [psutil.Process(w.proc.pid) for w in workers]
        scpu0 = sum(cpu_s(p) for p in sims)
        spies = profile(
            ns.profile,
            {
                "node0": sup.pid,
                "monitor": mon.pid,
                **{f"sim{i}": p.pid for i, p in enumerate(sims)},
            },
            ns.seconds,
        )
        wall0, cpu0, mcpu0, wire0 = time.monotonic(), cpu_s(sup), cpu_s(mon), wire_bytes(port + 1)
        t_open = time.time()
        rss = 0.0
        scrapes: list[float] = []
        body = 0
        next_scrape = wall0 + SCRAPE_EVERY_S
        while time.monotonic() - wall0 < ns.seconds:
            rss = max(rss, sup.memory_info().rss / 2**20)
            if time.monotonic() >= next_scrape:  # as Prometheus scrapes, every 15 s by default
                next_scrape += SCRAPE_EVERY_S
                took, body = timed_scrape(registry)
                scrapes.append(took)
            time.sleep(min(1.0, max(0.0, ns.seconds - (time.monotonic() - wall0))))
        wall = time.monotonic() - wall0
        t_close = time.time()
        cpu1, mcpu1, wire1 = cpu_s(sup), cpu_s(mon), wire_bytes(port + 1)
        scpu1 = sum(cpu_s(p) for p in sims)
        rss = max(rss, sup.memory_info().rss / 2**20)
        for spy in spies:
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(timeout=30)
        newest = newest_train(run_dir / "metrics.jsonl")
        result["ranks_logging"] = ranks_logging(run_dir / "metrics.jsonl")  # before any rank stops
        lag = time.time() - newest if newest is not None else None
        counted1 = collector_count(run_dir)
        if not scrapes:  # a window shorter than the scrape interval: one scrape at its end
            took, body = timed_scrape(registry)
            scrapes.append(took)
        result.update(
            {
                "window_s": round(wall, 2),
                "node0_cpu_cores": round((cpu1 - cpu0) / wall, 3),
                "node0_rss_mib": round(rss, 1),
                "wire_bytes_per_rank_s": round((wire1 - wire0) / ranks / wall, 1),
                "monitor_cpu_cores": round((mcpu1 - mcpu0) / wall, 3),
                # the simulator's own load, for context
                "sim_cpu_cores": round((scpu1 - scpu0) / wall, 3),
                # Whether node 0 kept up: what its collector stored against what was offered (its
                # own ranks' train records; a summary row and a sys line a second of every other
                # node's rank), and how old the newest train record in metrics.jsonl was at the
                # window's end.
                "stored_records_per_s": round(
                    (counted1[1] - counted0[1]) / (counted1[0] - counted0[0]), 1
                )
                if counted1[0] > counted0[0]
                else None,
                "offered_records_per_s": round(rpn * ns.steps_per_s + 2 * (ranks - rpn), 1),
                "metrics_lag_s": round(lag, 2) if lag is not None else None,
                "scrape_s": round(max(scrapes), 4),  # the slowest of the window's
                "scrapes": len(scrapes),
                "scrape_kib": round(body / 1024, 1),
            }
        )
        monitor.send_signal(signal.SIGTERM)
        monitor.wait(timeout=60)
        shown = json.loads(mon_out.read_text()) if mon_out.exists() else {}
        # The refreshes that ended in the window (the first, which read the whole history, came
        # before it).
        refresh = [
            r
            for r, at in zip(
                shown.get("refresh_s") or [], shown.get("refresh_at") or [], strict=False
            )
            if t_open <= at <= t_close
        ]
        result.update(
            {
                "monitor_refresh_s": _median(refresh),
                "monitor_refresh_p95_s": _p95(refresh),
                "monitor_refresh_max_s": round(max(refresh), 4) if refresh else None,
                "monitor_refreshes": len(refresh),
                "monitor_rows": shown.get("rows"),
                "monitor_first_view_s": round(shown["first_shown"] - shown["started"], 2)
                if shown.get("first_shown")
                else None,
            }
        )
        _say(
            f"window of {wall:.0f} s: node 0 {result['node0_cpu_cores']} cores, "
            f"{result['node0_rss_mib']} MiB; "
            f"wire {result['wire_bytes_per_rank_s']} B/s a rank; Monitor "
            f"{result['monitor_refresh_s']} s a refresh, "
            f"{result['monitor_cpu_cores']} cores; scrape {result['scrape_s']} s"
        )

        events = run_dir / "events.jsonl"
        offset = events.stat().st_size if events.exists() else 0
        owner = next(w for w in workers if culprit // rpn in w.cfg["nodes"])
        owner.send("stall")
        stalled = owner.wait_for("stalled", 30) or {}
        last_t = stalled.get("last_step_t")
        if ns.hang == "all" and stalled.get("last_step") is not None:
            # A synchronous job: the others reach the next all-reduce and wait there for it.
            flag.touch()
            for w in workers:
                w.send(f"block {int(stalled['last_step']) + 1}")
        seen = watch_events(
            events, offset, culprit, "hang" if ns.hang == "all" else "stalled",
            stall_threshold + 120,
        )
        for kind, at in seen.items():
            result[f"{kind}_after_s"] = round(at - last_t, 2) if last_t else None
        named = seen.get("hang") if ns.hang == "all" else min(seen.values(), default=None)
        result["hang_named_after_s"] = (
            round(named - last_t, 2) if named is not None and last_t else None
        )
        result["hang_named_by"] = (
            "hang"
            if ns.hang == "all" and "hang" in seen
            else min(seen, key=seen.__getitem__, default=None)
        )
        _say(
            f"rank {culprit} stopped stepping ({ns.hang}): named by a {result['hang_named_by']} "
            "event "
            f"{result['hang_named_after_s']} s after its last step"
        )

        if ns.hang == "all" and "hang" in seen:
            # The ranks that stepped last (node 0's: they see the flag at their next step) reach
            # the threshold a step or two after the hang is named: give their stalls time.
            settle = time.monotonic() + 15
            while (
                time.monotonic() < settle and judged(events, culprit, True, offset)[1] < ranks - 1
            ):
                time.sleep(1.0)

        stats = []
        for w in workers:
            w.send("stats")
        for w in workers:
            stats.append((w.wait_for("stats", 30) or {}).get("stats") or {})
        result["sim_frames"] = sum(int(s.get("frames", 0)) for s in stats)
        result["stacks_answers"] = sum(int(s.get("stacks_answered", 0)) for s in stats)

        # a run that ended by itself (a node lost) needs no stop
        with contextlib.suppress(ProcessLookupError):
            # as `xl stop` does: node 0 stops its ranks and tells every node
            os.kill(sup.pid, signal.SIGTERM)
        try:
            sup.wait(timeout=120)
        except psutil.TimeoutExpired:
            _say("node 0's supervisor did not end within 120 s of the stop")
        rec = json.loads((run_dir / "run.json").read_text())
        result["run_status"] = rec.get("status")
        result["run_json_ranks"] = len(rec.get("ranks") or [])
        collector = json.loads((run_dir / "collector.json").read_text())
        result["collector_rejects"] = collector.get("rejects") or {}
        alarms, told = judged(events, culprit, ns.hang == "all", offset)
        result["false_alarms"] = alarms[:20]  # the first of each kind, then a count
        result["false_alarm_count"] = len(alarms)
        if ns.hang == "all":
            result["victims_told"] = told  # of ranks - 1 that waited for the culprit
    finally:
        for w in workers:
            w.send("stop")
        for w in workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=30)
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait(timeout=10)
        if monitor is not None and monitor.poll() is None:
            monitor.kill()
            monitor.wait(timeout=10)
        if sup is not None and sup.is_running():
            with contextlib.suppress(psutil.Error):
                sup.kill()
                sup.wait(timeout=10)
        for proc in leftovers(tag):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if ns.keep:
            _say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--ranks", type=int, required=True, help="ranks in all (node 0's included)")
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument(
        "--json", action="store_true", help="print the figures as one JSON object (the last line)"
    )
    ap.add_argument("--seconds", type=float, default=30.0, help="the measured window")
    ap.add_argument(
        "--warmup",
        type=float,
        default=10.0,
        help="seconds after every rank connected and the Monitor showed the run, before the window",
    )
    ap.add_argument(
        "--steps-per-s", type=float, default=2.0, help="train records a rank sends a second"
    )
    ap.add_argument(
        "--log-every", type=int, default=10, help="a rank prints a line every this many steps"
    )
    ap.add_argument(
        "--stall-s", type=float, default=30.0, help="XL_STALL_MIN_S for node 0 (30: xl's default)"
    )
    ap.add_argument(
        "--hang",
        choices=("all", "one"),
        default="all",
        help="all: the others then wait in the all-reduce for the stopped rank (a synchronous "
        "job); one: they go on",
    )
    ap.add_argument(
        "--sim-procs", type=int, default=0, help="simulator processes (0: one per 2,048 ranks)"
    )
    ap.add_argument(
        "--keep", action="store_true", help="keep the run dir and logs (their folder is printed)"
    )
    ap.add_argument(
        "--profile",
        type=Path,
        help="py-spy node 0 and the Monitor over the window into this folder (py-spy must be "
        "installed)",
    )
    ns = ap.parse_args(argv)
    rpn = ns.ranks_per_node
    problems = []
    if rpn < 1 or ns.ranks < 2 * max(rpn, 1) or ns.ranks % max(rpn, 1):
        problems.append(
            f"--ranks {ns.ranks} must be a multiple of --ranks-per-node {rpn}, for 2 nodes or more"
        )
    if (
        not 0 < ns.steps_per_s <= 100
        or ns.seconds <= 0
        or ns.warmup < 0
        or ns.stall_s <= 0
        or ns.sim_procs < 0
    ):
        problems.append(
            "--steps-per-s must be in (0, 100], --seconds and --stall-s above 0, --warmup and "
            "--sim-procs not below 0"
        )
    if shutil.which("ss") is None:
        problems.append("`ss` (iproute2) is needed to count the wire's bytes")
    if ns.profile is not None and not (
        shutil.which("py-spy") or Path(sys.executable).with_name("py-spy").exists()
    ):
        problems.append("--profile needs py-spy: pip install py-spy")
    if problems:
        print(f"bench_scale: {problems[0]}", file=sys.stderr)
        return 2
    try:
        result = bench(ns)
    except (RuntimeError, OSError, subprocess.SubprocessError, psutil.Error) as exc:
        print(f"bench_scale: it did not run: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench_scale: interrupted; what it started is gone", file=sys.stderr)
        return 130
    result["machine"] = {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2)}
    if ns.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
