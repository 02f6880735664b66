"""`xl exporter`: every live run's ranks on /metrics, scraped by a real Prometheus
(docs/exporter.md).

The exposition is read with prometheus-client's own parser and checked with `promtool check
metrics`; a real Prometheus scrapes the exporter every second with the bearer token from the
file a person would point it at, and every query of examples/grafana-dashboard.json must return
data from it, first from recorded runs, then from a real run on simulated GPUs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from procs import kill_run, only_run, wait_no_processes, xl, xl_env
from prometheus_client.parser import text_string_to_metric_families
from promserver import prometheus
from runfixtures import TWONODE_HOSTS, make_run
from servers import served
from where import REPO

from xl.launcher.exporter.metrics import STATES, RunsCollector

ROOT = REPO
DASHBOARD = ROOT / "examples" / "grafana-dashboard.json"
R = {"run_id", "rank", "local_rank", "Hostname"}
GPU = {"gpu", "UUID", "pci_bus_id", "device", "modelName"}  # as dcgm-exporter's releases spell them
G = R | GPU
STRAGGLER = {"phase", "gpu", "gpu_reason", "gpu_detail", "lasting"}
TABLE = {  # the contract: name -> (type as parsed from the text format, label names)
    "xl_train_step": ("gauge", R),
    "xl_train_loss": ("gauge", R),
    "xl_train_samples": ("counter", R),
    "xl_train_samples_per_second": ("gauge", R),
    "xl_train_last_step_timestamp_seconds": ("gauge", R),
    "xl_rank_state": ("gauge", R | {"xl_rank_state"}),
    "xl_gpu_utilization_ratio": ("gauge", G),
    "xl_gpu_memory_used_bytes": ("gauge", G),
    "xl_rank_memory_bytes": ("gauge", R),
    "xl_gpu_clock_event_reasons": ("gauge", GPU | {"Hostname"}),
    "xl_gpu_clock_event_active": ("gauge", GPU | {"Hostname", "clock_event"}),
    "xl_rank_straggler_info": ("gauge", R | STRAGGLER),
    "xl_rank_info": ("gauge", R | GPU | {"pid"}),
    "xl_run_info": ("gauge", {"run_id", "name", "world_size", "nnodes", "user", "slurm_job_id"}),
    "xl_ranks_reporting": ("gauge", {"run_id"}),
    # A failed run's root cause (the fixtures' failed run ended moments ago: it is kept 15 min).
    "xl_run_failure_info": (
        "gauge",
        {"run_id", "rank", "Hostname", "exit_code", "kind", "summary", "fix"},
    ),
}
FORBIDDEN = {"job", "instance", "pod", "namespace", "container"}
# dcgm-exporter's spellings `modelName` and `Hostname` are the contract's, and promtool's linter
# asks for snake_case label names: that finding, on the metrics with those labels, is the only one
# allowed.
CAMEL = "label names should be written in 'snake_case' not 'camelCase'"
# The twonode fixture's GPUs as the sampler reads them: rank 5's GPU held down by a thermal
# slowdown (it is the run's straggler), every other one idle-clocked or free.
HOT_RANK = 5


def gpu_lines(run_dir: Path) -> None:
    """Each rank's sys line with its own GPU memory, its host memory and its GPU's clock-event
    reasons, and rank 5's straggler event with its GPU's reason, as a live run writes them."""
    run = json.loads((run_dir / "run.json").read_text())
    now = time.time()
    lines = [
        {
            "t": now, "rank": r["rank"], "kind": "sys", "gpu": r["gpu"],
            "gpu_proc_mem_mib": 20_000.0 + 10 * r["rank"], "mem_mib": 3_000.0 + r["rank"],
            "clock_event_reasons": 0x40 if r["rank"] == HOT_RANK else 0x1,
        }
        for r in run["ranks"]
    ]  # fmt: skip
    with (run_dir / "metrics.jsonl").open("a") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in lines)
    event = {
        "t": now, "kind": "straggler", "rank": HOT_RANK, "phase": "compute",
        "message": "rank 5 is the straggler: 300 ms of its 310 ms step computing",
        "gpu": 1, "gpu_reason": "hw_thermal_slowdown",
        "gpu_detail": "GPU 1: thermal slowdown at 87 °C, SM 1,290 of 1,410 MHz",
        "lasting": "transient", "since_s": 5.0, "spells": 1, "spells_since_s": 5.0,
    }  # fmt: skip
    with (run_dir / "events.jsonl").open("a") as fh:
        fh.write(json.dumps(event) + "\n")


def fetch(url: str, token: str | None, accept: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    if accept:
        req.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def families(text: str) -> dict[str, list]:
    return {f.name: f for f in text_string_to_metric_families(text)}  # type: ignore[misc]


def series(text: str, name: str, **labels: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def fixtures(home: Path) -> dict[str, Path]:
    """A live 8-rank two-node run, a live straggler run, and two that ended."""
    runs = home / "runs"
    runs.mkdir(parents=True)
    now = time.time()
    twonode = make_run(runs, "twonode", t0=now - 52)  # its last lines: ~2 s old
    gpu_lines(twonode)
    return {
        "twonode": twonode,
        "straggler": make_run(runs, "straggler", t0=now - 300),  # live, but nothing new for minutes
        "healthy": make_run(runs, "healthy", t0=now - 500),
        "failed": make_run(runs, "failed", t0=now - 400),
    }


def promtool_findings(text: str) -> list[str]:
    promtool = shutil.which("promtool")
    assert promtool, "Debian's `prometheus` package (promtool) is not installed"
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert done.returncode in (0, 3), done.stdout + done.stderr  # 3: lint findings only, it parsed
    return [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]


def test_no_token_no_metrics_and_the_token_file_is_private_and_kept(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fixtures(home)
    env = xl_env(home)
    env.pop("XL_EXPORTER_TOKEN", None)
    with served(["exporter", "--port", "0"], env) as ex:
        assert ex.line.startswith("xl: exporting metrics at http://127.0.0.1:") and ex.url.endswith(
            "/metrics"
        ), ex.line
        token_file = home / "exporter.token"
        assert str(token_file) in ex.line
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32
        assert fetch(ex.url, None)[0] == 403
        assert fetch(ex.url, token + "x")[0] == 403
        code, body = fetch(ex.url, token)
        assert code == 200 and "xl_train_step" in body
    # Restarted: the same token, so Prometheus's credentials_file stays right.
    with served(["exporter", "--port", "0"], env) as ex:
        assert fetch(ex.url, token)[0] == 200
    # $XL_EXPORTER_TOKEN wins over the file, and the line says where the token comes from.
    with served(["exporter", "--port", "0"], {**env, "XL_EXPORTER_TOKEN": "from-the-env"}) as ex:
        assert "$XL_EXPORTER_TOKEN" in ex.line
        assert fetch(ex.url, "from-the-env")[0] == 200
        assert fetch(ex.url, token)[0] == 403


def test_exposition_is_the_metric_table_of_live_runs_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    dirs = fixtures(home)
    with served(["exporter", "--port", "0"], xl_env(home, XL_EXPORTER_TOKEN="t0k")) as ex:
        code, text = fetch(ex.url, "t0k")
        assert code == 200
        found = families(text)
        assert {
            name: (f.type, set().union(*(s.labels for s in f.samples)))
            for name, f in found.items()
            if f.samples
        } == {
            # the fixtures log no samples=
            name: spec
            for name, spec in TABLE.items()
            if name != "xl_train_samples"
        }
        assert not any(FORBIDDEN & set(s.labels) for f in found.values() for s in f.samples)
        # Only the live runs, every rank of each.
        assert {s.labels["run_id"] for s in series(text, "xl_run_info")} == {
            "20260530-twonode",
            "20260530-straggler",
        }
        assert len(series(text, "xl_train_step", run_id="20260530-twonode")) == 8
        run = json.loads((dirs["twonode"] / "run.json").read_text())
        info = {
            s.labels["rank"]: s.labels
            for s in series(text, "xl_rank_info", run_id="20260530-twonode")
        }
        assert info["5"] == {
            "run_id": "20260530-twonode",
            "rank": "5",
            "local_rank": "1",
            "Hostname": "trn-a07",
            "gpu": "1",
            "UUID": run["devices"][1]["uuid"],
            "pci_bus_id": "",  # no NVML on this machine to tell it
            "device": "nvidia1",
            "modelName": "NVIDIA A100-SXM4-80GB",
            "pid": "40005",
        }
        (util,) = series(text, "xl_gpu_utilization_ratio", run_id="20260530-twonode", rank="0")
        assert 0 < util.value <= 1 and util.labels["UUID"] == run["devices"][0]["uuid"]
        # Each rank's own memory on its GPU (the sampler's gpu_proc_mem_mib), not the GPU's total
        # (40,000 MiB and more in the fixture's sys lines), and its host memory.
        for rank in range(8):
            at = {"run_id": "20260530-twonode", "rank": str(rank)}
            (mem,) = series(text, "xl_gpu_memory_used_bytes", **at)
            assert mem.value == (20_000 + 10 * rank) * (1 << 20)
            (host,) = series(text, "xl_rank_memory_bytes", **at)
            assert host.value == (3_000 + rank) * (1 << 20)
        # One bitmask a GPU, on each node, whichever ranks share it; rank 5's GPU 1 on trn-a07.
        masks = {
            (s.labels["Hostname"], s.labels["gpu"]): s.value
            for s in series(text, "xl_gpu_clock_event_reasons")
        }
        assert masks == {
            (host, str(gpu)): (0x40 if (host, gpu) == ("trn-a07", 1) else 0x1)
            for host in TWONODE_HOSTS
            for gpu in range(4)
        }, masks
        active = {
            s.labels["clock_event"]
            for s in series(text, "xl_gpu_clock_event_active", Hostname="trn-a07", gpu="1")
            if s.value == 1
        }
        assert active == {"hw_thermal"}
        (said,) = series(text, "xl_rank_straggler_info", run_id="20260530-twonode")
        assert {k: said.labels[k] for k in ("rank", "phase", "gpu", "gpu_reason", "lasting")} == {
            "rank": "5", "phase": "compute", "gpu": "1", "gpu_reason": "hw_thermal_slowdown",
            "lasting": "transient",
        }  # fmt: skip
        (runinfo,) = series(text, "xl_run_info", run_id="20260530-twonode")
        assert {k: runinfo.labels[k] for k in ("name", "world_size", "nnodes")} == {
            "name": "gpt2-2node",
            "world_size": "8",
            "nnodes": "2",
        }
        assert series(text, "xl_ranks_reporting", run_id="20260530-twonode")[0].value == 8
        assert series(text, "xl_ranks_reporting", run_id="20260530-straggler")[0].value == 0
        states = {
            s.labels["rank"]: s.labels["xl_rank_state"]
            for s in series(text, "xl_rank_state", run_id="20260530-twonode")
            if s.value == 1
        }
        assert states == {str(r): "running" for r in range(8) if r != 5} | {"5": "straggler"}
        assert all(
            len([s for s in series(text, "xl_rank_state", run_id="20260530-twonode", rank=str(r))])
            == len(STATES)
            for r in range(8)
        )
        assert {ln.split(" ", 1)[1] for ln in promtool_findings(text)} <= {CAMEL}

        # The run ends: its series are gone from the very next scrape; the other stays.
        record = json.loads((dirs["twonode"] / "run.json").read_text())
        record.update(status="succeeded", ended_at=time.time())
        tmp = dirs["twonode"] / ".run.json.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, dirs["twonode"] / "run.json")
        text = fetch(ex.url, "t0k")[1]
        assert not [
            s
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.labels.get("run_id") == "20260530-twonode"
        ]
        assert series(text, "xl_run_info", run_id="20260530-straggler")


def test_rank_states_hung_waiting_exited_and_a_cpu_run(tmp_path: Path) -> None:
    """The stateset names the hang's culprit `hung` and its victims `waiting`; a rank that exited
    is `exited` while the run goes on; a CPU run (no GPU) has no GPU series and is not an error."""
    runs = tmp_path / "runs"
    runs.mkdir()
    now = time.time()
    run_dir = make_run(runs, "twonode", t0=now - 52)
    events = [
        {"t": now - 5, "kind": "stalled", "rank": 3, "message": "rank 3 made no progress"},
        {"t": now - 5, "kind": "stalled", "rank": 2, "message": "rank 2 waits", "waiting_on": [3]},
        {
            "t": now - 4,
            "kind": "hang",
            "rank": 3,
            "ranks": [3],
            "message": "rank 1 ...",
            "stacks": "stacks/1.json",
        },
    ]
    with (run_dir / "events.jsonl").open("a") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in events)
    rec = json.loads((run_dir / "run.json").read_text())
    rec["ranks"][7]["exit_code"] = 0
    cpu = make_run(runs, "straggler", t0=now - 62, run_id="cpu-run")
    cpu_rec = json.loads((cpu / "run.json").read_text())
    cpu_rec["devices"] = []
    for r in cpu_rec["ranks"]:
        r["gpu"] = None
    (cpu / "run.json").write_text(json.dumps(cpu_rec))
    (cpu / "metrics.jsonl").write_text(
        "".join(
            json.dumps(m) + "\n"
            for m in map(json.loads, (cpu / "metrics.jsonl").read_text().splitlines())
            if m["kind"] == "train"
        )
    )
    (run_dir / "run.json").write_text(json.dumps(rec))

    collector = RunsCollector(runs)
    got = {f.name: f for f in collector.collect()}
    state = {
        (s.labels["run_id"], s.labels["rank"]): s.labels["xl_rank_state"]
        for s in got["xl_rank_state"].samples
        if s.value == 1
    }
    assert state[(rec["run_id"], "3")] == "hung"
    assert state[(rec["run_id"], "2")] == "waiting"
    assert state[(rec["run_id"], "7")] == "exited"
    assert state[(rec["run_id"], "0")] == "running"
    assert not [
        s for s in got["xl_gpu_utilization_ratio"].samples if s.labels["run_id"] == "cpu-run"
    ]
    assert {s.labels["gpu"] for s in got["xl_rank"].samples if s.labels["run_id"] == "cpu-run"} == {
        ""
    }
    assert len([s for s in got["xl_train_step"].samples if s.labels["run_id"] == "cpu-run"]) == 2
    # --no-gpus: no GPU family at all (dcgm-exporter already has them).
    assert not {"xl_gpu_utilization_ratio", "xl_gpu_memory_used_bytes"} & {
        f.name for f in RunsCollector(runs, gpus=False).collect()
    }
    # The same hang with its culprit working on the CPU (a long evaluation, or an endless loop):
    # `stalled`, as the app shows it; its victim still `waiting`.
    with (run_dir / "events.jsonl").open("a") as fh:
        fh.write(json.dumps({**events[2], "t": now - 3, "busy": [3]}) + "\n")
    got = {f.name: f for f in RunsCollector(runs).collect()}
    state = {
        (s.labels["run_id"], s.labels["rank"]): s.labels["xl_rank_state"]
        for s in got["xl_rank_state"].samples
        if s.value == 1
    }
    assert state[(rec["run_id"], "3")] == "stalled" and state[(rec["run_id"], "2")] == "waiting"


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    return [e.replace("$run", ".+").replace("$__rate_interval", "30s") for e in exprs]


def test_prometheus_scrapes_recorded_runs_and_every_dashboard_query_has_data(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    fixtures(home)
    # The twonode run keeps logging (each rank samples= too), as a live run does.
    run_dir = home / "runs" / "20260530-twonode"
    env = xl_env(home)
    env.pop("XL_EXPORTER_TOKEN", None)
    with (
        served(["exporter", "--port", "0"], env) as ex,
        prometheus(tmp_path / "prom", ex.url.split("/")[2], home / "exporter.token") as prom,
    ):
        got = prom.wait('xl_train_step{run_id="20260530-twonode"}', check=lambda r: len(r) == 8)
        assert {r["metric"]["job"] for r in got} == {"xl"}  # Prometheus's own labels, set by it
        for step in range(51, 60):
            with (run_dir / "metrics.jsonl").open("a") as fh:
                fh.writelines(
                    json.dumps(
                        {
                            "t": time.time(),
                            "rank": r,
                            "kind": "train",
                            "step": step,
                            "loss": 1.0,
                            "samples": 32,
                        }
                    )
                    + "\n"
                    for r in range(8)
                )
            time.sleep(0.4)
        prom.wait(
            'xl_train_step{run_id="20260530-twonode",rank="5"}',
            check=lambda r: r and float(r[0]["value"][1]) == 59,
        )
        prom.wait(
            'xl_train_samples_total{run_id="20260530-twonode",rank="0"}',
            check=lambda r: r and float(r[0]["value"][1]) == 9 * 32,
        )
        assert prom.label_values("run_id", "xl_run_info") == [
            "20260530-straggler",
            "20260530-twonode",
        ]
        for expr in dashboard_queries():
            prom.wait(expr, timeout=30)


@pytest.mark.e2e
def test_a_real_run_on_simulated_gpus_reaches_prometheus_and_leaves_it(
    tmp_path: Path, simnvml, simnvml_gpu
) -> None:
    # GPU 1 held down by a thermal slowdown, GPU 0 idle-clocked: each GPU's bitmask as NVML says.
    sim = simnvml(
        gpus=[
            simnvml_gpu(util_gpu=90, clock_event_reasons=0x1, memory_used_mib=50_000),
            simnvml_gpu(util_gpu=40, clock_event_reasons=0x40, memory_used_mib=50_000),
        ]
    )
    home = tmp_path / "home"
    env = xl_env(home, **sim.env)
    env.pop("XL_EXPORTER_TOKEN", None)
    # Until `xl stop` below: with --seconds the example sizes its run from 5 warm-up steps, and
    # on a loaded machine those are slow enough that a "120 s" run ended after 10 s, mid-test.
    started = xl(
        [
            "launch", "--detach", "--gpus", "0,1", "--name", "prom",
            str(ROOT / "examples" / "train.py"), "--steps", "100000000", "--width", "64",
        ],
        env,
        cwd=tmp_path,
        timeout=90,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    run_dir = only_run(home)
    try:
        with (
            served(["exporter", "--port", "0"], env) as ex,
            prometheus(tmp_path / "prom", ex.url.split("/")[2], home / "exporter.token") as prom,
        ):
            run_id = run_dir.name
            prom.wait(
                f'xl_train_step{{run_id="{run_id}"}} > 0', timeout=90, check=lambda r: len(r) == 2
            )
            # NVML lists each rank's process on its GPU with what it holds, as a real driver
            # does: the rank's series is that, not the GPU's 50,000 MiB.
            ranks = json.loads((run_dir / "run.json").read_text())["ranks"]
            for r in ranks:
                sim.add_process(r["gpu"], r["pid"], 1000 + 100 * r["rank"])
            own = prom.wait(
                f'xl_gpu_memory_used_bytes{{run_id="{run_id}"}}',
                timeout=60,
                check=lambda r: len(r) == 2 and all(float(x["value"][1]) < 5e9 for x in r),
            )
            assert {x["metric"]["rank"]: float(x["value"][1]) for x in own} == {
                str(r["rank"]): (1000 + 100 * r["rank"]) * (1 << 20) for r in ranks
            }
            masks = prom.wait("xl_gpu_clock_event_reasons", check=lambda r: len(r) == 2)
            assert {x["metric"]["gpu"]: float(x["value"][1]) for x in masks} == {
                "0": 0x1,
                "1": 0x40,
            }
            # Labelled as dcgm-exporter labels the same GPU (its NVML PCI bus id, nvidiaN).
            assert {
                (x["metric"]["gpu"], x["metric"]["pci_bus_id"], x["metric"]["device"])
                for x in masks
            } == {(str(i), g.resolved(i).pci_bus_id, f"nvidia{i}") for i, g in enumerate(sim.gpus)}
            util = prom.wait(
                f'xl_gpu_utilization_ratio{{run_id="{run_id}"}}', check=lambda r: len(r) == 2
            )
            assert {r["metric"]["gpu"]: float(r["value"][1]) for r in util} == {"0": 0.9, "1": 0.4}
            prom.wait(
                f'rate(xl_train_samples_total{{run_id="{run_id}"}}[30s]) > 0',
                timeout=60,
                check=lambda r: len(r) == 2,
            )
            prom.wait(
                f'xl_rank_state{{run_id="{run_id}",xl_rank_state="running"}} == 1',
                check=lambda r: len(r) == 2,
            )
            prom.wait(f'xl_ranks_reporting{{run_id="{run_id}"}} == 2')
            for expr in dashboard_queries():
                prom.wait(expr, timeout=30)
            stopped = xl(["stop", run_id], env, timeout=60)
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
            # Its end is in run.json: Prometheus's next scrape has none of its series.
            prom.wait(f'{{__name__=~"xl_.+",run_id="{run_id}"}}', check=lambda r: r == [])
        wait_no_processes(run_dir, timeout=10)
    finally:
        kill_run(run_dir)


def test_bad_ports_are_one_line(tmp_path: Path) -> None:
    env = xl_env(tmp_path / "home", XL_EXPORTER_TOKEN="t")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = xl(["exporter", "--port", str(port)], env)
    assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in done.stderr
    done = xl(["exporter", "--port", "70000"], env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a port" in done.stderr


def test_the_default_port_is_none_a_common_exporter_uses(tmp_path: Path) -> None:
    """Beside dcgm-exporter (9400) and node_exporter (9100) on a GPU node: with both their ports
    held, the exporter starts on its default, 19400, a port outside Prometheus's default port
    allocations (docs/exporter.md)."""
    env = xl_env(tmp_path / "home", XL_EXPORTER_TOKEN="t")
    helped = xl(["exporter", "--help"], env)
    assert "default 19400" in helped.stdout, helped.stdout
    with contextlib.ExitStack() as held:
        for theirs in (9400, 9100):  # dcgm-exporter's and node_exporter's, when free here
            with contextlib.suppress(OSError):
                held.enter_context(socket.create_server(("127.0.0.1", theirs)))
        with served(["exporter"], env) as ex:
            assert ex.url == "http://127.0.0.1:19400/metrics", ex.line
            assert fetch(ex.url, "t")[0] == 200


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (a read finds its end, or a reset)."""
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_idle_slow_and_resetting_clients_cost_no_thread_and_no_traceback(tmp_path: Path) -> None:
    from xl.launcher.exporter.server import HEAD_S, MAX_CONNECTIONS, WORKERS  # noqa: PLC0415 - the figures under test

    home = tmp_path / "home"
    fixtures(home)
    with served(["exporter", "--port", "0"], xl_env(home, XL_EXPORTER_TOKEN="t0k")) as ex:
        host, port = ex.url.split("/")[2].split(":")
        proc = psutil.Process(ex.proc.pid)
        address = (host, int(port))
        # 400 idle connections (more than the cap): a scrape still gets its metrics, and the
        # server holds no thread per connection.
        idle = [socket.create_connection(address, timeout=30) for _ in range(400)]
        code, body = fetch(ex.url, "t0k")
        assert code == 200 and "xl_train_step" in body
        assert proc.num_threads() <= WORKERS + 2, proc.num_threads()
        assert proc.num_fds() <= MAX_CONNECTIONS + 32, proc.num_fds()
        for sock in idle:
            sock.close()
        # Clients that reset their connection: before sending, after the request, mid-reply.
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0k\r\n\r\n"
        for when in ("before", "after", "reply") * 30:
            sock = socket.create_connection(address, timeout=30)
            if when != "before":
                sock.sendall(request)
            if when == "reply":
                sock.recv(10)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        # Slow clients (a byte a second, never a whole head): closed by the server once their
        # time is up; scrapes are answered meanwhile.
        slow = [socket.create_connection(address, timeout=30) for _ in range(20)]
        started = time.monotonic()
        sent = 0
        while not all(_closed_by_peer(s) for s in slow):
            assert time.monotonic() - started < HEAD_S + 60, "slow clients were never closed"
            for s in slow:
                try:
                    s.send(request[sent % 20 : sent % 20 + 1])
                except OSError:
                    pass
            sent += 1
            if sent % 3 == 0:
                assert fetch(ex.url, "t0k")[0] == 200
            time.sleep(1.0)
        for s in slow:
            s.close()
        assert proc.num_threads() <= WORKERS + 2, proc.num_threads()
        assert fetch(ex.url, "t0k")[0] == 200
    said = ex.proc.stderr.read() if ex.proc.stderr else ""
    assert "Traceback" not in said and len(said.splitlines()) <= 1, said
