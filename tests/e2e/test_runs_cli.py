"""`xl runs`, `xl logs`, `xl attach`, `xl stop` on recorded run directories (real `xl` command)."""

from __future__ import annotations

import json
import re
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
    assert table[0].split()[:3] == ["RUN", "NAME", "STATUS"]
    # The table lists newest first, as the app's Runs screen does.
    assert [ln.split()[0] for ln in table[1:]] == [
        "20260530-121000-llama-bbbb",
        "20260530-120000-bert-aaaa",
    ]


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
    expected = [
        f"[rank {r}] {ln}"
        for r in (0, 1)
        for ln in (run_dir / "logs" / f"rank-{r}.log").read_text().splitlines()
    ]
    assert both == expected
    assert "no rank 9" in _one_line_exit_2(xl(["logs", "last", "--rank", "9"], xl_env(home)))


def test_run_names_resolve_by_prefix_and_refuse_ambiguity(home: Path) -> None:
    assert "matches 2 runs" in _one_line_exit_2(xl(["logs", "20260530"], xl_env(home)))
    assert "no run matches 'zzz'" in _one_line_exit_2(xl(["attach", "zzz"], xl_env(home)))
    done = xl(["stop", "20260530-12000"], xl_env(home))
    assert (
        done.returncode == 0
        and done.stdout.strip() == "20260530-120000-bert-aaaa already succeeded"
    )


def test_attach_to_finished_runs_exits_with_their_outcome(home: Path) -> None:
    ok = xl(["attach", "20260530-1200"], xl_env(home))
    assert ok.returncode == 0 and "succeeded" in ok.stdout.splitlines()[-1]
    failed = xl(["attach", "last"], xl_env(home))
    assert failed.returncode == 1
    assert TRACEBACK.splitlines()[-1] in failed.stdout  # the root cause's traceback is shown
    assert "failed" in failed.stdout.splitlines()[-1]


def test_a_run_whose_supervisor_died_with_nothing_left_is_recorded_by_the_next_look(
    home: Path,
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    run_dir = make_run(home / "runs", "straggler", run_id="20260530-130000-gpt-cccc")
    run = run_json(run_dir)
    run["supervisor_pid"] = dead.pid
    (run_dir / "run.json").write_text(json.dumps(run))
    # rank 1 left its end; rank 0 left nothing (killed): the run failed, and rank 1 is told right.
    (run_dir / "ranks").mkdir(exist_ok=True)
    (run_dir / "ranks" / "rank-1.json").write_text(
        json.dumps({"rank": 1, "pid": dead.pid, "exit_code": 0, "ended_at": 1.0})
    )
    listed = {r["run_id"]: r for r in json.loads(xl(["runs", "--json"], xl_env(home)).stdout)}
    assert listed["20260530-130000-gpt-cccc"]["status"] == "failed"
    run = run_json(run_dir)
    assert "supervisor was gone" in run["failure"]["message"]
    assert {r["rank"]: r["exit_code"] for r in run["ranks"]}[1] == 0
    assert (
        json.loads((run_dir / "events.jsonl").read_text().splitlines()[-1])["kind"] == "run_ended"
    )
    stop = xl(["stop", "20260530-13"], xl_env(home))
    assert stop.returncode == 0 and stop.stdout.strip() == "20260530-130000-gpt-cccc already failed"


def test_a_run_folder_with_a_damaged_run_json_is_listed_unreadable_and_newest(home: Path) -> None:
    """A half-copied or hand-broken run.json never breaks `xl runs`, hides the run nor the
    others."""
    bad = home / "runs" / "20260530-140000-bad-dddd"
    (bad / "logs").mkdir(parents=True)
    (bad / "logs" / "rank-0.log").write_text("still training\n")
    (bad / "run.json").write_text('{"run_id": "20260530-140000-bad-dddd", "status": "runn')
    proc = xl(["runs", "--json"], xl_env(home))
    assert proc.returncode == 0, proc.stderr
    assert [(r["run_id"], r["status"]) for r in json.loads(proc.stdout)] == [
        ("20260530-120000-bert-aaaa", "succeeded"),
        ("20260530-121000-llama-bbbb", "failed"),
        ("20260530-140000-bad-dddd", "unreadable"),
    ]
    logs = xl(["logs", "last"], xl_env(home))
    assert logs.returncode == 0 and logs.stdout == "still training\n", logs.stderr
    attach = xl(["attach", "last", "--no-tui"], xl_env(home))
    assert (
        attach.returncode == 1
        and attach.stdout == "still training\n"
        and "unreadable" in attach.stderr
    )
    stop = xl(["stop", "20260530-14"], xl_env(home))
    assert stop.returncode == 0 and "unreadable" in stop.stdout, stop.stderr


def test_logs_prints_a_last_line_still_without_its_newline(home: Path) -> None:
    log = home / "runs" / "20260530-121000-llama-bbbb" / "logs" / "rank-0.log"
    with log.open("a") as fh:
        fh.write("epoch 3 ... 41%")  # a progress bar mid-line when the rank died
    proc = xl(["logs", "last", "--rank", "0"], xl_env(home))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("epoch 3 ... 41%\n")
    assert proc.stdout == log.read_text() + "\n"


def test_runs_table_names_each_run_and_lists_newest_first(home: Path) -> None:
    """The table has the run's name and the app's order (newest first); a damaged run is listed
    as such, without a made-up duration."""
    bad = home / "runs" / "20260530-130000-bad-cccc"
    bad.mkdir()
    (bad / "run.json").write_text("{not json")
    lines = xl(["runs"], xl_env(home)).stdout.splitlines()
    header = lines[0].split()
    assert header[:3] == ["RUN", "NAME", "STATUS"]
    rows = {ln.split()[0]: ln for ln in lines[1:]}
    assert list(rows) == [
        "20260530-130000-bad-cccc",
        "20260530-121000-llama-bbbb",
        "20260530-120000-bert-aaaa",
    ]
    assert rows["20260530-121000-llama-bbbb"].split()[1:3] == ["llama-oom", "failed"]
    assert "unreadable (run.json damaged)" in rows["20260530-130000-bad-cccc"]
    assert not re.search(r"\b\d+:\d\d:\d\d\b", rows["20260530-130000-bad-cccc"])  # no TIME for it
