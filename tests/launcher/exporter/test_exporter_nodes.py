"""The exporter past 256 ranks (docs/exporter.md, "Big runs"): a series set per node by default,
bounded by the nodes, not the ranks; every rank's series with ``per_rank``; runs of up to 256
ranks exactly as before. Figures are checked against the lines' own ground truth
(bigrun.step_time)."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import time
from collections import defaultdict
from pathlib import Path

import pytest
from bigrun import make_big_run, step_time
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from runfixtures import make_run

from xl.launcher.exporter import metrics as exporter
from xl.launcher.exporter.metrics import RunsCollector
from xl.launcher.exporter.nodes import PER_NODE_PAST

PER_RANK_FAMILIES = {
    "xl_train_step",
    "xl_train_loss",
    "xl_train_samples_total",
    "xl_rank_step_seconds",
    "xl_rank_state",
    "xl_rank_info",
}


def scrape(runs: Path, now: float, **kw: bool) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunsCollector(runs, gpus=False, clock=lambda: now, **kw))
    return generate_latest(registry).decode()


def samples_of(text: str, run_id: str) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("run_id") == run_id:
                out[s.name].append(s)
    return out


def test_a_4096_rank_run_is_exported_per_node_and_its_size_is_the_nodes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    t0 = time.time() - 100
    big = make_big_run(runs, 4096, t0=t0, seconds=3, failed=[1234], slow=[77])
    make_run(runs, "wide", t0=t0)  # 64 ranks, live: per rank as ever, beside the big one
    text = scrape(runs, now=t0 + 12)
    got = samples_of(text, big.name)
    # Nothing of the big run is per rank; the small run keeps every rank's series.
    assert not [s for ss in got.values() for s in ss if "rank" in s.labels]
    wide = samples_of(text, "20260530-wide")
    for name in PER_RANK_FAMILIES - {"xl_rank_step_seconds", "xl_train_samples_total"}:
        assert {s.labels["rank"] for s in wide[name]} == {str(r) for r in range(64)}, name
    # A series set per node: 512 nodes, each the same handful of series, 4,096 ranks or not.
    per_node = defaultdict(int)
    for ss in got.values():
        for s in ss:
            if "node" in s.labels:
                per_node[s.labels["node"]] += 1
    assert set(per_node) == {str(n) for n in range(512)}
    assert max(per_node.values()) <= 25
    big_lines = [ln for ln in text.splitlines() if f'run_id="{big.name}"' in ln]
    assert len(big_lines) <= 25 * 512 + 5
    assert len(text.encode()) < 2 * 1024 * 1024  # per rank it was ~9 MiB
    # The figures: each node's spread of its ranks' step times, as the lines said.
    step_s = {(s.labels["node"], s.labels["stat"]): s.value for s in got["xl_node_step_seconds"]}
    for node in (0, 9, 300):
        truth = [step_time(r, [77]) for r in range(node * 8, node * 8 + 8)]
        assert step_s[(str(node), "min")] == min(truth)
        assert step_s[(str(node), "median")] == statistics.median(truth)
        assert step_s[(str(node), "max")] == max(truth)
    assert step_s[("9", "max")] == 2.0  # rank 77, the slow one, shows on its node
    phase = {
        (s.labels["node"], s.labels["phase"], s.labels["stat"]): s.value
        for s in got["xl_node_step_phase_seconds"]
    }
    assert phase[("9", "compute", "max")] == 1.8 and phase[("9", "data", "median")] == 0.01
    # Who is not running: rank 1234 failed, on node 154; every other node has 8 ranks running.
    ranks = {(s.labels["node"], s.labels["state"]): s.value for s in got["xl_node_ranks"]}
    assert ranks[("154", "failed")] == 1 and ranks[("154", "running")] == 7
    assert sum(v for (n, st), v in ranks.items() if st == "failed") == 1
    assert all(ranks[(str(n), "running")] == 8 for n in range(512) if n != 154)
    # Samples summed per node: 16 a step, 2 steps a second for 3 s (the failed rank: 1 s).
    samples = {s.labels["node"]: s.value for s in got["xl_node_samples_total"]}
    assert samples["0"] == 8 * 16 * 6 and samples["154"] == 7 * 16 * 6 + 16 * 2
    rate = {s.labels["node"]: s.value for s in got["xl_node_samples_per_second"]}
    assert rate["0"] == sum(round(16 / step_time(r), 3) for r in range(8))
    steps = {(s.labels["node"], s.labels["stat"]): s.value for s in got["xl_node_train_step"]}
    assert steps[("154", "min")] == 2 and steps[("154", "max")] == 6
    oldest = {s.labels["node"]: s.value for s in got["xl_node_last_step_timestamp_seconds"]}
    assert oldest["154"] == round(t0 + 0.5, 3) and oldest["0"] == round(t0 + 2.5, 3)
    # The run itself is still one series each, as for any run.
    [info] = got["xl_run_info"]
    assert info.labels["world_size"] == "4096"
    [reporting] = got["xl_ranks_reporting"]
    assert reporting.value == 4095  # all but the failed rank, whose last line is 11.5 s old


def test_per_rank_gives_a_big_run_every_rank_s_series(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    t0 = time.time() - 100
    big = make_big_run(runs, 512, t0=t0, seconds=2)
    got = samples_of(scrape(runs, now=t0 + 5, per_rank=True), big.name)
    assert not [n for n in got if n.startswith("xl_node_")]
    for name in PER_RANK_FAMILIES:
        assert len({s.labels["rank"] for s in got[name]}) == 512, name


def test_the_size_where_series_turn_per_node(tmp_path: Path) -> None:
    """A run of PER_NODE_PAST ranks is per rank; one rank more is per node (its last node of
    one rank included)."""
    for ranks, per_node in ((PER_NODE_PAST, False), (PER_NODE_PAST + 1, True)):
        runs = tmp_path / str(ranks)
        runs.mkdir()
        t0 = time.time() - 100
        big = make_big_run(runs, ranks, t0=t0, seconds=1)
        got = samples_of(scrape(runs, now=t0 + 5), big.name)
        if per_node:
            assert "xl_train_step" not in got
            nodes = {
                s.labels["node"]: s.value
                for s in got["xl_node_ranks"]
                if s.labels["state"] == "running"
            }
            assert len(nodes) == 33 and nodes["32"] == 1
        else:
            assert len(got["xl_train_step"]) == ranks
            assert not [n for n in got if n.startswith("xl_node_")]


def test_a_stalled_rank_and_its_waiting_peers_are_counted_on_their_nodes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    t0 = time.time() - 200
    big = make_big_run(runs, 512, t0=t0, seconds=2)
    with (big / "events.jsonl").open("a", encoding="utf-8") as fh:
        for r in range(512):
            ev = {"t": t0 + 100, "kind": "stalled", "rank": r, "message": "m"}
            fh.write(json.dumps(ev if r == 300 else {**ev, "waiting_on": [300]}) + "\n")
    got = samples_of(scrape(runs, now=t0 + 101), big.name)
    counts = {(s.labels["node"], s.labels["state"]): s.value for s in got["xl_node_ranks"]}
    assert counts[("37", "stalled")] == 1 and counts[("37", "waiting")] == 7
    assert sum(v for (_, st), v in counts.items() if st == "stalled") == 1
    assert sum(v for (_, st), v in counts.items() if st == "waiting") == 511
    assert sum(v for (_, st), v in counts.items() if st == "running") == 0


def test_a_big_run_s_figures_are_those_of_reading_every_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past 256 ranks the exporter hands its reader only each rank's last line of each shape
    (exporter.latest_lines): every series, per rank and per node, is what reading every line
    gives, lines that carry rarer keys (a null loss, lr, memory) between them included."""
    t0 = time.time() - 100
    a = make_big_run(tmp_path / "a" / "runs", 300, t0=t0, seconds=3, slow=[7])
    b = shutil.copytree(a, tmp_path / "b" / "runs" / a.name)
    extra = []
    for r in range(300):
        extra += [
            {"t": t0 + 3.1, "rank": r, "kind": "train", "step": 7, "loss": 1.5, "lr": 0.01},
            {
                "t": t0 + 3.2,
                "rank": r,
                "kind": "train",
                "step": 8,
                "loss": None,
                "nonfinite": {"loss": "nan"},
                "samples": 4,
                "mem_peak_mib": 100.0 + r,
            },
            {"t": t0 + 3.3, "rank": r, "kind": "sys", "gpu_util": 10 + r % 50, "gpu": r % 8},
        ]
        if r % 3 == 0:  # some ranks' last line has no loss: an earlier one's stays
            extra.append({"t": t0 + 3.4, "rank": r, "kind": "train", "step": 9, "samples": 4})
    for run in (a, b):
        with (run / "metrics.jsonl").open("a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(e) + "\n" for e in extra)
    kept: list[int] = []
    latest = exporter.latest_lines
    monkeypatch.setattr(
        exporter, "latest_lines", lambda recs: kept.append(len(latest(recs))) or latest(recs)
    )
    filtered = [scrape(a.parent, now=t0 + 4, per_rank=per_rank) for per_rank in (True, False)]
    assert kept and max(kept) < 300 * 8  # the reader was handed a few lines a rank
    monkeypatch.setattr(exporter, "PER_NODE_PAST", 10**9)  # the reader reads every line
    whole = [scrape(b.parent, now=t0 + 4, per_rank=per_rank) for per_rank in (True, False)]
    assert filtered == whole
    steps = {s.labels["rank"]: s.value for s in samples_of(filtered[0], a.name)["xl_train_step"]}
    assert steps["0"] == 9 and steps["1"] == 8  # the checks see the lines above
    losses = {s.labels["rank"]: s.value for s in samples_of(filtered[0], a.name)["xl_train_loss"]}
    assert math.isnan(losses["1"]) and math.isnan(losses["0"])
