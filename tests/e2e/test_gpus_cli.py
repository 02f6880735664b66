"""`xl gpus` run as a real process: against the simulated driver and against this machine."""

from __future__ import annotations

import ctypes.util
import json
import os
import pty
import re
import select
import subprocess
import sys

import pytest
from rankproc import rank_like
from simnvml import NOT_SUPPORTED, SimGPU, SimProcess

pytestmark = pytest.mark.e2e

XL = [sys.executable, "-m", "xl", "gpus"]
GPU_KEYS = {
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "memory",
    "utilization",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "compute_capability",
    "mig_mode",
    "processes",
    "lost",
    "error",
}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XL_SIMNVML_CONFIG", "NO_COLOR")}
    env.update(extra)
    return env


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def rank_process():
    """A real process that looks like rank 5 of an xl run."""
    with rank_like(5, 1, "r-42") as pid:
        yield pid


def eight_gpus(rank_pid: int) -> list[SimGPU]:
    gpus = [
        SimGPU(model="H100" if i % 2 else "A100", util_gpu=10 * i, memory_used_mib=1000.0 * i)
        for i in range(8)
    ]
    gpus[1].processes = [SimProcess(rank_pid, 3072.0)]
    gpus[3].errors = {"nvmlDeviceGetTemperature": NOT_SUPPORTED}
    gpus[6].lost = 1
    return gpus


def test_json_with_eight_simulated_gpus(simnvml, rank_process):
    sim = simnvml(gpus=eight_gpus(rank_process), driver_version="560.35.03", cuda_version=12060)
    out = run([*XL, "--json"], clean_env(**sim.env))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["driver"] == {
        "version": "560.35.03",
        "cuda_version": "12.6",
        "error": None,
        "error_kind": None,
    }
    gpus = data["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    for g in gpus:
        assert set(g) >= GPU_KEYS
        assert set(g["memory"]) >= {"total_mib", "used_mib", "free_mib"}
        assert set(g["utilization"]) == {"gpu", "memory"}
    assert [g["name"] for g in gpus[:2]] == ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"]
    assert [g["compute_capability"] for g in gpus[:2]] == ["8.0", "9.0"]
    assert gpus[2]["utilization"]["gpu"] == 20 and gpus[2]["memory"]["used_mib"] == 2000
    assert (gpus[3]["temperature_c"], gpus[3]["power_w"]) == (None, 60.0)
    assert gpus[6]["lost"] is True and gpus[6]["memory"]["total_mib"] is None
    assert [g["lost"] for g in gpus].count(True) == 1
    (proc,) = gpus[1]["processes"]
    assert proc == {
        "pid": rank_process,
        "used_mib": 3072.0,
        "name": proc["name"],
        "rank": 5,
        "local_rank": 1,
        "run_id": "r-42",
    }
    assert len({g["uuid"] for g in gpus}) == 8


def test_plain_text_is_aligned_and_complete(simnvml, rank_process):
    sim = simnvml(gpus=eight_gpus(rank_process))
    out = run(XL, clean_env(**sim.env))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "\x1b[" not in text  # not a terminal: no colour codes
    lines = text.splitlines()
    assert lines[0] == "NVIDIA driver 550.54.15, CUDA 12.4: 8 GPUs"
    header = next(i for i, line in enumerate(lines) if line.startswith("IDX"))
    rows = lines[header + 1 : header + 9]
    uuid_col = lines[header].index("UUID")
    uuids = [r[uuid_col:].split()[0] for i, r in enumerate(rows) if i != 6]
    assert all(u.startswith("GPU-") and len(u) == 40 for u in uuids)  # column lines up
    assert "LOST" in rows[6] and "n/a" in rows[3]
    proc_header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("GPU  "))
    proc_row = lines[proc_header + 1].split()
    assert proc_row[:2] == ["1", str(rank_process)] and "5" in proc_row and "r-42" in proc_row
    assert any(line.startswith("GPU 6: GPU is lost") for line in lines)


@pytest.mark.parametrize(
    ("init_error", "kind"),
    [("driver_not_loaded", "driver_not_loaded"), ("version_mismatch", "version_mismatch")],
)
def test_driver_failures_are_reported_exit_zero(simnvml, init_error, kind):
    sim = simnvml(gpus=2, init_error=init_error)
    out = run([*XL, "--json"], clean_env(**sim.env))
    assert out.returncode == 0 and out.stderr == ""
    data = json.loads(out.stdout)
    assert data["gpus"] == [] and data["driver"]["error_kind"] == kind
    err = data["driver"]["error"]
    plain = run(XL, clean_env(**sim.env))
    assert plain.returncode == 0 and plain.stdout.strip() == err[:1].upper() + err[1:]


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has an NVIDIA driver"
)
def test_no_driver_on_this_machine():
    out = run([*XL, "--json"], clean_env())
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["gpus"] == []
    assert data["driver"]["error_kind"] == "library_not_found"
    assert "no NVIDIA driver" in data["driver"]["error"]
    plain = run(XL, clean_env())
    assert plain.returncode == 0 and plain.stderr == ""
    assert plain.stdout.startswith("No NVIDIA driver") and "Traceback" not in plain.stdout


def test_bad_usage_is_one_line_exit_2():
    out = run([*XL, "--jsn"], clean_env())
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "--jsn" in out.stderr


def _run_in_terminal(argv: list[str], env: dict[str, str]) -> str:
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        argv,
        env={**env, "COLUMNS": "200", "TERM": "xterm-256color"},
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            if not ready:
                break
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        os.close(master)
    assert proc.returncode == 0
    return b"".join(chunks).decode(errors="replace")


def test_terminal_gets_a_rich_table_and_no_color_gets_plain(simnvml):
    sim = simnvml(gpus=[SimGPU(util_gpu=42), SimGPU(model="L4")])
    rich_out = _run_in_terminal(XL, clean_env(**sim.env))
    assert "\x1b[" in rich_out and "│" in rich_out  # styled table
    assert "NVIDIA L4" in rich_out and "42%" in rich_out
    plain_out = _run_in_terminal(XL, clean_env(NO_COLOR="1", **sim.env))
    assert "\x1b[" not in plain_out and "│" not in plain_out
    assert re.search(r"^\s*1\s+NVIDIA L4\s+GPU-", plain_out, re.M)


def test_force_color_gets_the_table_in_a_pipe(simnvml):
    sim = simnvml(gpus=2)
    out = run(XL, clean_env(FORCE_COLOR="1", **sim.env))
    assert out.returncode == 0 and "\x1b[" in out.stdout and "│" in out.stdout


def test_gpus_json_gives_memory_as_whole_mib(simnvml) -> None:
    """Memory is integers (MiB, floored as nvidia-smi prints them), never floats like 1000.5."""
    gpu = SimGPU(
        memory_used_mib=1000.7,
        memory_reserved_mib=300.5,
        processes=[SimProcess(pid=os.getpid(), used_mib=999.9)],
    )
    env = {**os.environ, **simnvml(gpus=[gpu]).env}
    proc = subprocess.run([*XL, "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)["gpus"]
    memory = row["memory"]
    assert all(
        type(memory[k]) is int for k in ("total_mib", "used_mib", "free_mib", "reserved_mib")
    ), memory
    assert memory["used_mib"] == 1000 and memory["reserved_mib"] == 300
    assert [(p["pid"], p["used_mib"]) for p in row["processes"]] == [(os.getpid(), 999)]
