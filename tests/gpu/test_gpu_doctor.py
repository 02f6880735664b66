"""`xl doctor` on a real GPU machine: its verdicts agree with what actually happens there.

The driver and GPU facts against nvidia-smi; torch's CUDA against torch itself; nvcc against
`nvcc --version`; and the build verdicts (nvcc, host compiler, torch vs toolkit CUDA, ninja)
against a real ``torch.utils.cpp_extension.load_inline`` CUDA build. `xl doctor --build` is
compared with the same build once it exists.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]  # a real build / run: minutes

BUILD_TIMEOUT_S = 600

# A tiny CUDA extension built the way a torch extension build is (nvcc, host compiler, ninja).
LOAD_INLINE = r"""
import sys, torch
from torch.utils.cpp_extension import load_inline
cuda_src = '''
__global__ void add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
void launch(torch::Tensor x) {
    add_one<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), x.numel());
}
'''
mod = load_inline(name="xl_accept_ext", cpp_sources="void launch(torch::Tensor x);",
                  cuda_sources=cuda_src, functions=["launch"], build_directory=sys.argv[1],
                  verbose=False)
x = torch.zeros(1000, device="cuda")
mod.launch(x)
assert float(x.sum()) == 1000.0
print("built and ran")
"""


def _doctor(env: dict[str, str], *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "xl", "doctor", "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S if "--build" in args else 120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode in (0, 1), out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _checks(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in doc["checks"]}


@pytest.fixture(scope="module")
def real_build(tmp_path_factory: pytest.TempPathFactory, box: Any) -> tuple[bool, str]:
    """Whether a real CUDA extension builds and runs here, and the tail of what it said."""
    build_dir = tmp_path_factory.mktemp("ext-build")
    out = subprocess.run(
        [sys.executable, "-c", LOAD_INLINE, str(build_dir)],
        env=box.clean_env(),
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    ok = out.returncode == 0 and "built and ran" in out.stdout
    return ok, (out.stdout + out.stderr)[-1500:]


def test_driver_gpus_and_torch_as_they_are(env: dict[str, str], machine: Any, box: Any) -> None:
    checks = _checks(doc := _doctor(env))
    assert checks["driver"]["status"] == "ok", checks["driver"]
    assert doc["driver"]["version"] == machine.driver
    rows = box.nvidia_smi("driver_version,uuid")
    if rows is not None:
        assert doc["driver"]["version"] == rows[0][0]
        assert [g["uuid"] for g in doc["gpus"]] == [r[1] for r in rows]
    assert checks["gpus"]["status"] in ("ok", "warn"), checks["gpus"]
    assert len(doc["gpus"]) == len(machine.gpu_names)
    assert doc["torch"]["version"] == machine.torch and doc["torch"]["cuda"] == machine.torch_cuda
    # torch ran CUDA on this machine (the suite would have skipped otherwise): the driver can
    # run torch's CUDA, so the doctor must not say it cannot.
    assert checks["driver_cuda"]["status"] in ("ok", "warn"), checks["driver_cuda"]
    assert checks["cuda_visible_devices"]["status"] != "fail"


def test_nvcc_verdict_matches_nvcc_itself(env: dict[str, str]) -> None:
    checks = _checks(_doctor(env))
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc is None:
        assert checks["nvcc"]["status"] in ("skip", "warn"), checks["nvcc"]
        pytest.skip("no nvcc on PATH: only checked that the doctor says so")
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    m = re.search(r"V(\d+\.\d+\.\d+)", out.stdout)
    assert m, out.stdout
    assert checks["nvcc"]["status"] == "ok", checks["nvcc"]
    assert checks["nvcc"]["data"]["version"] == m.group(1)


def test_build_verdicts_agree_with_a_real_extension_build(
    env: dict[str, str], real_build: tuple[bool, str]
) -> None:
    checks = _checks(_doctor(env))
    deciding = ("nvcc", "cuda_home", "host_compiler", "torch_cuda_match", "ninja")
    failing = {i: checks[i]["detail"] for i in deciding if checks[i]["status"] == "fail"}
    built, said = real_build
    if built:
        assert not failing, f"the extension built and ran, but the doctor says: {failing}"
    else:
        assert failing, f"the build failed and every build check passed; the build said:\n{said}"


def test_doctor_build_agrees_with_the_real_build(
    env: dict[str, str], real_build: tuple[bool, str]
) -> None:
    helped = subprocess.run(
        [sys.executable, "-m", "xl", "doctor", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "--build" not in helped.stdout:
        pytest.skip("`xl doctor --build` does not exist yet: nothing to compare with the build")
    build = _checks(_doctor(env, "--build"))["build"]
    built, said = real_build
    assert (build["status"] in ("ok", "warn")) == built, (build, said)
