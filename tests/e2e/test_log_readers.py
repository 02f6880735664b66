"""Readers of rank logs (`xl logs`, the plain view, the run reader) cost bounded memory and pass
every byte on: a 100 MB line without a newline cost `xl logs` 420 MiB and the view 150-220 MiB.

Real `xl logs` and `xl attach --no-tui` on a recorded run whose rank 0 log ends in such a line.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from procs import XL, xl_env
from where import FIXTURES

from xl.launcher.rundir.tail import LINE_CAP, RankLogs, Tail

RUNS_FIXTURES = FIXTURES / "runs"
HUGE = 100_000_000


def _run_with_huge_line(home: Path) -> Path:
    run_dir = home / "runs" / "20260530-failed"
    shutil.copytree(RUNS_FIXTURES / "20260530-failed", run_dir)
    with open(run_dir / "logs" / "rank-0.log", "ab") as fh:
        block = b"y" * 1_000_000
        for _ in range(HUGE // len(block)):
            fh.write(block)
    return run_dir


def _peak_rss_mib(argv: list[str], env: dict[str, str], out: Path) -> float:
    """Peak RSS of a command (its stdout into ``out``), from the kernel's own accounting."""
    code = (
        "import resource, subprocess, sys\n"
        "with open(sys.argv[1], 'wb') as fh:\n"
        "    subprocess.run(sys.argv[2:], stdout=fh, stderr=subprocess.DEVNULL, timeout=240)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(out), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip()) / 1024


@pytest.mark.parametrize(
    "command", [["logs", "last"], ["attach", "--no-tui", "last"]], ids=["xl logs", "plain view"]
)
def test_a_100_mb_line_without_newline_costs_little_and_arrives_whole(
    tmp_path: Path, command: list[str]
) -> None:
    home = tmp_path / "home"
    _run_with_huge_line(home)
    out = tmp_path / "out"
    peak = _peak_rss_mib([*XL, *command], xl_env(home), out)
    assert peak < 120, f"{command}: peak RSS {peak:.0f} MiB"
    text = out.read_bytes()
    assert text.count(b"y") >= HUGE  # every byte of the line, none dropped
    assert b"[rank 0] " in text and b"[rank 1] " in text


def test_the_run_reader_s_tail_keeps_a_bounded_end_of_an_unfinished_line(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(b"first\n" + b"z" * (20 << 20))
    tail = Tail(path)
    tracemalloc.start()
    assert tail.read() == [b"first"]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(tail.partial) == LINE_CAP and tail.cut
    assert peak < 3 * (4 << 20) + 2 * LINE_CAP  # a few chunks, never the whole 20 MiB
    with open(path, "ab") as fh:
        fh.write(b"zz end\nnext\n")
    lines = tail.read()
    assert lines[0].endswith(b"zz end") and len(lines[0]) <= LINE_CAP + 8 and lines[1] == b"next"


def test_a_view_that_starts_late_counts_the_lines_it_skipped(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(100_000)))
    tail = Tail(path, initial_cap=1000)
    lines = tail.read()
    assert lines[-1] == b"line 99999" and len(lines) < 200
    assert tail.skipped_lines + len(lines) == 100_000  # the rest is in the file, and counted


def test_rank_logs_are_copied_whole_prefixed_and_long_lines_are_not_cut_by_other_ranks(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank-0.log").write_bytes(b"a\nb\n" + b"L" * (3 * LINE_CAP))  # unfinished, long
    (logs / "rank-1.log").write_bytes(b"x\r50%\ry\n")
    copier = RankLogs(logs)
    copier.discover()
    chunks: list[bytes] = []
    while copier.copy(chunks.append):
        pass
    with open(logs / "rank-0.log", "ab") as fh:
        fh.write(b"LL end\nc\n")
    while copier.copy(chunks.append):
        pass
    copier.finish(chunks.append)
    out = b"".join(chunks)
    assert out.count(b"L") == 3 * LINE_CAP + 2
    lines = out.split(b"\n")
    assert lines[:2] == [b"[rank 0] a", b"[rank 0] b"]
    assert b"[rank 1] x\r50%\ry" in lines and b"[rank 0] c" in lines
    # Every output line starts with a prefix: a rank's long line, broken by another's, says
    # whose it is.
    assert all(line.startswith((b"[rank 0] ", b"[rank 1] ")) for line in lines if line)
    assert copier.last_line == {0: b"c", 1: b"y"}


@pytest.mark.parametrize("limit", [7, 1000, 4 << 20])
def test_rank_logs_copied_as_they_grow_keep_every_byte_of_every_line_in_order(
    tmp_path: Path, limit: int
) -> None:
    """Three ranks' logs grow by pieces that end anywhere (mid-line, between \\r and \\n, on
    empty lines, with control bytes), copied between the writes: each output line is one whole
    line of one rank, prefixed, and each rank's lines come in order with nothing lost."""
    import random  # noqa: PLC0415 - this test only

    rng = random.Random(limit)
    logs = tmp_path / "logs"
    logs.mkdir()
    written: dict[int, bytes] = {0: b"", 1: b"", 2: b""}
    copier = RankLogs(logs)
    chunks: list[bytes] = []
    alphabet = b"abc \t\r\n\n\x1b\x00\xc2\x9b"
    for _ in range(400):
        rank = rng.randrange(3)
        piece = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 300)))
        with open(logs / f"rank-{rank}.log", "ab") as fh:
            fh.write(piece)
        written[rank] += piece
        if rng.random() < 0.5:
            copier.discover()
            copier.copy(chunks.append, limit=limit, drain=rng.random() < 0.5)
    copier.discover()
    while copier.copy(chunks.append, limit=limit):
        pass
    copier.finish(chunks.append)
    got: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    out = b"".join(chunks)
    assert out.endswith(b"\n")
    for line in out[:-1].split(b"\n"):
        assert line.startswith((b"[rank 0] ", b"[rank 1] ", b"[rank 2] ")), line
        got[int(line[6:7])].append(line[9:])
    for rank, data in written.items():
        # the end gives a last line its newline
        expected = data if data.endswith(b"\n") or not data else data + b"\n"
        assert b"\n".join(got[rank]) + b"\n" == expected


def test_one_rank_s_log_copied_without_prefix_is_the_file_byte_for_byte(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    data = b"".join(b"%d\r%d\n" % (i, i) for i in range(200_000)) + b"no newline yet"
    (logs / "rank-3.log").write_bytes(data)
    copier = RankLogs(logs, prefix=False, ranks=[3])
    chunks: list[bytes] = []
    while copier.copy(chunks.append, limit=100_003):
        pass
    assert b"".join(chunks) == data[: data.rfind(b"\n") + 1]
    assert copier.last_line == {3: b"199999"}  # after the line's last \r: what a terminal showed
    copier.finish(chunks.append)
    assert b"".join(chunks) == data + b"\n"
    assert copier.last_line == {3: b"no newline yet"}


def test_a_late_view_s_first_read_after_still_starts_near_the_end(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(100_000)))
    tail = Tail(path, initial_cap=1000, stream=True)
    data = tail.read_after(b"\n")
    assert data is not None and data.startswith(b"\nline ") and data.endswith(b"line 99999\n")
    assert tail.skipped_lines + data.count(b"\n") - 1 == 100_000
    with open(path, "ab") as fh:
        fh.write(b"one more\nhalf")
    assert tail.read_after(b"") == b"one more\n" and tail.read_after(b"") is None
