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


def _long_runs(home: Path) -> list[str]:
    """Two runs with ids, names and scripts as long as real ones get."""
    ids = ["20261207-081502-llama-70b-pretrain-stage-2-a1b2", "20261207-091502-bert-c3d4"]
    for run_id in ids:
        run_dir = make_run(home / "runs", "failed", run_id=run_id)
        run = run_json(run_dir)
        run["name"] = "llama-70b-pretrain-stage-2-long-context"
        run["spec"]["script"] = "/home/ada/projects/llm/training/scripts/pretrain_long_context.py"
        (run_dir / "run.json").write_text(json.dumps(run))
    return ids


def _on_a_terminal(args: list[str], env: dict[str, str], columns: int) -> str:
    """`xl ARGS` with its stdout a terminal of ``columns`` columns: what it drew."""
    import fcntl  # noqa: PLC0415 - the terminal test only
    import os  # noqa: PLC0415 - as above
    import pty  # noqa: PLC0415 - as above
    import struct  # noqa: PLC0415 - as above
    import termios  # noqa: PLC0415 - as above

    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "xl", *args], env=env, stdout=side, stderr=subprocess.PIPE
    )
    os.close(side)
    out = b""
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:
            break
        if not data:
            break
        out += data
    proc.wait(timeout=60)
    os.close(main)
    return re.sub(r"\x1b\[[0-9;]*m", "", out.decode()).replace("\r\n", "\n")


def test_runs_never_cuts_a_run_id_other_columns_give_way(home: Path) -> None:
    ids = _long_runs(home)
    for columns in (80, 120):
        lines = xl(["runs"], xl_env(home, COLUMNS=str(columns))).stdout.splitlines()
        assert all(len(ln) <= columns for ln in lines), lines
        for run_id in ids:
            assert any(ln.startswith(run_id + " ") for ln in lines), (run_id, lines)
        assert "STATUS" in lines[0] and "failed" in "\n".join(lines)
        drawn = _on_a_terminal(["runs"], xl_env(home), columns).splitlines()
        assert drawn and all(len(ln) <= columns for ln in drawn), drawn
        for run_id in ids:
            assert any(ln.startswith(run_id + " ") for ln in drawn), (run_id, drawn)
    # A pipe without COLUMNS (a script reading it), or too narrow for the id and status: every
    # line whole, the script's path too.
    piped = xl_env(home)
    piped.pop("COLUMNS", None)
    script = "/home/ada/projects/llm/training/scripts/pretrain_long_context.py"
    for env in (piped, xl_env(home, COLUMNS="30")):
        lines = xl(["runs"], env).stdout.splitlines()
        assert any(script in ln for ln in lines), lines
        assert all(any(ln.startswith(i + " ") for ln in lines) for i in ids), lines


def test_runs_run_shows_one_run_its_ranks_and_cause(home: Path) -> None:
    shown = xl(["runs", "20260530-1210"], xl_env(home))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[1].startswith("20260530-121000-llama-bbbb ") and " failed " in lines[1]
    rows = [ln for ln in lines if re.match(r"\|\s+[01] \| ", ln)]
    assert len(rows) == 2 and "failed (1)" in rows[1] and "stopped (-15)" in rows[0], lines
    assert "traceback of rank 1" in shown.stdout and TRACEBACK.splitlines()[-1] in shown.stdout
    assert lines[-1].startswith("xl: run 20260530-121000-llama-bbbb failed")
    one = json.loads(xl(["runs", "last", "--json"], xl_env(home)).stdout)
    assert one["run_id"] == "20260530-121000-llama-bbbb" and one["status"] == "failed"
    assert [r["rank"] for r in one["ranks"]] == [0, 1]
    assert "no run matches 'zzz'" in _one_line_exit_2(xl(["runs", "zzz"], xl_env(home)))
    assert "matches 2 runs" in _one_line_exit_2(xl(["runs", "20260530"], xl_env(home)))
