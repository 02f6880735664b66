"""`xl runs`, `xl logs`, `xl attach`, `xl stop` on recorded run directories (real `xl` command)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from procs import run_json, xl, xl_env
from runfixtures import TRACEBACK, make_run


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    make_run(home / "runs", "healthy", t0=1_780_000_000.0, run_id="20260530-120000-bert-aaaa")
    make_run(home / "runs", "failed", t0=1_780_000_500.0, run_id="20260530-121000-llama-bbbb")
    return home


def _one_line_exit_2(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    return lines[0]


def test_runs_json_lists_runs_oldest_first(home: Path) -> None:
    proc = xl(["runs", "--json"], xl_env(home))
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(proc.stdout)
    assert [(r["run_id"], r["status"]) for r in runs] == [
        ("20260530-120000-bert-aaaa", "succeeded"),
        ("20260530-121000-llama-bbbb", "failed"),
    ]
    assert runs[0]["world_size"] == 2 and runs[0]["devices"][0]["index"] == 1
    table = xl(["runs"], xl_env(home)).stdout.splitlines()
    assert table[0].split()[:2] == ["RUN", "STATUS"]
    assert table[2].split()[:2] == ["20260530-121000-llama-bbbb", "failed"]


def test_runs_on_an_empty_home(tmp_path: Path) -> None:
    proc = xl(["runs"], xl_env(tmp_path / "empty"))
    assert proc.returncode == 0 and "no runs yet" in proc.stdout
    assert "no runs under" in _one_line_exit_2(xl(["attach", "last"], xl_env(tmp_path / "empty")))


def test_logs_one_rank_or_all_prefixed(home: Path) -> None:
    run_dir = home / "runs" / "20260530-121000-llama-bbbb"
    one = xl(["logs", "20260530-1210", "--rank", "1"], xl_env(home))
    assert one.returncode == 0, one.stderr
    assert one.stdout == (run_dir / "logs" / "rank-1.log").read_text()
    both = xl(["logs", "last"], xl_env(home)).stdout.splitlines()
    expected = [f"[rank {r}] {ln}" for r in (0, 1) for ln in (run_dir / "logs" / f"rank-{r}.log").read_text().splitlines()]
    assert both == expected
    assert "no rank 9" in _one_line_exit_2(xl(["logs", "last", "--rank", "9"], xl_env(home)))


def test_run_names_resolve_by_prefix_and_refuse_ambiguity(home: Path) -> None:
    assert "matches 2 runs" in _one_line_exit_2(xl(["logs", "20260530"], xl_env(home)))
    assert "no run matches 'zzz'" in _one_line_exit_2(xl(["attach", "zzz"], xl_env(home)))
    done = xl(["stop", "20260530-12000"], xl_env(home))
    assert done.returncode == 0 and done.stdout.strip() == "20260530-120000-bert-aaaa already succeeded"


def test_attach_to_finished_runs_exits_with_their_outcome(home: Path) -> None:
    ok = xl(["attach", "20260530-1200"], xl_env(home))
    assert ok.returncode == 0 and "succeeded" in ok.stdout.splitlines()[-1]
    failed = xl(["attach", "last"], xl_env(home))
    assert failed.returncode == 1
    assert TRACEBACK.splitlines()[-1] in failed.stdout  # the root cause's traceback is shown
    assert "failed" in failed.stdout.splitlines()[-1]


def test_a_run_whose_supervisor_died_is_cleaned_up(home: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    run_dir = make_run(home / "runs", "straggler", run_id="20260530-130000-gpt-cccc")
    run = run_json(run_dir)
    run["supervisor_pid"] = dead.pid
    (run_dir / "run.json").write_text(json.dumps(run))
    listed = {r["run_id"]: r for r in json.loads(xl(["runs", "--json"], xl_env(home)).stdout)}
    assert listed["20260530-130000-gpt-cccc"]["supervisor_alive"] is False
    stop = xl(["stop", "20260530-13"], xl_env(home))
    assert stop.returncode == 0, stop.stderr
    assert run_json(run_dir)["status"] == "stopped"
    assert json.loads((run_dir / "events.jsonl").read_text().splitlines()[-1])["kind"] == "run_ended"


def test_a_run_folder_with_a_damaged_run_json_is_left_out(home: Path) -> None:
    """A half-copied or hand-broken run.json never breaks `xl runs` or hides the other runs."""
    bad = home / "runs" / "20260530-140000-bad-dddd"
    bad.mkdir()
    (bad / "run.json").write_text('{"run_id": "20260530-140000-bad-dddd", "status": "runn')
    proc = xl(["runs", "--json"], xl_env(home))
    assert proc.returncode == 0, proc.stderr
    assert [r["run_id"] for r in json.loads(proc.stdout)] == [
        "20260530-120000-bert-aaaa",
        "20260530-121000-llama-bbbb",
    ]
    assert "no run matches" in _one_line_exit_2(xl(["logs", "20260530-14"], xl_env(home)))


def test_logs_prints_a_last_line_still_without_its_newline(home: Path) -> None:
    log = home / "runs" / "20260530-121000-llama-bbbb" / "logs" / "rank-0.log"
    with log.open("a") as fh:
        fh.write("epoch 3 ... 41%")  # a progress bar mid-line when the rank died
    proc = xl(["logs", "last", "--rank", "0"], xl_env(home))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("epoch 3 ... 41%\n")
    assert proc.stdout == log.read_text() + "\n"
