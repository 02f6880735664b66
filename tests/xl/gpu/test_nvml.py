"""xl.gpu.nvml against the simulated driver, through the real nvidia-ml-py."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import psutil
import pynvml
import pytest
import simnvml
from rankproc import rank_like
from simnvml import GPU_IS_LOST, MODELS, NO_PERMISSION, NOT_SUPPORTED, SimGPU, SimProcess

from xl.gpu import nvml
from xl.gpu.processes import identify, local_pids
from xl.procfs import parse_nspid

# Functions drivers older than ~R510 do not have.
OLD_DRIVER = (
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMigMode",
    "nvmlSystemGetCudaDriverVersion_v2",
)


def test_every_field_of_mixed_models(simnvml):
    gpus = [
        SimGPU(
            model="A100",
            memory_used_mib=1024,
            memory_reserved_mib=512,
            util_gpu=37,
            util_mem=12,
            temperature_c=51,
            power_w=212.5,
            power_limit_w=350,
            mig=1,
            processes=[SimProcess(4242, 1000.0)],
        ),
        SimGPU(model="V100", uuid="GPU-aaaabbbb-0000-1111-2222-333344445555", mig=-1),
    ]
    sim = simnvml(gpus=gpus, driver_version="535.104.05", cuda_version=12020)
    with sim.in_process():
        inv = nvml.inventory()
    assert inv.driver == nvml.Driver(version="535.104.05", cuda_version="12.2")
    a, v = inv.gpus
    assert (a.index, a.name, a.compute_capability) == (0, MODELS["A100"][0], "8.0")
    assert a.uuid.startswith("GPU-") and a.uuid != v.uuid
    assert a.pci_bus_id == "00000000:07:00.0"
    # v2 memory: the driver's reserved share is not "used"
    assert a.memory_total_mib == MODELS["A100"][3]
    assert (a.memory_used_mib, a.memory_reserved_mib) == (1024, 512)
    assert a.memory_free_mib == MODELS["A100"][3] - 1024 - 512
    assert (a.util_gpu, a.util_mem, a.temperature_c) == (37, 12, 51)
    assert (a.power_w, a.power_limit_w) == (212.5, 350)
    assert a.mig_mode is True
    assert [(p.pid, p.used_mib) for p in a.processes] == [(4242, 1000.0)]
    assert not a.lost and a.error is None
    assert (v.name, v.compute_capability) == ("Tesla V100-SXM2-32GB", "7.0")
    assert v.uuid == "GPU-aaaabbbb-0000-1111-2222-333344445555"
    assert v.mig_mode is None  # MIG not supported by this GPU: not available, not an error
    assert v.error is None
    js = inv.to_json()
    assert js["gpus"][0]["memory"]["used_mib"] == 1024
    assert js["gpus"][0]["utilization"] == {"gpu": 37, "memory": 12}
    assert js["gpus"][0]["processes"][0]["pid"] == 4242


def test_zero_and_eight_gpus(simnvml):
    with simnvml(gpus=0).in_process():
        inv = nvml.inventory()
    assert inv.gpus == () and inv.driver.error is None and inv.driver.version
    with simnvml(gpus=8).in_process():
        inv = nvml.inventory()
    assert [g.index for g in inv.gpus] == list(range(8))
    assert len({g.uuid for g in inv.gpus}) == 8
    # nvidia-smi order is PCI bus order
    assert [g.pci_bus_id for g in inv.gpus] == sorted(g.pci_bus_id for g in inv.gpus)


def test_not_supported_values_leave_the_rest_of_the_row(simnvml):
    gpu = SimGPU(
        util_gpu=40,
        errors={
            "nvmlDeviceGetTemperature": NOT_SUPPORTED,
            "nvmlDeviceGetPowerUsage": NOT_SUPPORTED,
        },
    )
    with simnvml(gpus=[gpu]).in_process():
        (g,) = nvml.inventory().gpus
    assert g.temperature_c is None and g.power_w is None
    assert g.util_gpu == 40 and g.power_limit_w == 400 and g.memory_total_mib
    assert g.error is None  # "not supported" is normal, not an error to show


def test_other_errors_are_reported_on_the_row(simnvml):
    gpu = SimGPU(errors={"nvmlDeviceGetPowerUsage": NO_PERMISSION})
    with simnvml(gpus=[gpu]).in_process():
        (g,) = nvml.inventory().gpus
    assert g.power_w is None and g.temperature_c == 33
    assert g.error and "nvmlDeviceGetPowerUsage" in g.error and "Permission" in g.error


def test_old_driver_missing_functions(simnvml):
    gpu = SimGPU(
        memory_used_mib=2048,
        memory_reserved_mib=256,
        processes=[SimProcess(77, 300.0), SimProcess(78, 10.0, graphics=True)],
    )
    sim = simnvml(gpus=[gpu, SimGPU()], missing=OLD_DRIVER, cuda_version=11040)
    with sim.in_process():
        first = nvml.inventory()
        second = nvml.inventory()  # the learnt fallbacks keep giving the same answer
    for inv in (first, second):
        g = inv.gpus[0]
        assert inv.driver.cuda_version == "11.4"  # from nvmlSystemGetCudaDriverVersion (v1)
        # v1 memory counts the reserved share as used
        assert g.memory_used_mib == 2048 + 256 and g.memory_reserved_mib is None
        assert g.memory_free_mib == g.memory_total_mib - 2048 - 256
        assert sorted((p.pid, p.used_mib) for p in g.processes) == [(77, 300.0), (78, 10.0)]
        assert g.mig_mode is None and g.error is None
        assert g.util_gpu == 0 and g.compute_capability == "8.0"


def test_new_driver_without_the_deprecated_temperature_call(simnvml):
    sim = simnvml(gpus=[SimGPU(temperature_c=71)], missing=("nvmlDeviceGetTemperature",))
    with sim.in_process():
        (g,) = nvml.inventory().gpus
    assert g.temperature_c == 71 and g.error is None


def test_utilization_that_changes_over_time(simnvml):
    sim = simnvml(gpus=[SimGPU(util_seq=(10, 90), util_seq_ms=20)])
    seen = set()
    with sim.in_process():
        for _ in range(500):  # wall-clock steps: poll until both values have shown
            seen.add(nvml.inventory().gpus[0].util_gpu)
            if seen == {10, 90}:
                break
            time.sleep(0.005)
    assert seen == {10, 90}


@pytest.mark.parametrize(
    ("init_error", "kind", "words"),
    [
        ("driver_not_loaded", "driver_not_loaded", "modprobe"),
        ("version_mismatch", "version_mismatch", "reboot"),
        ("no_permission", "no_permission", "/dev/nvidia"),
        ("unknown", "other", "Unknown Error"),
    ],
)
def test_init_failures(simnvml, init_error, kind, words):
    with simnvml(gpus=2, init_error=init_error).in_process():
        inv = nvml.inventory()
    assert inv.gpus == ()
    assert inv.driver.error_kind == kind
    assert words in (inv.driver.error or "")
    assert inv.to_json() == {
        "driver": {
            "version": None,
            "cuda_version": None,
            "error": inv.driver.error,
            "error_kind": kind,
        },
        "gpus": [],
    }


def test_init_is_retried_once_the_driver_loads(simnvml):
    sim = simnvml(gpus=2, init_error="driver_not_loaded")
    with sim.in_process():
        assert nvml.inventory().driver.error_kind == "driver_not_loaded"
        sim.update(init_error=None)
        inv = nvml.inventory()
    assert inv.driver.error is None and len(inv.gpus) == 2


@pytest.mark.parametrize("lost", [1, 2], ids=["queries-fail", "handle-fails"])
def test_lost_gpu_is_marked_and_others_still_show(simnvml, lost):
    gpus = [SimGPU(util_gpu=10), SimGPU(lost=lost), SimGPU(util_gpu=30)]
    with simnvml(gpus=gpus).in_process():
        inv = nvml.inventory()
    assert [g.lost for g in inv.gpus] == [False, True, False]
    assert [g.util_gpu for g in inv.gpus] == [10, None, 30]
    assert "lost" in (inv.gpus[1].error or "")
    assert inv.gpus[1].to_json()["lost"] is True


def test_gpu_lost_while_watched_keeps_its_identity(simnvml):
    sim = simnvml(gpus=2)
    with sim.in_process():
        before = nvml.inventory().gpus[1]
        sim.update(1, lost=1)
        after = nvml.inventory().gpus[1]
    assert after.lost and not before.lost
    assert (after.uuid, after.name) == (before.uuid, before.name)
    assert after.memory_used_mib is None


def test_live_changes_are_seen_by_the_next_poll(simnvml):
    sim = simnvml(gpus=[SimGPU(util_seq=(10, 60, 90))])
    with sim.in_process():
        seen = [nvml.inventory().gpus[0].util_gpu for _ in range(3)]
        assert seen == [10, 60, 90]  # util_seq_ms=0: one step per query
        assert nvml.inventory().gpus[0].processes == ()
        sim.add_process(0, 5151, used_mib=2500)
        procs = nvml.inventory().gpus[0].processes
        assert [(p.pid, p.used_mib) for p in procs] == [(5151, 2500.0)]
        sim.update(gpus=3)
        assert len(nvml.inventory().gpus) == 3


def test_process_counted_once_across_compute_and_graphics(simnvml):
    gpu = SimGPU(processes=[SimProcess(900, 100.0), SimProcess(900, 150.0, graphics=True)])
    with simnvml(gpus=[gpu]).in_process():
        (g,) = nvml.inventory().gpus
    assert [(p.pid, p.used_mib) for p in g.processes] == [(900, 150.0)]


def test_processes_false_skips_them(simnvml):
    gpu = SimGPU(processes=[SimProcess(900, 100.0)])
    with simnvml(gpus=[gpu]).in_process():
        (g,) = nvml.inventory(processes=False).gpus
    assert g.processes == () and g.memory_total_mib


def test_rank_process_read_from_proc_environ(simnvml):
    with rank_like(3, 1, "run-abc") as pid:
        gpu = SimGPU(processes=[SimProcess(pid, 4096.0), SimProcess(os.getpid(), 1.0)])
        with simnvml(gpus=[gpu]).in_process():
            (g,) = nvml.inventory().gpus
        by_pid = {p.pid: p for p in g.processes}
        rank = by_pid[pid]
        assert (rank.rank, rank.local_rank, rank.run_id) == (3, 1, "run-abc")
        assert rank.used_mib == 4096.0 and rank.name and "python" in rank.name
        assert by_pid[os.getpid()].name  # a process without RANK is listed all the same


def test_process_that_is_gone_still_listed_without_identity(simnvml):
    # NVML can report a pid that has already exited (or lives in another pid namespace).
    gpu = SimGPU(processes=[SimProcess(2**22 - 3, 10.0)])
    with simnvml(gpus=[gpu]).in_process():
        (p,) = nvml.inventory().gpus[0].processes
    assert (p.name, p.rank, p.local_rank, p.run_id) == (None, None, None, None)


def test_survives_nvml_shut_down_behind_its_back(simnvml):
    with simnvml(gpus=2).in_process():
        assert len(nvml.inventory().gpus) == 2
        pynvml.nvmlShutdown()  # another library in the process released its reference
        inv = nvml.inventory()
    assert inv.driver.error is None and len(inv.gpus) == 2


def test_concurrent_callers_get_consistent_results(simnvml):
    sim = simnvml(gpus=8)
    results: list[nvml.Inventory] = []
    with sim.in_process():

        def poll() -> None:
            for _ in range(20):
                results.append(nvml.inventory())

        threads = [threading.Thread(target=poll) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert len(results) == 80
    assert all(r.driver.error is None and len(r.gpus) == 8 for r in results)
    assert len({tuple(g.uuid for g in r.gpus) for r in results}) == 1


def test_struct_layouts_match_pynvml(simnvml):
    lib = ctypes.CDLL(str(simnvml(gpus=1).library_path))
    lib.simnvml_sizeof.restype = ctypes.c_size_t
    pairs = {
        "nvmlPciInfo_t": pynvml.nvmlPciInfo_t,
        "nvmlMemory_t": pynvml.c_nvmlMemory_t,
        "nvmlMemory_v2_t": pynvml.c_nvmlMemory_v2_t,
        "nvmlUtilization_t": pynvml.c_nvmlUtilization_t,
        "nvmlProcessInfo_v2_t": pynvml.c_nvmlProcessInfo_v3_t,
        "nvmlTemperature_v1_t": pynvml.c_nvmlTemperature_v1_t,
        "nvmlBAR1Memory_t": pynvml.c_nvmlBAR1Memory_t,
        "nvmlEventData_t": pynvml.c_nvmlEventData_t,
    }
    for name, struct in pairs.items():
        assert lib.simnvml_sizeof(name.encode()) == ctypes.sizeof(struct), name


def test_many_processes_read_through_pynvml_arrays(simnvml):
    procs = [SimProcess(1000 + i, 10.0 * (i + 1), graphics=i % 3 == 0) for i in range(12)]
    with simnvml(gpus=[SimGPU(), SimGPU(processes=procs)]).in_process():
        inv = nvml.inventory()
    assert inv.gpus[0].processes == ()
    got = sorted((p.pid, p.used_mib) for p in inv.gpus[1].processes)
    assert got == [(1000 + i, 10.0 * (i + 1)) for i in range(12)]


def test_lost_code_constant_matches_pynvml():
    assert GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST
    assert pynvml.nvmlMemory_v2 == nvml._NVML_MEMORY_V2


@pytest.mark.e2e
def test_import_is_cheap_and_lazy():
    code = "import sys, xl.gpu.nvml; print('pynvml' in sys.modules, 'rich' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.e2e
def test_subprocess_sees_the_simulated_driver_and_live_updates(simnvml):
    sim = simnvml(gpus=2)
    code = (
        "import sys, time, xl.gpu.nvml as n\n"
        "print(n.inventory().gpus[1].util_gpu, flush=True)\n"
        "sys.stdin.readline()\n"
        "print(n.inventory().gpus[1].util_gpu, flush=True)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, **sim.env},
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline().strip() == "0"
        sim.update(1, util_gpu=88)
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "88"
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert not psutil.pid_exists(p.pid)


@pytest.mark.e2e
def test_simnvml_command_line_sets_up_a_shell(tmp_path):
    """What the README shows: eval the printed exports, then xl sees the simulated GPUs."""
    if not simnvml.have_gcc():
        pytest.skip("gcc not found: the simulated NVML driver is compiled with gcc")
    script = (
        f'eval "$({sys.executable} {simnvml.__file__} --gpus 3 --model H100 --dir {tmp_path})" '
        f"&& {sys.executable} -m xl gpus --json"
    )
    env = {k: v for k, v in os.environ.items() if k != "XL_SIMNVML_CONFIG"}
    out = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    gpus = json.loads(out.stdout)["gpus"]
    assert [g["name"] for g in gpus] == ["NVIDIA H100 80GB HBM3"] * 3


# ---------------------------------------------------------------------------------------------
# PIDs from another PID namespace (ranks in a container, xl outside it): mapped through NSpid


def _fake_proc(root, pid, nspid, *, fds=(), env=None, comm="python3"):
    """One process in a fabricated /proc tree: status (NSpid), fd links, environ, comm."""
    d = root / str(pid)
    (d / "fd").mkdir(parents=True)
    levels = "\t".join(str(p) for p in (pid, *nspid))
    (d / "status").write_text(f"Name:\t{comm}\nPid:\t{pid}\nNSpid:\t{levels}\nPPid:\t1\n")
    for i, target in enumerate(fds, start=3):
        os.symlink(target, d / "fd" / str(i))
    env = env or {}
    (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))
    (d / "comm").write_text(comm + "\n")


def test_parse_nspid():
    assert parse_nspid("Name:\tpython\nNSpid:\t4242\t17\t3\nPPid:\t1\n") == (4242, 17, 3)
    assert parse_nspid("Name:\tpython\nNSpid:\t88\n") == (88,)
    assert parse_nspid("Name:\told kernel\nPid:\t5\n") == ()


def test_foreign_pids_map_through_nspid_in_a_fabricated_proc(tmp_path):
    rank_env = {"RANK": "2", "LOCAL_RANK": "0", "XL_RUN_ID": "run-ns"}
    # Container A's pid 7 is 100 here and holds a GPU; container B's pid 7 (200) holds none.
    _fake_proc(tmp_path, 100, (7,), fds=("/dev/nvidiactl", "/dev/nvidia0"), env=rank_env)
    _fake_proc(tmp_path, 200, (7,), fds=("/dev/null",))
    # pid 9 in two containers, both on a GPU: no way to tell, so not guessed.
    _fake_proc(tmp_path, 300, (9,), fds=("/dev/nvidia1",))
    _fake_proc(tmp_path, 400, (9,), fds=("/dev/nvidia1",))
    # 50 exists here and holds a GPU: taken as it is, though a container also has a pid 50.
    _fake_proc(tmp_path, 50, (), fds=("/dev/nvidia0",))
    _fake_proc(tmp_path, 500, (50,), fds=("/dev/nvidia0",))
    # 60 exists here without a GPU (a kernel thread, say); container pid 60 is the real user.
    _fake_proc(tmp_path, 60, (), fds=())
    _fake_proc(tmp_path, 600, (1, 60), fds=("/dev/nvidia2",))  # two levels deep
    got = local_pids([7, 9, 50, 60, 12], proc=str(tmp_path))
    assert got == {7: 100, 9: 9, 50: 50, 60: 600, 12: 12}
    (p,) = identify({7: 2048.0}, proc=str(tmp_path))
    assert (p.pid, p.used_mib, p.name, p.rank, p.local_rank, p.run_id) == (
        100,
        2048.0,
        "python3",
        2,
        0,
        "run-ns",
    )


INNER_NS = r"""
import os, subprocess, sys
# PID 1 of a fresh PID namespace (with its own /proc): the next PID is chosen, then the "rank".
with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
    fh.write(str(int(sys.argv[1]) - 1))
env = {**os.environ, "RANK": "5", "LOCAL_RANK": "1", "XL_RUN_ID": "run-in-container"}
code = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
subprocess.run([sys.executable, "-c", code], env=env, timeout=90)
"""


def _free_pid_here() -> int:
    with open("/proc/sys/kernel/pid_max") as fh:
        top = int(fh.read())
    return next(p for p in range(top - 500, top - 10) if not os.path.exists(f"/proc/{p}"))


@pytest.mark.skipif(sys.platform != "linux", reason="PID namespaces are Linux's")
@pytest.mark.parametrize("where", ["absent here", "taken here by a process without a GPU"])
def test_rank_in_another_pid_namespace_is_labelled(simnvml, where):
    """A real child in a new PID namespace (unshare, as root): NVML reports its inner PID."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) not found: cannot make a PID namespace here")
    inner_pid = _free_pid_here() if where == "absent here" else os.getpid()
    argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", INNER_NS]
    ns = subprocess.Popen(
        [*argv, str(inner_pid)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # one process group: killed whole at the end
    )
    try:
        assert ns.stdout is not None
        line = ns.stdout.readline().strip()
        if not line:
            ns.wait(timeout=10)
            assert ns.stderr is not None
            pytest.skip(
                "cannot create a PID namespace here (needs root or user namespaces): "
                + ns.stderr.read().strip()[-300:]
            )
        assert int(line) == inner_pid
        # The "rank" as this namespace numbers it: the innermost process, running `code`.
        tree = psutil.Process(ns.pid).children(recursive=True)
        (rank_here,) = [c.pid for c in tree if c.cmdline()[-1].startswith("import os, time")]
        sim = simnvml(gpus=[SimGPU(processes=[SimProcess(inner_pid, 3000.0)])])
        with sim.in_process():
            (p,) = nvml.inventory().gpus[0].processes
        assert p.pid == rank_here != inner_pid
        assert (p.rank, p.local_rank, p.run_id, p.used_mib) == (5, 1, "run-in-container", 3000.0)
        # And `xl gpus --json` in another process says the same.
        out = subprocess.run(
            [sys.executable, "-m", "xl", "gpus", "--json"],
            env={**os.environ, **sim.env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        (row,) = json.loads(out.stdout)["gpus"][0]["processes"]
        assert (row["pid"], row["rank"], row["run_id"]) == (rank_here, 5, "run-in-container")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ns.pid, signal.SIGKILL)
        ns.wait(timeout=10)


def test_per_gpu_health_leaves_out_what_it_cannot_read(simnvml):
    """xl.gpu.health reads through nvml.per_gpu: a lost GPU is left out, a GPU without the
    counters (NOT_SUPPORTED, an old driver without the symbol) still answers the rest, and a
    driver that can't start answers nothing, never raising."""
    from xl.gpu import health  # noqa: PLC0415 - the module under test beside nvml's own tests

    sim = simnvml(
        gpus=[
            SimGPU(compute_mode=2),
            SimGPU(lost=1),
            SimGPU(errors={"nvmlDeviceGetComputeMode": NOT_SUPPORTED}),
        ],
        missing=("nvmlDeviceGetRemappedRows",),
    )
    with sim.in_process():
        got = health.health([0, 1, 2, 7])
        assert sorted(got) == [0, 2]  # GPU 1 is lost, there is no GPU 7
        assert got[0].compute_mode == "prohibited" and got[0].remap_pending is None
        assert got[2].compute_mode is None and got[2].ecc_uncorrected == 0
        sim.update(init_error="driver_not_loaded")
        nvml.shutdown()
        assert health.health([0]) == {}


def test_no_driver_is_said_without_loading_pynvml(simnvml):
    """Without libnvidia-ml the inventory says "no NVIDIA driver" and never imports pynvml (every
    `xl launch` on a machine without GPUs asks); with a driver, pynvml reads the GPUs."""
    probe = (
        "import sys, json; from xl.gpu import nvml; inv = nvml.inventory(); "
        "print(json.dumps([inv.driver.error_kind, len(inv.gpus), 'pynvml' in sys.modules]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    bare = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(bare.stdout) == ["library_not_found", 0, False]
    sim = simnvml(gpus=2)
    driven = subprocess.run(
        [sys.executable, "-c", probe],
        env={**env, **sim.env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(driven.stdout) == [None, 2, True]
