"""`xl exporter` with a run past 256 ranks (docs/exporter.md, "Big runs"): a real Prometheus
scrapes per-node series of the big run and per-rank series of the small one beside it, from the
one exporter; `xl exporter --per-rank` gives the big run's every rank. The figures are the
lines' own (bigrun.step_time; rank 77 slow, rank 300 failed)."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from bigrun import make_big_run
from procs import xl, xl_env
from prometheus_client.parser import text_string_to_metric_families
from promserver import prometheus
from runfixtures import make_run
from servers import served

BIG = "20261128-big-1024"
SMALL = "20260530-twonode"
NODES = 128
# dcgm-exporter's `modelName` and `Hostname`: promtool's snake_case finding, the one allowed.
CAMEL = "label names should be written in 'snake_case' not 'camelCase'"


def fetch(url: str, token: str) -> str:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return str(resp.read().decode())


def run_samples(text: str, run_id: str) -> list:
    return [
        s
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.labels.get("run_id") == run_id
    ]


def promtool_findings(text: str) -> list[str]:
    promtool = shutil.which("promtool")
    assert promtool, "Debian's `prometheus` package (promtool) is not installed"
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert done.returncode in (0, 3), done.stdout + done.stderr  # 3: lint findings only
    return [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    runs = home / "runs"
    runs.mkdir(parents=True)
    now = time.time()
    make_big_run(runs, 1024, t0=now - 5, seconds=3, failed=[300], slow=[77])
    make_run(runs, "twonode", t0=now - 52)
    return home


@pytest.mark.e2e
def test_prometheus_gets_a_big_run_per_node_and_a_small_one_per_rank(tmp_path: Path) -> None:
    home = _home(tmp_path)
    env = xl_env(home)
    env.pop("XL_EXPORTER_TOKEN", None)
    with (
        served(["exporter", "--port", "0"], env) as ex,
        prometheus(tmp_path / "prom", ex.url.split("/")[2], home / "exporter.token") as prom,
    ):
        token = (home / "exporter.token").read_text().strip()
        text = fetch(ex.url, token)
        big = run_samples(text, BIG)
        assert big and not [s for s in big if "rank" in s.labels]
        assert len(run_samples(text, SMALL)) > 8 * 10  # the small run: per rank as ever
        assert {ln.split(" ", 1)[1] for ln in promtool_findings(text)} <= {CAMEL}
        got = prom.wait(
            f'xl_node_step_seconds{{run_id="{BIG}",stat="max"}}',
            check=lambda r: len(r) == NODES,
        )
        slowest = {r["metric"]["node"]: float(r["value"][1]) for r in got}
        assert slowest["9"] == 2.0  # rank 77's node
        assert {n for n, v in slowest.items() if v > 0.6} == {"9"}
        failed = prom.wait(f'xl_node_ranks{{run_id="{BIG}",state="failed"}} > 0')
        assert [(r["metric"]["node"], r["metric"]["Hostname"]) for r in failed] == [
            ("37", "node37")
        ]
        total = prom.wait(f'sum(xl_node_ranks{{run_id="{BIG}"}})')
        assert float(total[0]["value"][1]) == 1024
        samples = prom.wait(f'sum(xl_node_samples_total{{run_id="{BIG}"}})')
        assert float(samples[0]["value"][1]) == 1023 * 16 * 6 + 16 * 2
        assert prom.query(f'xl_train_step{{run_id="{BIG}"}}') == []
        assert len(prom.query(f'xl_train_step{{run_id="{SMALL}"}}')) == 8
        assert prom.label_values("run_id", "xl_run_info") == [SMALL, BIG]


@pytest.mark.e2e
def test_per_rank_exports_every_rank_of_a_big_run(tmp_path: Path) -> None:
    home = _home(tmp_path)
    env = xl_env(home, XL_EXPORTER_TOKEN="t0k")
    with served(["exporter", "--port", "0", "--per-rank"], env) as ex:
        text = fetch(ex.url, "t0k")
    big = run_samples(text, BIG)
    assert {s.labels["rank"] for s in big if s.name == "xl_train_step"} == {
        str(r) for r in range(1024)
    }
    assert not [s for s in big if s.name.startswith("xl_node_")]
    assert "--per-rank" in xl(["exporter", "--help"], env).stdout
