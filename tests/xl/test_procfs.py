"""xl.procfs: reading other processes in /proc, as `xl gpus` and `xl stop` do to tell ranks apart.

Fabricated /proc trees (every reader takes the root) for the cases a machine rarely shows on
demand (containers' PID namespaces, another user's process); real processes where a real one is
easy to have.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from xl import procfs


def _proc(tmp_path: Path, pid: int, **files: bytes | str) -> Path:
    """A fabricated /proc/<pid> with the given files; returns the /proc root."""
    root = tmp_path / "proc"
    folder = root / str(pid)
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        data = content.encode() if isinstance(content, str) else content
        (folder / name).write_bytes(data)
    return root


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "XL_RUN_ID": "20260530-run", "RANK": "3", "XL_TOKEN": "secret-token"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.stdin.read(); time.sleep(30)"],
        env=env,
        stdin=subprocess.PIPE,
    )
    yield proc
    proc.kill()
    proc.wait(10)


def test_a_rank_is_told_by_its_environment(sleeper: subprocess.Popen[bytes]) -> None:
    env = procfs.read_environ(sleeper.pid, ("XL_RUN_ID", "RANK", "LOCAL_RANK"))
    assert env == {"XL_RUN_ID": "20260530-run", "RANK": "3"}  # only what was asked, and what it has
    assert procfs.read_environ(sleeper.pid)["XL_TOKEN"] == "secret-token"


def test_environment_values_keep_their_equals_signs_and_odd_bytes(tmp_path: Path) -> None:
    raw = b"A=1\0OPTS=--env=K=V\0NOEQUALS\0BAD=\xff\xfe\0=weird\0"
    env = procfs.read_environ(7, proc=str(_proc(tmp_path, 7, environ=raw)))
    assert env["OPTS"] == "--env=K=V" and env["A"] == "1"
    assert env["BAD"] == "\ufffd\ufffd"  # not UTF-8: replaced, not an error
    assert "NOEQUALS" not in env


def test_a_process_that_cannot_be_read_is_unknown_not_an_error(tmp_path: Path) -> None:
    """Gone (or another user's): empty answers, no exception."""
    root = str(_proc(tmp_path, 5))
    assert procfs.read_environ(5, proc=root) == {}
    assert procfs.read_environ(424242, proc=root) == {}
    assert procfs.read_comm(424242, proc=root) is None
    assert procfs.has_open(424242, "/dev/nvidia", proc=root) is None


def test_comm_is_the_short_name(tmp_path: Path) -> None:
    root = str(_proc(tmp_path, 9, comm="pt_main_thread\n"))
    assert procfs.read_comm(9, proc=root) == "pt_main_thread"
    assert procfs.read_comm(9, proc=str(_proc(tmp_path / "b", 9, comm="\n"))) is None
    assert procfs.read_comm(os.getpid()) == Path(f"/proc/{os.getpid()}/comm").read_text().strip()


@pytest.mark.parametrize(
    ("status", "levels"),
    [
        ("Name:\tpython\nNSpid:\t81234\t17\t1\nPPid:\t1\n", (81234, 17, 1)),  # two namespaces deep
        ("Name:\tpython\nNSpid:\t4242\n", (4242,)),  # this namespace only: the common case
        ("Name:\tpython\nPid:\t4242\n", ()),  # kernel < 4.1: no NSpid line
        ("NSpid:\t12\tx\n", ()),
    ],
)
def test_nspid_line(status: str, levels: tuple[int, ...]) -> None:
    assert procfs.parse_nspid(status) == levels


def test_nspid_index_finds_each_container_s_pid_here(tmp_path: Path) -> None:
    """NVML inside a container reports PID 1 or 17: which processes here are they? Two
    containers both have a PID 1; a process of this namespace is not in the index."""
    root = tmp_path / "proc"
    _proc(tmp_path, 500, status="Name:\ta\nNSpid:\t500\t1\n")
    _proc(tmp_path, 600, status="Name:\tb\nNSpid:\t600\t1\n")
    _proc(tmp_path, 601, status="Name:\tc\nNSpid:\t601\t17\n")
    _proc(tmp_path, 42, status="Name:\thost\nNSpid:\t42\n")
    _proc(tmp_path, 43)  # gone between the listing and the read: no status
    (root / "self").mkdir()
    (root / "meminfo").write_text("MemTotal: 1 kB\n")
    index = procfs.nspid_index(str(root))
    assert {k: sorted(v) for k, v in index.items()} == {1: [500, 600], 17: [601]}
    assert procfs.nspid_index(str(tmp_path / "nowhere")) == {}


def test_has_open_sees_a_gpu_device_among_the_descriptors(tmp_path: Path) -> None:
    root = _proc(tmp_path, 11)
    fd = root / "11" / "fd"
    fd.mkdir()
    for n, target in (
        (0, "/dev/null"),
        (1, "pipe:[1234]"),
        (12, "/dev/nvidiactl"),
        (3, "/tmp/x.log"),
    ):
        (fd / str(n)).symlink_to(target)
    assert procfs.has_open(11, "/dev/nvidia", proc=str(root)) is True
    assert procfs.has_open(11, "/dev/dri", proc=str(root)) is False
    with open(os.devnull):  # a real process: this one, with a file open
        assert procfs.has_open(os.getpid(), os.devnull) is True


def test_set_cmdline_hides_the_old_arguments_from_ps(tmp_path: Path) -> None:
    """A process that was given a secret on its command line shows another one, and nothing of
    the secret stays readable (in /proc/PID/cmdline, which is what ps reads)."""
    code = (
        "import sys; from xl import procfs\n"
        "ok = procfs.set_cmdline(['xl-supervisor', 'run-1'])\n"
        "print(ok, flush=True); sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--env", "HF_TOKEN=hf_verysecretvalue"],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "True"
        shown = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert shown.rstrip(b"\0").split(b"\0") == [b"xl-supervisor", b"run-1"]
        assert b"verysecret" not in shown
    finally:
        proc.kill()
        proc.wait(10)


def test_set_cmdline_says_when_it_cannot(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    (root / "self").mkdir(parents=True)
    (root / "self" / "stat").write_bytes(b"123 (python) S 1 2")  # too few fields
    assert procfs.set_cmdline(["x"], proc=str(root)) is False
    assert procfs.set_cmdline(["x"], proc=str(tmp_path / "nowhere")) is False


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["--env", "HF_TOKEN=abc", "--nproc", "2"], ["--env", "HF_TOKEN=***", "--nproc", "2"]),
        (["--env=WANDB_API_KEY=k=v", "train.py"], ["--env=WANDB_API_KEY=***", "train.py"]),
        (
            ["--nproc", "2", "train.py", "--lr", "3e-4"],
            ["--nproc", "2", "train.py", "--lr", "3e-4"],
        ),  # nothing to hide
        (["--environment", "A=1"], ["--environment", "A=1"]),  # another flag
        (["--env"], ["--env"]),
    ],
)
def test_hide_values_shows_names_not_values(args: list[str], shown: list[str]) -> None:
    assert procfs.hide_values(args, "--env") == shown


def test_the_process_tree_finds_every_descendant_in_one_scan(tmp_path: Path) -> None:
    # 10 -> 11 -> 13, 10 -> 12; 20 is another tree; a COMM with spaces and parentheses.
    root = _proc(tmp_path, 10, stat="10 (python3) S 1 10 10 0")
    _proc(tmp_path, 11, stat="11 (pt_data_worker) S 10 10 10 0")
    _proc(tmp_path, 12, stat="12 (xl) relay) S 10 10 10 0")
    _proc(tmp_path, 13, stat="13 (a b) S 11 10 10 0")
    _proc(tmp_path, 20, stat="20 (bash) S 1 20 20 0")
    _proc(tmp_path, 30)  # no stat: ended during the scan
    tree = procfs.process_tree(str(root))
    assert sorted(procfs.descendants(10, tree)) == [11, 12, 13]
    assert procfs.descendants(11, tree) == [13]
    assert procfs.descendants(20, tree) == [] and procfs.descendants(99, tree) == []


def test_the_process_tree_of_this_machine_holds_a_real_child(
    sleeper: subprocess.Popen[bytes],
) -> None:
    tree = procfs.process_tree()
    assert sleeper.pid in procfs.descendants(os.getpid(), tree)
    assert os.getpid() not in procfs.descendants(sleeper.pid, tree)


def test_a_pid_loop_from_reuse_during_the_scan_ends() -> None:
    assert procfs.descendants(1, {1: [2], 2: [3], 3: [2, 1]}) == [2, 3]


def test_a_process_state_tells_a_zombie_from_a_live_one(tmp_path: Path) -> None:
    root = _proc(tmp_path, 7, stat="7 (odd) name) Z 1 7 7 0")
    _proc(tmp_path, 8, stat="8 (python3) S 1 8 8 0")
    assert procfs.proc_state(7, str(root)) == "Z" and procfs.proc_state(8, str(root)) == "S"
    assert procfs.proc_state(9, str(root)) is None  # no such process


def _stat(pid: int, comm: str, start: int, utime: int, stime: int, rss_pages: int) -> str:
    """A /proc/PID/stat line with the fields the readers use in their places (man 5 proc)."""
    fields = ["S", "1"] + ["0"] * 50  # field 3 on
    fields[14 - 3], fields[15 - 3] = str(utime), str(stime)
    fields[22 - 3], fields[24 - 3] = str(start), str(rss_pages)
    return f"{pid} ({comm}) " + " ".join(fields)


def test_start_cpu_and_memory_are_read_from_the_stat_line(tmp_path: Path) -> None:
    hz, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    root = _proc(
        tmp_path,
        7,
        stat=_stat(7, "pt (main) 1", start=5 * hz, utime=3 * hz, stime=hz, rss_pages=256),
    )
    (root / "stat").write_text("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n")
    assert procfs.create_time(7, str(root)) == 1700000005.0
    assert procfs.cpu_rss(7, str(root)) == (5 * hz, 4.0, 256 * page)
    assert (
        procfs.create_time(8, str(root)) is None and procfs.cpu_rss(8, str(root)) is None
    )  # no such process


def test_a_real_process_s_start_is_psutil_s_and_its_cpu_grows() -> None:
    busy = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 30\nwhile time.time() < end: pass"]
    )
    try:
        start = procfs.create_time(busy.pid)
        assert start is not None and abs(start - psutil.Process(busy.pid).create_time()) < 0.02

        def cpu_past(seconds: float) -> tuple[int, float, int] | None:
            deadline = time.monotonic() + 10
            read = procfs.cpu_rss(busy.pid)
            while read is not None and read[1] < seconds and time.monotonic() < deadline:
                time.sleep(0.02)
                read = procfs.cpu_rss(busy.pid)
            return read

        first = cpu_past(0.05)  # past its exec: the interpreter runs
        assert first is not None and first[2] > 1024 * 1024  # an interpreter is resident in MiBs
        later = cpu_past(first[1] + 0.2)
        assert later is not None and later[0] == first[0] and later[1] >= first[1] + 0.2
    finally:
        busy.kill()
        busy.wait(10)
    assert procfs.cpu_rss(busy.pid) is None and procfs.create_time(busy.pid) is None


def test_pss_is_read_from_smaps_rollup_and_unknown_without_it(tmp_path: Path) -> None:
    rollup = (
        "5591c000-7ffd1000 ---p 00000000 00:00 0  [rollup]\n"
        "Rss:  1612 kB\nPss:  216 kB\nPss_Dirty:  112 kB\n"
    )
    root = _proc(tmp_path, 7, smaps_rollup=rollup)
    _proc(
        tmp_path, 8, stat=_stat(8, "old kernel", start=1, utime=0, stime=0, rss_pages=9)
    )  # no smaps_rollup
    _proc(tmp_path, 9, smaps_rollup="Rss:  12 kB\nPss:  lots kB\n")
    assert procfs.pss(7, str(root)) == 216 * 1024  # Pss, not Pss_Dirty nor Rss
    assert (
        procfs.pss(8, str(root)) is None
        and procfs.pss(9, str(root)) is None
        and procfs.pss(10, str(root)) is None
    )


def test_a_real_process_s_pss_is_psutil_s() -> None:
    # The child says when its memory is all there: read while it still grows, the two readings
    # would be of two sizes.
    held = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; b = bytearray(b'1') * (64 << 20); print('ready', flush=True); "
            "time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert held.stdout is not None and held.stdout.readline().strip() == "ready"
        mine, theirs = procfs.pss(held.pid), psutil.Process(held.pid).memory_full_info().pss
        assert mine is not None and mine >= 64 << 20 and abs(mine - theirs) < 2 << 20
    finally:
        held.kill()
        held.wait(10)
    assert procfs.pss(held.pid) is None
