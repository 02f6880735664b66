"""Atomic, private writes (xl.atomic): a reader sees the old file or the new one, never a part of
either, and nothing is left beside it."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from xl.atomic import write_atomic, write_json_atomic


def test_a_new_file_is_private_and_whole_with_nothing_left_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    write_json_atomic(target, {"status": "running"})
    assert target.read_text() == '{\n  "status": "running"\n}\n'
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["run.json"]


def test_a_write_replaces_the_old_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    target.write_text("old, and longer than the new text\n")
    write_atomic(target, b"new\n")
    assert target.read_bytes() == b"new\n"
    assert os.listdir(tmp_path) == ["run.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "run.json"
    target.write_text("old\n")

    def no_room(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_room)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["run.json"]


def test_writers_at_once_never_collide_and_a_reader_sees_one_whole_version(tmp_path: Path) -> None:
    # Many threads writing the same file at once, as the supervisor and a view may: every write
    # gets its own temporary file (none fails on another's), and the file ends as one of them.
    target = tmp_path / "status.json"
    versions = [f"{i}\n".encode() * 1000 for i in range(16)]
    errors: list[BaseException] = []

    def write(data: bytes) -> None:
        try:
            for _ in range(20):
                write_atomic(target, data)
        except BaseException as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert target.read_bytes() in versions
    assert os.listdir(tmp_path) == ["status.json"]


def test_a_folder_that_is_not_there_is_an_error_not_a_file_elsewhere(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "gone" / "run.json", "x")
    assert os.listdir(tmp_path) == []
