"""Every path of a run dir from one owner (xl.launcher.rundir.layout), checked against the names
docs/contracts.md pins ("The run directory") and the fixture of a plain run's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from where import REPO, TESTS

from xl.launcher.rundir import layout
from xl.launcher.rundir.layout import RunLayout


def test_a_plain_run_s_files_are_all_named_here(tmp_path: Path) -> None:
    run = RunLayout(tmp_path)
    named = {
        run.collector, run.digest, run.events, run.metrics, run.run, run.supervisor_log,
        run.torchrun_log,
        *(
            p
            for r in (0, 1)
            for p in (
                run.rank_log(r), run.rank_record(r),
                run.rank_stacks_socket(r), run.rank_stacks_text(r),
            )
        ),
    }  # fmt: skip
    pinned = json.loads((TESTS / "contracts" / "fixtures" / "run_dir_files.json").read_text())
    assert sorted(str(p.relative_to(tmp_path)) for p in named) == sorted(pinned)


def test_the_files_a_cause_leaves_are_named_as_documented(tmp_path: Path) -> None:
    run = RunLayout(tmp_path)
    docs = (REPO / "docs" / "contracts.md").read_text()
    nodes = run.nodes_stacks_socket
    for path in (run.escaped, run.stop, run.settled, nodes, run.spool_file(3, 42)):
        rel = str(path.relative_to(tmp_path)).replace("3-42", "<r>-<pid>")
        assert f"`{rel}`" in docs, rel
    assert run.stacks_capture(1795569985.76) == "stacks/1795569985.json"
    assert set(run.life_folders()) == {tmp_path, run.logs, run.ranks, run.spool}


def test_a_folder_s_names_read_back() -> None:
    assert [
        layout.log_rank(n) for n in ("rank-12.log", "torchrun.log", "rank-1.log.tmp", "rank-x.log")
    ] == [12, None, None, None]
    assert [
        layout.record_rank(n) for n in ("rank-3.json", "rank-3.stacks.json", "nodes.stacks.json")
    ] == [3, None, None]
    names = ("rank-2-77.jsonl", "rank-2-77.jsonl.replay", "rank-2-77.jsonl.ingest-5")
    assert [layout.spool_owner(n) for n in names] == [(2, 77), (2, 77), None]
    assert (
        layout.log_rank(layout.rank_log_name(5)) == 5
        and layout.record_rank(layout.rank_record_name(5)) == 5
    )


def test_rank_code_can_import_it_without_xl_s_dependencies() -> None:
    # The rank entry imports it before the user's script: standard library (and xl.wire, with its
    # table of figures) only.
    code = (
        "import sys; import xl.launcher.rundir.layout; print(sorted(m for m in sys.modules if "
        "m.startswith('xl')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert out.returncode == 0, out.stderr
    assert set(json.loads(out.stdout.replace("'", '"'))) <= {
        "xl",
        "xl._version",
        "xl.wire",
        "xl.figures",
        "xl.launcher",
        "xl.launcher.rundir",
        "xl.launcher.rundir.layout",
    }
