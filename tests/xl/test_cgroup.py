"""Where a run's cgroup is made (read from a mountinfo and a /proc/self/cgroup as this machine or
another would show them), sizes as --memory-limit reads and writes them, and a real cgroup's end:
every process in it ended, nothing outside it touched (root and cgroup v1's memory controller)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from xl import cgroup

# cgroup v1 beside an empty v2 tree (this machine, most hosts before 2021)
HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_OWN = "4:memory:/jobs/42\n3:cpuset:/\n0::/\n"
# cgroup v2 only (systemd hosts since 2021)
UNIFIED = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
UNIFIED_OWN = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/term.scope\n"


def test_the_place_is_under_this_process_s_own_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(cgroup, "_judge", lambda p, said: seen.append(p) or cgroup.Place(p))
    assert cgroup.find_place({}, mountinfo=HYBRID, own=HYBRID_OWN).parent == (
        "/sys/fs/cgroup/memory/jobs/42"
    )
    assert cgroup.find_place({}, mountinfo=UNIFIED, own=UNIFIED_OWN).parent == (
        "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/term.scope"
    )
    nothing = cgroup.find_place({}, mountinfo="31 23 0:28 / /tmp rw - tmpfs tmpfs rw\n", own="")
    assert nothing.parent is None and nothing.reason and "no cgroup filesystem" in nothing.reason
    assert len(seen) == 2


def test_xl_cgroup_root_that_is_no_cgroup_or_not_writable_says_why(tmp_path: Path) -> None:
    missing = cgroup.find_place({"XL_CGROUP_ROOT": str(tmp_path / "none")})
    assert missing.parent is None
    assert missing.reason == f"XL_CGROUP_ROOT: {tmp_path / 'none'} is not a cgroup folder"
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "cgroup.procs").touch()
    (fake / "cgroup.controllers").write_text("cpu memory pids\n")
    here = cgroup.find_place({"XL_CGROUP_ROOT": str(fake)})
    assert here == cgroup.Place(str(fake), v2=True, memory=True)
    if os.geteuid() != 0:
        fake.chmod(0o555)
        ro = cgroup.find_place({"XL_CGROUP_ROOT": str(fake)})
        assert ro.parent is None and "not writable by this user" in (ro.reason or "")


@pytest.mark.parametrize(
    ("text", "size"),
    [("64G", 64 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29), ("1048576", 1 << 20),
     ("2t", 2 << 40), (" 300 MB ", 300 << 20)],
)
def test_sizes_read_as_docker_and_slurm_read_them(text: str, size: int) -> None:
    assert cgroup.parse_size(text) == size
    assert cgroup.parse_size(cgroup.format_size(size)) == size


@pytest.mark.parametrize("text", ["", "64Q", "-1G", "0", "G", "1e9", "64 G B"])
def test_what_is_not_a_size_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        cgroup.parse_size(text)


def test_a_run_s_cgroup_is_told_from_another_by_its_name() -> None:
    assert cgroup.run_name("20261207-train-1a2b") == "xl-run-20261207-train-1a2b"
    assert cgroup.run_name("r", 2) == "xl-run-r.node2"
    assert cgroup.is_run_cgroup("/process_api/ab/xl-run-20261207-train-1a2b")
    assert not cgroup.is_run_cgroup("/xl-test-1234") and not cgroup.is_run_cgroup("/docker/ab12")


def test_a_memory_limit_without_the_memory_controller_is_refused_before_anything_is_made(
    tmp_path: Path,
) -> None:
    place = cgroup.Place(str(tmp_path), v2=True, memory=False)
    with pytest.raises(cgroup.CgroupError, match="no memory controller"):
        cgroup.make(place, "xl-run-r", 64 << 20)
    assert list(tmp_path.iterdir()) == []


PLACE = cgroup.find_place()


@pytest.mark.skipif(PLACE.parent is None, reason=f"no cgroup can be made here: {PLACE.reason}")
def test_end_ends_every_process_in_the_cgroup_and_nothing_else(tmp_path: Path) -> None:
    path = cgroup.make(PLACE, f"{cgroup.PREFIX}unit-{os.getpid()}")
    sleep = [sys.executable, "-c", "import signal, time; signal.signal(15, signal.SIG_IGN); "
             "print('ready', flush=True); time.sleep(300)"]
    out = subprocess.PIPE
    inside = [subprocess.Popen(sleep, stdout=out, preexec_fn=cgroup.enter(path)) for _ in "ab"]
    outside = subprocess.Popen(sleep, stdout=out)
    try:
        assert all(p.stdout and p.stdout.readline() == b"ready\n" for p in [*inside, outside])
        assert sorted(p.pid for p in inside) == cgroup.pids(path)
        # Both ignore SIGTERM: SIGKILL after the grace ends them.
        assert cgroup.end(path, 0.2, reap=lambda: [p.poll() for p in inside]) == 2
        assert all(p.wait(timeout=30) == -9 for p in inside)
        assert outside.poll() is None
        assert cgroup.remove(path) and not os.path.exists(path)
    finally:
        for p in [*inside, outside]:
            p.kill()
            p.communicate(timeout=30)
        cgroup.remove(path, wait=0.0)
