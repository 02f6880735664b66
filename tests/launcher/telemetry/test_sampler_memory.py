"""A rank's memory as the sampler reports it, against real processes whose memory is known.

The fake rank forks the way a real one does: xl's relay first (before the model's memory exists),
then DataLoader-like workers that share the rank's pages without writing them. The truth is the
allocation the rank made and the same processes' PSS read here from smaps_rollup.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
from xltele import assert_gone, rank_env

from xl.launcher.telemetry.roster import from_rows
from xl.launcher.telemetry.sampler import Sampler
from xl.procfs import pss

MIB = 1024 * 1024

# argv: READY_FILE, MIB_HELD, WORKERS, RELAY_MIB. Pages are touched one by one: a calloc'd
# bytearray that is never written holds no memory.
_RANK = r"""
import json, os, sys, time
ready, held, workers, relay_mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def touched(mib):
    buf = bytearray(mib << 20)
    buf[::4096] = b"\1" * len(range(0, len(buf), 4096))
    return buf

relay = os.fork()
if relay == 0:
    with open("/proc/self/comm", "w") as fh:
        fh.write("xl-relay")
    own = touched(relay_mib)  # the relay's private memory: never the rank's
    time.sleep(120)
    os._exit(0)
data = touched(held)
kids = []
for _ in range(workers):
    pid = os.fork()
    if pid == 0:
        total = sum(data[::1 << 20])  # reads the shared pages, writes none
        time.sleep(120)
        os._exit(0)
    kids.append(pid)
with open(ready + ".tmp", "w") as fh:
    json.dump({"relay": relay, "workers": kids}, fh)
os.rename(ready + ".tmp", ready)
time.sleep(120)
"""


def _start(
    tmp_path: Path, held: int, workers: int, relay_mib: int
) -> tuple[subprocess.Popen, dict]:
    ready = tmp_path / f"ready-{held}-{workers}.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", _RANK, str(ready), str(held), str(workers), str(relay_mib)],
        env=rank_env(),
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, (
            "the fake rank did not get ready"
        )
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())


def _end(proc: subprocess.Popen) -> set[int]:
    pids = {proc.pid}
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        kids = []
    for kid in kids:
        pids.add(kid.pid)
        kid.kill()
    proc.kill()
    proc.wait(10)
    return pids


def _pss_mib(pids: list[int]) -> float:
    return sum(pss(p) or 0 for p in pids) / MIB


def _rss_mib(pids: list[int]) -> float:
    return sum(psutil.Process(p).memory_info().rss for p in pids) / MIB


def test_a_rank_with_workers_counts_shared_pages_once_and_never_its_relay(tmp_path: Path) -> None:
    proc, kids = _start(tmp_path, held=300, workers=2, relay_mib=150)
    try:
        mine = [proc.pid, *kids["workers"]]
        before = _pss_mib(mine)
        (rec,), gone = Sampler(inventory=False).sample(from_rows([{"rank": 0, "pid": proc.pid}]))
        after = _pss_mib(mine)
        rss_sum = _rss_mib([*mine, kids["relay"]])
        own_rss = psutil.Process(proc.pid).memory_info().rss / MIB
    finally:
        pids = _end(proc)
    assert gone == []
    # The footprint: the 300 MiB once, plus the interpreters' own pages; the same processes'
    # PSS read here before and after agrees within a few MiB.
    assert 300 <= rec["mem_mib"] < 300 + 120, rec
    assert min(before, after) - 8 <= rec["mem_mib"] <= max(before, after) + 8, (rec, before, after)
    # What summing RSS gave: the 300 MiB three times and the relay's 150 on top. The test can
    # tell the two apart.
    assert rss_sum > 900 + 150 and rec["mem_mib"] < rss_sum / 2, (rec, rss_sum)
    # rss_mib is the rank process's own resident memory, which holds the 300 MiB whole.
    assert abs(rec["rss_mib"] - own_rss) < 8 and rec["rss_mib"] >= 300, rec
    assert rec["nproc"] == 4  # every process under the rank, the relay too
    assert_gone(pids)


def test_a_rank_without_workers_is_its_own_memory(tmp_path: Path) -> None:
    """The healthy-unusual shape: no DataLoader workers (num_workers=0), only the relay."""
    proc, kids = _start(tmp_path, held=200, workers=0, relay_mib=150)
    try:
        truth = _pss_mib([proc.pid])
        (rec,), _ = Sampler(inventory=False).sample(from_rows([{"rank": 0, "pid": proc.pid}]))
        own_rss = psutil.Process(proc.pid).memory_info().rss / MIB
    finally:
        pids = _end(proc)
    assert kids["workers"] == []
    assert 200 <= rec["mem_mib"] < 200 + 100 and abs(rec["mem_mib"] - truth) < 8, (rec, truth)
    # Alone with its pages (the relay forked before the 200 MiB existed), its PSS is about its RSS.
    assert (
        abs(rec["mem_mib"] - rec["rss_mib"]) < 0.2 * rec["rss_mib"]
        and abs(rec["rss_mib"] - own_rss) < 8
    ), rec
    assert rec["nproc"] == 2
    assert_gone(pids)


def test_gpu_proc_mem_is_the_rank_s_processes_on_its_gpu(
    tmp_path: Path, simnvml, simnvml_gpu
) -> None:
    """NVML per process: the rank and its worker each hold memory on the rank's GPU, another
    process (another job) holds more there, and the relay holds none. The rank's figure is its
    processes' sum; the GPU's used memory stays the whole GPU's."""
    proc, kids = _start(tmp_path, held=1, workers=1, relay_mib=1)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        sim = simnvml(
            gpus=[
                simnvml_gpu(model="A100", memory_used_mib=30000),
                simnvml_gpu(model="A100", memory_used_mib=5000),
            ]
        )
        sim.add_process(0, proc.pid, 2048)
        sim.add_process(0, kids["workers"][0], 512)
        sim.add_process(0, other.pid, 20000)
        sim.add_process(1, proc.pid, 300)  # a stray context on another GPU is not on its GPU
        with sim.in_process():
            (rec,), _ = Sampler().sample(from_rows([{"rank": 0, "pid": proc.pid, "gpu": None}]))
    finally:
        pids = _end(proc)
        other.kill()
        other.wait(10)
    assert (rec["gpu"], rec["gpu_proc_mem_mib"], rec["gpu_mem_used_mib"]) == (0, 2560, 30000), rec
    assert "proc_gpu_mem_mib" not in rec
    assert_gone(pids | {other.pid})


def test_between_pss_reads_the_footprint_follows_the_rank_s_rss(
    tmp_path: Path, monkeypatch
) -> None:
    """PSS is read again only when its cost allows (a big rank's costs the kernel milliseconds):
    in between, memory the rank gains shows at once, through its RSS."""
    from xl.launcher.telemetry import sampler as sampler_module  # noqa: PLC0415 - its knobs, this test only

    grow = tmp_path / "grow"
    code = (
        "import os, sys, time\n"
        "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
        "more = bytearray(200 << 20); more[::4096] = b'\\1' * len(range(0, len(more), 4096))\n"
        "open(sys.argv[1] + '.done', 'w').close()\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(grow)], env=rank_env())
    reads: list[int] = []
    real = sampler_module.pss

    def counted(pid: int) -> int | None:
        reads.append(pid)
        return real(pid)

    monkeypatch.setattr(sampler_module, "pss", counted)
    monkeypatch.setattr(sampler_module, "_PSS_MIN_S", 3600.0)
    try:
        sampler = Sampler(inventory=False)
        ranks = from_rows([{"rank": 0, "pid": proc.pid}])
        deadline = time.monotonic() + 30
        while not (records := sampler.sample(ranks)[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        before = records[0]["mem_mib"]
        grow.touch()
        deadline = time.monotonic() + 60
        while not Path(f"{grow}.done").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        (after,), _ = sampler.sample(ranks)
        truth = real(proc.pid) / MIB
    finally:
        pids = _end(proc)
    assert reads == [proc.pid]  # read once: the next read is not due
    assert 190 <= after["mem_mib"] - before <= 230 and abs(after["mem_mib"] - truth) < 20, (
        before,
        after,
        truth,
    )
    assert_gone(pids)
