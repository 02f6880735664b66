"""run.json through its one owner, xl.launcher.rundir.runrecord: what other tools and `xl` rely on.

run.json is a contract (docs/contracts.md, "run.json"): keys xl does not know survive every change,
a half-written or damaged file never crashes a viewer, the statuses and exit codes are the
documented ones, and the file is replaced whole and kept private (it holds the run's env).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.runrecord import FINAL, RunRecord, RunStatus, exit_code_for, is_final


def _write(run_dir: Path, text: str | bytes) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "run.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


def _keys(run_dir: Path) -> list[str]:
    return list(json.loads((run_dir / "run.json").read_text()))


# ---------------------------------------------------------------------------------- round trips
def test_unknown_keys_survive_a_change_in_their_order(tmp_path: Path) -> None:
    """Another tool's keys (and its order) come back as written; a new key goes last."""
    original = {
        "zeta": {"nested": [1, {"deep": True}]},
        "status": "running",
        "run_id": "r1",
        "scheduler": "slurm-job-17",
        "name": "train.py",
        "ranks": [{"rank": 0, "pid": 41, "custom": "kept"}],
        "ended_at": None,
        "alpha": 3.5,
    }
    _write(tmp_path, json.dumps(original))
    rec = record.load(tmp_path)
    assert rec is not None
    rec.update(failure={"rank": 0, "exit_code": 1, "traceback": None})
    rec.end(RunStatus.FAILED, at=1234.0)
    record.save(tmp_path, rec)

    saved = json.loads((tmp_path / "run.json").read_text())
    assert list(saved) == [*original, "failure"]
    assert saved["status"] == "failed" and saved["ended_at"] == 1234.0
    for key in ("zeta", "scheduler", "ranks", "alpha"):
        assert saved[key] == original[key]


def test_a_record_saved_unchanged_is_the_same_file(tmp_path: Path) -> None:
    text = (
        json.dumps({"run_id": "r2", "name": "x", "status": "succeeded", "extra": [1, 2]}, indent=2)
        + "\n"
    )
    _write(tmp_path, text)
    rec = record.load(tmp_path)
    assert rec is not None
    record.save(tmp_path, rec)
    assert (tmp_path / "run.json").read_text() == text


def test_a_new_record_starts_with_run_id_then_status_after_name(tmp_path: Path) -> None:
    """The layout every run.json had before the record existed (tests/contracts pin the keys)."""
    rec = RunRecord(run_id="r3", data={"name": "train.py", "spec": {}, "started_at": 1.0})
    record.save(tmp_path, rec)
    assert _keys(tmp_path) == ["run_id", "name", "status", "spec", "started_at"]
    assert record.read_json(tmp_path)["status"] == "running"


def test_run_id_comes_from_the_folder_when_run_json_lacks_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "20260530-120000-x-abcd"
    _write(run_dir, '{"status": "stopped"}')
    rec = record.load(run_dir)
    assert rec is not None and rec.run_id == run_dir.name and rec.final


# ---------------------------------------------------------------------------------- damage
@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        '{"run_id": "r", "status": "runn',  # cut off mid-write
        "[1, 2]",
        "null",
        '"running"',
        b"\xff\xfe\x00garbage",
    ],
    ids=["empty", "brace", "truncated", "array", "null", "string", "binary"],
)
def test_a_damaged_run_json_reads_as_nothing(tmp_path: Path, text: str | bytes) -> None:
    _write(tmp_path, text)
    assert record.load(tmp_path) is None
    assert record.read_json(tmp_path) == {}


def test_a_missing_run_json_reads_as_nothing(tmp_path: Path) -> None:
    assert record.load(tmp_path / "nope") is None
    assert record.read_json(tmp_path / "nope") == {}


def test_fields_of_the_wrong_type_read_as_unset(tmp_path: Path) -> None:
    """A hand-edited or foreign run.json never makes a viewer act on garbage."""
    _write(
        tmp_path,
        json.dumps(
            {
                "run_id": "r4",
                "status": ["failed"],
                "supervisor_pid": True,
                "supervisor_started_at": "yesterday",
                "ranks": {"0": {}},
                "failure": "boom",
                "world_size": 2.5,
                "devices": [{"index": 0}, "GPU-1"],
                "started_at": "noon",
                "grace_s": 0,
            }
        ),
    )
    rec = record.load(tmp_path)
    assert rec is not None
    assert rec.status == "unknown" and not rec.final and rec.exit_code == 1
    assert rec.supervisor_pid is None and rec.supervisor_started_at is None
    assert rec.ranks == () and rec.failure is None and rec.world_size is None
    assert rec.devices == (record.DeviceRow(index=0),) and rec.started_at is None
    assert rec.grace_s is None  # 0 means "not set": the default grace applies
    _write(tmp_path, json.dumps({"run_id": "r5", "supervisor_pid": -3}))
    loaded = record.load(tmp_path)
    assert loaded is not None and loaded.supervisor_pid is None


# ---------------------------------------------------------------------------------- statuses
def test_rows_read_typed_and_write_back_what_they_read(tmp_path: Path) -> None:
    """A rank's and a device's row: typed for xl, and another tool's keys, a value of a type xl
    does not expect and the order all survive a rewrite; what xl changed is written over."""
    rank = {
        "theirs": [1],
        "rank": 3,
        "node": "vm-a",
        "pid": "1234",
        "state": "running",
        "started_at": 5,
    }
    device = {"index": 1, "name": "A100", "vendor_note": "spare", "uuid": None}
    _write(tmp_path, json.dumps({"run_id": "r10", "ranks": [rank, "junk"], "devices": [device, 7]}))
    rec = record.load(tmp_path)
    assert rec is not None
    (row,) = rec.ranks
    typed = (row.rank, row.host, row.pid, row.state, row.started_at, row.exit_code)
    assert typed == (3, "vm-a", None, "running", 5.0, None)
    assert rec.devices == (record.DeviceRow(index=1, name="A100"),)
    assert row.to_json() == rank and list(row.to_json()) == list(rank)
    assert rec.devices[0].to_json() == device
    ended = replace(row, state="exited", exit_code=0, waited_s=1.5)
    rec.update(ranks=[ended])
    record.save(tmp_path, rec)
    (written,) = json.loads((tmp_path / "run.json").read_text())["ranks"]
    assert written == {**rank, "state": "exited", "exit_code": 0, "waited_s": 1.5}
    assert list(written) == [*rank, "exit_code", "waited_s"]


def test_a_row_made_here_writes_every_key_it_knows() -> None:
    made = record.RankRow(rank=0, host="vm-a").to_json()
    assert list(made) == list(record.RankRow.json_keys())
    assert made["node"] == "vm-a" and made["pid"] is None


def test_the_failure_reads_typed_and_passes_on_as_written(tmp_path: Path) -> None:
    failure = {
        "rank": 1, "exit_code": 3, "message": "rank 1 failed first", "node": "vm-a", "extra": True,
    }
    _write(tmp_path, json.dumps({"run_id": "r11", "failure": failure}))
    rec = record.load(tmp_path)
    assert rec is not None and rec.failure is not None
    assert (rec.failure.rank, rec.failure.exit_code, rec.failure.host) == (1, 3, "vm-a")
    assert rec.failure_json == failure
    _write(tmp_path, json.dumps({"run_id": "r12", "failure": {}}))
    empty = record.load(tmp_path)
    assert empty is not None and empty.failure is None and empty.failure_json == {}


def test_the_statuses_are_the_documented_ones() -> None:
    assert {s.value for s in RunStatus} == {"running", "succeeded", "failed", "stopped"}
    assert set(FINAL) == {"succeeded", "failed", "stopped"}
    assert [s for s in RunStatus if not s.final] == [RunStatus.RUNNING]


@pytest.mark.parametrize(
    ("status", "final"),
    [("succeeded", True), ("failed", True), ("stopped", True), ("running", False),
     ("unknown", False), ("", False), (None, False), (1, False), (["failed"], False)],
)
def test_is_final_takes_any_run_json_value(status: object, final: bool) -> None:
    assert is_final(status) is final


def test_ending_a_run_records_its_status_and_time(tmp_path: Path) -> None:
    rec = RunRecord(run_id="r6", data={"name": "x", "ended_at": None})
    assert not rec.final
    rec.end("stopped", at=99.0)
    assert rec.final and rec.status == "stopped" and rec.ended_at == 99.0
    with pytest.raises(ValueError):
        rec.end(RunStatus.RUNNING)
    with pytest.raises(ValueError):
        rec.update(status="finished")  # not a status: never written to run.json
    assert rec.status == "stopped"


# ---------------------------------------------------------------------------------- exit codes
@pytest.mark.parametrize(
    ("status", "code"),
    [("succeeded", 0), ("failed", 1), ("stopped", 1), ("running", 1), ("unknown", 1), (None, 1)],
)
def test_exit_codes_follow_the_status(status: object, code: int) -> None:
    """docs/contracts.md, exit codes: 0 success; 1 the run failed (a stopped run did not succeed
    either)."""
    assert exit_code_for(status) == code
    if isinstance(status, str) and status in {s.value for s in RunStatus}:
        assert RunStatus(status).exit_code == code
        assert RunRecord(run_id="r", status=status).exit_code == code


# ---------------------------------------------------------------------------------- the file
def test_save_replaces_the_file_whole(tmp_path: Path) -> None:
    """A reader that opened the old file reads all of it; the next open reads all of the new."""
    record.save(tmp_path, RunRecord(run_id="r7", data={"name": "old", "pad": "x" * 100_000}))
    with open(tmp_path / "run.json", encoding="utf-8") as old:
        record.save(tmp_path, RunRecord(run_id="r7", status="succeeded", data={"name": "new"}))
        assert json.loads(old.read())["name"] == "old"
    assert record.read_json(tmp_path) == {"run_id": "r7", "name": "new", "status": "succeeded"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no temp file left


def test_a_save_that_fails_leaves_the_old_file(tmp_path: Path) -> None:
    record.save(tmp_path, RunRecord(run_id="r8", data={"name": "kept"}))
    before = (tmp_path / "run.json").read_text()
    with pytest.raises(TypeError):
        record.save(tmp_path, RunRecord(run_id="r8", data={"name": "x", "bad": object()}))
    assert (tmp_path / "run.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_run_json_is_private(tmp_path: Path) -> None:
    """run.json holds the run's environment (tokens, keys): only its owner may read it."""
    (tmp_path / "run.json").write_text("{}")
    os.chmod(tmp_path / "run.json", 0o644)
    record.save(tmp_path, RunRecord(run_id="r9", data={"rank_env": {"XL_TOKEN": "secret"}}))
    assert stat.S_IMODE(os.stat(tmp_path / "run.json").st_mode) == 0o600


# ---------------------------------------------------------------------------------- the ranks' env
def test_the_ranks_variables_are_read_from_rank_env_beside_the_nodes_comparison(
    tmp_path: Path,
) -> None:
    diffs = [{"node": 1, "host": "b", "field": "torch", "value": "2.6", "others": "2.7"}]
    _write(
        tmp_path,
        json.dumps(
            {
                "run_id": "r10",
                "rank_env": {"CUDA_VISIBLE_DEVICES": "1,0"},
                "env": {"diffs": diffs, "compared": [0, 1]},
            }
        ),
    )
    rec = record.load(tmp_path)
    assert rec is not None and rec.rank_env == {"CUDA_VISIBLE_DEVICES": "1,0"}
    assert rec.data["env"]["diffs"] == diffs


def test_a_run_json_from_before_rank_env_still_gives_the_ranks_variables(tmp_path: Path) -> None:
    """Written before the move, ``env`` is the ranks' variables, a flat map of strings."""
    _write(tmp_path, json.dumps({"run_id": "r11", "env": {"CUDA_VISIBLE_DEVICES": "2"}}))
    rec = record.load(tmp_path)
    assert rec is not None and rec.rank_env == {"CUDA_VISIBLE_DEVICES": "2"}


def test_a_run_with_only_the_nodes_comparison_has_no_ranks_variables(tmp_path: Path) -> None:
    _write(tmp_path, json.dumps({"run_id": "r12", "env": {"diffs": []}}))
    rec = record.load(tmp_path)
    assert rec is not None and rec.rank_env == {}
