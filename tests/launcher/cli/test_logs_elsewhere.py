"""`xl logs RUN` (every rank) on node 0 of a multi-node run prints the logs node 0 holds, then says
in one line on stderr which ranks' output stays on their own nodes and the command that reads one;
the exit code says failure only when nothing at all could be shown. A one-node run's output is
what it always was, with nothing on stderr. Real `xl logs` on recorded run dirs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from procs import XL, xl_env
from where import FIXTURES

RUN = "20260530-twonode"


def xl_logs(home: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*XL, "logs", *args], env=xl_env(home), capture_output=True, timeout=120, check=False
    )


def node_0(home: Path) -> Path:
    """Node 0's run dir of a two-node run that ended: ranks 0-3 here, 4-7 on node 1 (trn-a07),
    whose logs node 0 does not have."""
    run_dir = home / "runs" / RUN
    shutil.copytree(FIXTURES / "runs" / RUN, run_dir)
    doc = json.loads((run_dir / "run.json").read_text())
    doc["node_rank"], doc["status"] = 0, "failed"
    for row in doc["ranks"]:
        row["node_rank"] = 0 if row["node"] == "trn-b12" else 1
    (run_dir / "run.json").write_text(json.dumps(doc))
    for rank in range(4, 8):
        (run_dir / "logs" / f"rank-{rank}.log").unlink()
    return run_dir


def prefixed(run_dir: Path, ranks: range) -> bytes:
    """What `xl logs` prints of these ranks' logs: each line prefixed with its rank."""
    return b"".join(
        b"[rank %d] " % r + line
        for r in ranks
        for line in (run_dir / "logs" / f"rank-{r}.log").read_bytes().splitlines(keepends=True)
    )


def test_node_0_names_the_ranks_whose_output_stays_on_their_node(tmp_path: Path) -> None:
    run_dir = node_0(tmp_path)
    done = xl_logs(tmp_path, RUN)
    assert done.returncode == 0, done.stderr
    assert done.stdout == prefixed(run_dir, range(4))  # what node 0 holds, as always
    assert done.stderr.decode().splitlines() == [
        "xl logs: the output of ranks 4-7 on node 1 (trn-a07) stays on that node (none of it is "
        f"here); read one with: xl logs {RUN} --rank 4"
    ]
    # The command it names reads that rank (here, the run over, it says where the output is).
    one = xl_logs(tmp_path, RUN, "--rank", "4")
    assert one.returncode != 0 and one.stdout == b""
    assert one.stderr.decode().splitlines() == [
        "xl logs: rank 4 ran on node 1 (trn-a07), which keeps its output, and node 0 cannot ask "
        "it now; on node 1, run: xl logs RUN --rank 4 (its 'xl runs' names RUN)"
    ]


def test_the_last_lines_node_0_kept_are_shown_and_said_to_be_only_those(tmp_path: Path) -> None:
    run_dir = node_0(tmp_path)
    (run_dir / "logs" / "rank-5.log").write_bytes(b"Traceback (most recent call last):\nboom\n")
    done = xl_logs(tmp_path, RUN)
    assert done.returncode == 0, done.stderr
    kept = b"[rank 5] Traceback (most recent call last):\n[rank 5] boom\n"
    assert done.stdout == prefixed(run_dir, range(4)) + kept
    (line,) = done.stderr.decode().splitlines()
    assert "ranks 4-7 on node 1 (trn-a07)" in line
    assert "(node 0 kept only the last lines of rank 5, as they exited)" in line


def test_nothing_to_show_but_the_line_fails(tmp_path: Path) -> None:
    run_dir = node_0(tmp_path)
    for rank in range(4):
        (run_dir / "logs" / f"rank-{rank}.log").unlink()
    done = xl_logs(tmp_path, RUN)
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode().splitlines() == [
        "xl logs: the output of ranks 4-7 on node 1 (trn-a07) stays on that node (none of it is "
        f"here); read one with: xl logs {RUN} --rank 4"
    ]


def test_a_one_node_run_and_a_node_0_with_every_rank_are_left_alone(tmp_path: Path) -> None:
    healthy = tmp_path / "runs" / "20260530-healthy"
    shutil.copytree(FIXTURES / "runs" / "20260530-healthy", healthy)
    done = xl_logs(tmp_path, "20260530-healthy")
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout == prefixed(healthy, range(2))
    # A two-node run dir whose rows say no node (as run.json had before nodes were numbered):
    # every rank's log is here, nothing is said.
    both = tmp_path / "runs" / RUN
    shutil.copytree(FIXTURES / "runs" / RUN, both)
    done = xl_logs(tmp_path, RUN)
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout == prefixed(both, range(8))
