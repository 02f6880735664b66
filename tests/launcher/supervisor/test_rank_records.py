"""A rank's end is read from its record whatever the record's mtime says: a file's mtime comes
from the kernel's coarse clock, so a rank that writes its end in the same tick as a write read
before (its relay's count of lost output, on a full disk) leaves the mtime as it was. A rank
gone with such a record exited with its recorded code; a rank gone without one stays a rank
killed by the signal xl sent it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from fakeranks import unit_run_dir as _unit_run_dir

from xl.launcher.rundir import runrecord as run_record
from xl.launcher.supervisor.ranks import Change, Ranks


def _no_pid(k: int) -> int:
    """A pid no process can have (past pid_max): the rank is gone."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1000 + k


def _ranks(tmp_path: Path) -> tuple[Path, Ranks]:
    run_dir = _unit_run_dir(tmp_path)
    record = run_record.load(run_dir)
    assert record is not None
    return run_dir, Ranks(run_dir, record)


def _write(run_dir: Path, rank: int, mtime_ns: int, **fields: object) -> None:
    path = run_dir / "ranks" / f"rank-{rank}.json"
    path.write_text(json.dumps({"rank": rank, "local_rank": rank, **fields}).ljust(4096))
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_a_gone_rank_s_end_written_within_its_records_mtime_is_read(tmp_path: Path) -> None:
    run_dir, ranks = _ranks(tmp_path)
    old = time.time_ns() - 10**9  # long enough ago for the mtime to be trusted
    for rank in (0, 1):
        ranks.hello(rank, _no_pid(rank))
        _write(run_dir, rank, old, pid=_no_pid(rank), log_bytes_lost=4096)
        st = ranks.get(rank)
        assert st is not None
        st.signalled = int(signal.SIGTERM)  # a stop signalled both while they ran
    assert ranks.scan_records() == []
    # Rank 0 records its exit 0 in the same tick; rank 1 dies of the signal with no end.
    _write(run_dir, 0, old, pid=_no_pid(0), log_bytes_lost=4096, exit_code=0, ended_at=1.0)
    found = ranks.check_alive()
    assert [(c.change, c.st.rank if c.st else None, c.code) for c in found] == [
        (Change.ENDED, 0, 0),
        (Change.ENDED, 1, -signal.SIGTERM),
    ]
    st0, st1 = ranks.get(0), ranks.get(1)
    assert st0 is not None and not st0.vanished
    assert st1 is not None and st1.vanished


def test_a_running_rank_s_fresh_record_is_read_again_in_the_next_look(tmp_path: Path) -> None:
    """A record written this tick may change again within it: it is read again next time, and
    the end written meanwhile is found while the rank's process still tears down (it is this
    test's own process, alive)."""
    run_dir, ranks = _ranks(tmp_path)
    ranks.hello(0, os.getpid())
    now = time.time_ns()
    _write(run_dir, 0, now, pid=os.getpid())
    assert ranks.scan_records() == []
    _write(run_dir, 0, now, pid=os.getpid(), exit_code=0, ended_at=time.time())
    found = ranks.scan_records()
    assert [(c.change, c.code) for c in found] == [(Change.ENDED, 0)]


def test_a_record_read_long_after_its_write_is_not_read_again_while_its_mtime_stays(
    tmp_path: Path,
) -> None:
    run_dir, ranks = _ranks(tmp_path)
    ranks.hello(1, os.getpid())
    old = time.time_ns() - 10**9
    _write(run_dir, 1, old, pid=os.getpid())
    assert ranks.scan_records() == []
    _write(run_dir, 1, old, pid=os.getpid(), exit_code=0, ended_at=time.time())
    assert ranks.scan_records() == []  # trusted: the look costs a stat, not a read
