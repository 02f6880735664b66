"""The doctor's table-heavy decisions, as pure functions over hand-built facts; the report object,
its rendering, and the bounded subprocess runner."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from fakecuda import host_config, nvcc_output, survivors
from gpus import idle_gpu
from rich.console import Console
from where import REPO

from xl.doctor import checks, run
from xl.doctor.checks.archs import check_arch_list
from xl.doctor.checks.build import check_host_compiler, check_ninja
from xl.doctor.checks.devices import check_cuda_visible_devices
from xl.doctor.checks.finding import Finding
from xl.doctor.checks.gpu import check_gpus
from xl.doctor.checks.pytorch import check_driver_cuda, check_torch_cuda_match
from xl.doctor.checks.system import check_cgroup, check_nccl, check_shm
from xl.doctor.checks.toolkit import check_ld_library_path
from xl.doctor.facts import (
    CmdResult,
    Compiler,
    Facts,
    LdEntry,
    Toolkit,
    TorchInfo,
    parse_nvcc_version,
)
from xl.doctor.probes import commands
from xl.doctor.render import render_plain, render_report
from xl.doctor.report import Check, Report
from xl.doctor.tables import compiler_max_from_table, deepspeed_verdict, parse_host_config
from xl.gpu.nvml import GPU, Driver


def gpu(index: int, name: str = "NVIDIA A100-SXM4-80GB", cc: str = "8.0") -> GPU:
    return idle_gpu(index, name, cc)


def facts(**kw) -> Facts:
    base = {"env": {}, "python": sys.executable, "driver": Driver("550.54.15", "12.4")}
    base.update(kw)
    return Facts(**base)


def toolkit(
    root: str, version: str, *, gcc_max: int | None = None, lib: str | None = None
) -> Toolkit:
    return Toolkit(
        root=root,
        real=root,
        version=version,
        nvcc=f"{root}/bin/nvcc",
        gcc_max=gcc_max,
        host_config=f"{root}/include/crt/host_config.h" if gcc_max else None,
        lib_dirs=[lib] if lib else [],
        has_headers=True,
    )


def cuda_torch(cuda: str = "12.4") -> TorchInfo:
    return TorchInfo(
        python=sys.executable,
        found=True,
        version=f"2.4.0+cu{cuda.replace('.', '')}",
        cuda=cuda,
        location="/site/torch",
    )


# -- tables ------------------------------------------------------------------------------------


def test_host_config_limits_are_read_from_the_header() -> None:
    assert parse_host_config(host_config(13, 17)) == (None, 13, None, 17)
    real = Path("/usr/local/cuda/include/crt/host_config.h")
    if real.exists():  # the machine's CUDA 13.0: gcc <= 15, clang <= 20
        assert parse_host_config(real.read_text(errors="replace"))[1::2] == (15, 20)
    old = (
        "#if __GNUC__ < 6 || __GNUC__ > 9\n#error -- unsupported GNU version! gcc versions later "
        "than 9\n"
    )
    assert parse_host_config(old)[:2] == (6, 9)


@pytest.mark.parametrize(
    ("cuda", "gcc"),
    [
        ("11.0.3", 9),
        ("11.4.48", 10),
        ("11.4.0", 10),
        ("11.4.100", 11),
        ("11.8.89", 11),
        ("12.3.2", 12),
        ("12.4.1", 13),
        ("12.6.77", 13),
        ("12.8.61", 14),
        ("12.9", 14),
        ("13.0.88", 15),
        ("13.2", 15),
        ("12.7", None),
        ("14.0", None),
    ],
)
def test_gcc_table_is_nvidias_not_torchs(cuda: str, gcc: int | None) -> None:
    assert compiler_max_from_table("gcc", cuda) == gcc


def test_deepspeed_allow_lists() -> None:
    assert "accepts" in deepspeed_verdict("12.4", "12.1", False)
    assert "accepts" in deepspeed_verdict("12.9", "12.8", False)
    assert "refuses" in deepspeed_verdict("12.7", "12.4", False)
    assert "no minor mismatch for CUDA 13" in deepspeed_verdict("13.1", "13.0", False)
    assert "DS_SKIP_CUDA_CHECK=1 makes it only warn" in deepspeed_verdict("13.1", "13.0", True)
    assert "major" in deepspeed_verdict("11.8", "12.4", False)


def test_nvcc_output_parsing() -> None:
    assert parse_nvcc_version(nvcc_output("12.4.131")) == ("12.4", "12.4.131")
    assert parse_nvcc_version("garbage \ufffd") == (None, None)


# -- checks ------------------------------------------------------------------------------------


def test_gcc14_with_cuda_12_8_is_fine_and_gcc15_gets_the_older_compiler() -> None:
    tk = toolkit("/opt/cuda-12.8", "12.8.61")  # no host_config.h: the table decides
    run_ok = CmdResult(["nvcc"], stdout=nvcc_output("12.8.93"))
    base = {
        "cuda_home": tk.root,
        "cuda_home_from": "CUDA_HOME",
        "home_toolkit": tk.root,
        "toolkits": [tk],
        "cuda_home_nvcc_run": run_ok,
    }
    ok = check_host_compiler(
        facts(**base, compiler=Compiler("/usr/bin/gcc", "gcc", "gcc", "14.2.0"))
    )
    assert ok.status == "ok" and "<= 14" in ok.detail
    bad = check_host_compiler(
        facts(
            **base,
            compiler=Compiler("/usr/bin/gcc", "gcc", "gcc", "15.1.0"),
            other_compilers=[
                ("/usr/bin/g++-13", "gcc", 13),
                ("/usr/bin/g++-14", "gcc", 14),
                ("/usr/bin/gcc-14", "gcc", 14),
                ("/usr/bin/g++-15", "gcc", 15),
            ],
        )
    )
    assert bad.status == "fail" and "support table" in bad.detail
    assert bad.fix == "export NVCC_CCBIN=/usr/bin/g++-14 CC=/usr/bin/gcc-14 CXX=/usr/bin/g++-14"
    # Only g++-14 installed: CC names it too (torch passes `-ccbin $CC`; a missing gcc-14 would
    # break every build), and a folder named like a compiler is left alone.
    only_cxx = check_host_compiler(
        facts(
            **base,
            compiler=Compiler("/usr/bin/gcc", "gcc", "gcc", "15.1.0"),
            other_compilers=[("/opt/g++-tools/bin/g++-14", "gcc", 14)],
        )
    )
    assert only_cxx.fix == (
        "export NVCC_CCBIN=/opt/g++-tools/bin/g++-14 CC=/opt/g++-tools/bin/g++-14"
        " CXX=/opt/g++-tools/bin/g++-14"
    )


@pytest.mark.parametrize(("nvcc", "status"), [("11.4.48", "fail"), ("11.4.100", "ok")])
def test_cuda_11_4_0_and_11_4_1_differ_by_nvcc_build(nvcc: str, status: str) -> None:
    tk = toolkit("/opt/cuda-11.4", "11.4")
    f = facts(
        cuda_home=tk.root,
        home_toolkit=tk.root,
        toolkits=[tk],
        cuda_home_nvcc_run=CmdResult(["nvcc"], stdout=nvcc_output(nvcc)),
        compiler=Compiler("/usr/bin/gcc", "gcc", "gcc", "11.3.0"),
    )
    assert check_host_compiler(f).status == status


def test_minor_mismatch_points_at_the_matching_toolkit() -> None:
    home = toolkit("/usr/local/cuda-12.6", "12.6.77")
    match = toolkit("/usr/local/cuda-12.4", "12.4.1")
    f = facts(
        torch=cuda_torch("12.4"),
        cuda_home=home.root,
        cuda_home_from="CUDA_HOME",
        home_toolkit=home.root,
        toolkits=[home, match],
        cuda_home_nvcc_run=CmdResult(["nvcc"], stdout=nvcc_output("12.6.77")),
    )
    c = check_torch_cuda_match(f)
    assert c.status == "warn" and "DeepSpeed accepts" in c.detail
    assert c.fix == "export CUDA_HOME=/usr/local/cuda-12.4 PATH=/usr/local/cuda-12.4/bin:$PATH"
    f13 = facts(
        torch=cuda_torch("13.0"),
        cuda_home="/c",
        home_toolkit="/c",
        toolkits=[toolkit("/c", "13.1.1")],
        env={"DS_SKIP_CUDA_CHECK": "1"},
    )
    c13 = check_torch_cuda_match(f13)
    assert (
        c13.status == "warn" and "DS_SKIP_CUDA_CHECK=1" in c13.detail and "toolkit-13-0" in c13.fix
    )


def test_driver_cuda() -> None:
    assert check_driver_cuda(facts(torch=cuda_torch("12.4"))).status == "ok"
    # Same major, newer minor: NVIDIA's minor-version compatibility runs it (driver >= 525 for
    # 12.x), without PTX JIT: a warning with that reason, not "driver too old".
    low = check_driver_cuda(facts(torch=cuda_torch("12.8"), driver=Driver("550.54.15", "12.4")))
    assert low.status == "warn" and "minor-version compatibility" in low.detail
    assert "12.4" in low.detail and "12.8" in low.detail
    assert "PTX" in low.detail and low.data["minor_version_compatibility"] is True
    # One direction: torch 2.4.0 was published for cu124, which the driver runs fully.
    assert low.fix.endswith("torch==2.4.0 --index-url https://download.pytorch.org/whl/cu124"), (
        low.fix
    )
    assert "driver" not in low.fix
    # torch 2.13.0+cu130 on it: every wheel 550 runs is a downgrade, so the fix is the upgrade
    # to 580 for this distribution, and the downgrade is said in the detail only.
    new = replace(cuda_torch("13.0"), version="2.13.0+cu130")
    up = check_driver_cuda(facts(torch=new, driver_os="ubuntu 24"))
    assert (
        up.status == "fail" and up.fix == "sudo apt-get install -y nvidia-driver-580 && sudo reboot"
    ), up
    assert "a torch downgrade: " in up.detail and "torch==2.6.0 --index-url" in up.detail
    rocky = check_driver_cuda(facts(torch=new, driver_os="rhel 9", container="docker"))
    assert rocky.fix == "sudo dnf module install -y nvidia-driver:580-dkms && sudo reboot"
    assert "run this on the host, not in this container" in rocky.detail
    # 13.x needs a 580 driver for that; another major is a failure.
    thirteen = check_driver_cuda(
        facts(torch=cuda_torch("13.0"), driver=Driver("580.65.06", "13.0"))
    )
    assert thirteen.status == "ok"
    other_major = check_driver_cuda(
        facts(torch=cuda_torch("12.4"), driver=Driver("520.61.05", "11.8"))
    )
    assert other_major.status == "fail" and "insufficient" in other_major.detail
    assert (
        check_driver_cuda(
            facts(torch=cuda_torch("12.8"), driver=Driver(None, None, "x", "library_not_found"))
        ).status
        == "skip"
    )


def test_shm_under_512_mib_warns() -> None:
    assert check_shm(facts(shm_total=64 << 20, shm_free=60 << 20)).status == "warn"
    assert "--shm-size" in check_shm(facts(shm_total=64 << 20, shm_free=0, container="docker")).fix
    # Outside a container the mount itself grows (docker's flag would mean nothing there).
    assert check_shm(facts(shm_total=64 << 20, shm_free=0)).fix.startswith("sudo mount -o remount")
    assert check_shm(facts(shm_total=8 << 30, shm_free=8 << 30)).status == "ok"


def test_cgroup_says_where_runs_get_one_and_warns_where_none_can_be() -> None:
    here = check_cgroup(facts(cgroup_parent="/sys/fs/cgroup/memory/u", cgroup_memory=True))
    assert here.status == "ok" and "/sys/fs/cgroup/memory/u" in here.detail
    assert "--memory-limit works" in here.detail
    v2 = check_cgroup(facts(cgroup_parent="/sys/fs/cgroup/user.slice/app.scope"))
    assert v2.status == "ok" and "no --memory-limit" in v2.detail
    root = check_cgroup(facts(cgroup_reason="XL_CGROUP_ROOT: /x is not a cgroup folder"))
    assert root.status == "warn" and root.fix == "unset XL_CGROUP_ROOT"
    user = "this process's cgroup /sys/fs/cgroup/memory/u is not writable by this user"
    none = check_cgroup(facts(cgroup_reason=user))
    assert none.status == "warn" and user in none.detail and not none.fix
    assert none.detail.endswith("; no command run here gives runs one")
    assert "no command" not in root.detail  # a warning with a fix says none of that


def test_gpus_mixed_models_and_lost() -> None:
    mixed = check_gpus(facts(gpus=(gpu(0), gpu(1, "Tesla T4", "7.5"))))
    assert mixed.status == "warn" and "1x Tesla T4" in mixed.detail
    # the fix names the exact devices of the most numerous model
    three = check_gpus(
        facts(
            gpus=(
                gpu(0, "Tesla T4", "7.5"),
                gpu(1),
                gpu(2, "Tesla T4", "7.5"),
                gpu(3, "Tesla T4", "7.5"),
            )
        )
    )
    assert three.fix == "xl launch --gpus 0,2,3 ..." and "train on the 3x Tesla T4" in three.detail
    assert check_gpus(facts(gpus=(gpu(0), gpu(1)))).status == "ok"
    assert check_gpus(facts(driver=Driver("550", "12.4"), gpus=())).status == "warn"


@pytest.mark.parametrize(
    ("value", "caps", "nvcc", "status"),
    [
        ("8.0+PTX", ["9.0"], None, "warn"),
        ("Ampere", ["8.6"], None, "ok"),
        ("8.0;9.0a", ["9.0"], None, "ok"),
        ("7.0;8.0", ["8.0"], "13.0.88", "fail"),
        ("7.0;8.0", ["8.0"], "12.4.131", "ok"),
        ("sm_80", ["8.0"], None, "fail"),
        ("8.0", [], None, "ok"),
    ],
)
def test_arch_list(value: str, caps: list[str], nvcc: str | None, status: str) -> None:
    f = facts(
        env={"TORCH_CUDA_ARCH_LIST": value}, gpus=tuple(gpu(i, cc=c) for i, c in enumerate(caps))
    )
    if nvcc:
        f.cuda_home, f.cuda_home_nvcc_run = "/c", CmdResult(["nvcc"], stdout=nvcc_output(nvcc))
    c = check_arch_list(f)
    assert c.status == status
    if status == "warn":  # the fix keeps what was written and adds the GPU
        assert c.fix == f'export TORCH_CUDA_ARCH_LIST="{value};{caps[0]}"'


def test_ld_library_path_shadowing_and_other_versions() -> None:
    tk = toolkit("/usr/local/cuda-12.4", "12.4.1", lib="/usr/local/cuda-12.4/lib64")
    base = {"toolkits": [tk], "home_toolkit": tk.root, "env": {"LD_LIBRARY_PATH": "x"}}
    shadow = facts(
        **base,
        ld_entries=[
            LdEntry("/old", "/old", cudart=["libcudart.so.12"]),
            LdEntry(tk.lib_dirs[0], tk.lib_dirs[0], cudart=["libcudart.so.12"]),
        ],
    )
    c = check_ld_library_path(shadow)
    assert (
        c.status == "warn"
        and "shadows" in c.detail
        and c.fix == f"export LD_LIBRARY_PATH={tk.lib_dirs[0]}"
    )
    other = facts(**base, ld_entries=[LdEntry("/cuda11", "/cuda11", cudart=["libcudart.so.11.0"])])
    c = check_ld_library_path(other)
    assert c.status == "warn" and "CUDA 12.4" in c.detail
    clean = facts(
        **base, ld_entries=[LdEntry(tk.lib_dirs[0], tk.lib_dirs[0], cudart=["libcudart.so.12"])]
    )
    assert check_ld_library_path(clean).status == "ok"


def test_nccl_traps() -> None:
    boxes = (gpu(0), gpu(1))
    f = facts(
        gpus=boxes,
        torch=cuda_torch(),
        env={"NCCL_P2P_DISABLE": "1", "NCCL_ASYNC_ERROR_HANDLING": "1"},
    )
    c = check_nccl(f)
    assert (
        c.status == "warn" and "NVLink" in c.detail and "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in c.fix
    )
    assert (
        check_nccl(
            facts(
                gpus=boxes,
                torch=cuda_torch(),
                env={"NCCL_SOCKET_IFNAME": "^docker,lo"},
                net_ifaces=["lo"],
            )
        ).status
        == "ok"
    )
    # "=eth" is an exact name: eth0 is not it, and NCCL can't start without an interface.
    c = check_nccl(
        facts(
            gpus=boxes,
            torch=cuda_torch(),
            env={"NCCL_SOCKET_IFNAME": "=eth"},
            net_ifaces=["eth0", "lo"],
        )
    )
    assert c.status == "fail" and c.fix == "export NCCL_SOCKET_IFNAME=eth0"


@pytest.mark.parametrize(
    ("env", "status", "devices"),
    [
        ({"CUDA_VISIBLE_DEVICES": "GPU-00000001"}, "ok", [1]),
        ({"CUDA_VISIBLE_DEVICES": "MIG-9a1b2c3d-0000-0000-0000-000000000000"}, "ok", None),
        ({"CUDA_VISIBLE_DEVICES": "0,7", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, "fail", [0]),
        ({"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, "ok", [0]),
        ({"CUDA_VISIBLE_DEVICES": "0"}, "warn", [1]),  # FASTEST_FIRST: CUDA's 0 is the H100
    ],
)
def test_cuda_visible_devices(env: dict[str, str], status: str, devices: list[int] | None) -> None:
    f = facts(
        env=env,
        gpus=(gpu(0, "NVIDIA A100-SXM4-80GB", "8.0"), gpu(1, "NVIDIA H100 80GB HBM3", "9.0")),
    )
    c = check_cuda_visible_devices(f)
    assert c.status == status, c
    if devices is not None:
        assert c.data["devices"] == devices
    if status != "ok":
        assert "CUDA_VISIBLE_DEVICES=" in c.fix


def test_ninja_beside_the_interpreter_but_not_on_path() -> None:
    c = check_ninja(facts(ninja_in_bin="/venv/bin/ninja"))
    assert c.status == "warn" and c.fix == "export PATH=/venv/bin:$PATH"
    assert check_ninja(facts()).fix.endswith("-m pip install ninja")


def test_a_check_that_raises_becomes_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(f: Facts) -> Finding:
        raise KeyError("x")

    spec = checks.CheckSpec("shm", "shared memory", "System", boom)
    monkeypatch.setattr(checks, "CHECKS", (spec,))
    (c,) = checks.run_checks(facts())
    assert (c.id, c.status, c.title, c.area) == ("shm", "error", "shared memory", "System")
    assert "KeyError" in c.detail and "report this as an xl bug" in c.detail
    assert c.fix == "xl doctor --json > xl-doctor.json"


def test_run_doctor_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "collect", lambda python=None: 1 / 0)
    report = run.run_doctor()
    assert [c.id for c in report.checks] == [spec.id for spec in checks.CHECKS]
    assert (
        len(report.checks) == len(checks.CHECKS) == 19
        and report.status == "error"
        and report.exit_code() == 0
    )
    assert report.exit_code(strict=True) == 1


def test_the_registry_names_every_check_once_and_orders_the_areas() -> None:
    """The report lists checks in the registry's order under its titles, grouped by area in the
    order docs/contracts.md lists them."""
    ids = [spec.id for spec in checks.CHECKS]
    titles = [spec.title for spec in checks.CHECKS]
    assert len(set(ids)) == len(ids) == 19 and len(set(titles)) == len(titles)
    report = Report(checks.run_checks(facts()))
    assert [(c.id, c.title, c.area) for c in report.checks] == [
        (spec.id, spec.title, spec.area) for spec in checks.CHECKS
    ]
    assert [area for area, _ in report.by_area()] == [
        "Driver & GPUs",
        "CUDA toolkit",
        "PyTorch",
        "Devices",
        "System",
    ]
    toolkit_titles = [c.title for c in dict(report.by_area())["CUDA toolkit"]]
    assert toolkit_titles == [
        "CUDA_HOME",
        "nvcc",
        "CUDA toolkits",
        "host compiler",
        "LD_LIBRARY_PATH",
        "ninja",
    ]


# -- report and rendering ------------------------------------------------------------------------


def _report() -> Report:
    return Report(
        [
            Check(
                id="driver",
                status="skip",
                title="NVIDIA driver",
                detail="no driver",
                fix="install it",
                area="Driver & GPUs",
            ),
            Check(
                id="nvcc",
                status="ok",
                title="nvcc",
                detail="CUDA 13.0 at /x\udcff",
                area="CUDA toolkit",
            ),
            Check(
                id="shm",
                status="warn",
                title="shared memory",
                detail="64 MiB",
                fix="docker run --shm-size=16g",
                area="System",
            ),
        ]
    )


def test_report_status_exit_codes_and_json() -> None:
    r = _report()
    assert r.status == "warn" and r.exit_code() == 0 and r.exit_code(strict=True) == 1
    r.checks.append(
        Check(
            id="torch",
            status="fail",
            title="PyTorch",
            detail="CPU-only",
            fix="pip install",
            area="PyTorch",
        )
    )
    assert r.status == "fail" and r.exit_code() == 1
    data = r.to_json()
    assert list(data)[:3] == ["status", "checks", "gpus"]
    assert set(data["checks"][0]) == {"id", "status", "title", "detail", "fix"}
    assert data["checks"][1]["detail"].endswith("\ufffd")  # undecodable bytes are shown, not fatal
    with pytest.raises(ValueError):
        Check(id="x", status="bad", title="t", detail="d")


def test_plain_and_rich_rendering() -> None:
    text = render_plain(_report())
    lines = text.rstrip().splitlines()
    assert (
        lines[0] == "Driver & GPUs" and "WARN" in text and "fix: docker run --shm-size=16g" in text
    )
    assert lines[-1].startswith("3 checks: 1 ok, 1 skip, 1 warn") and "\x1b" not in text

    buf = io.StringIO()
    Console(file=buf, width=120, force_terminal=True, color_system="standard").print(
        render_report(_report())
    )
    out = buf.getvalue()
    assert "\x1b[" in out
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert "shared memory" in plain and "→ docker run --shm-size=16g" in plain and "▲" in plain
    assert plain.rstrip().splitlines()[-1].startswith("3 checks")


# -- the bounded runner ---------------------------------------------------------------------------


def test_run_cmd_kills_the_whole_group_on_timeout(tmp_path: Path) -> None:
    marker = "27.314159"
    script = tmp_path / "hang"
    script.write_text(f"#!/bin/sh\n/bin/sleep {marker}\n")
    script.chmod(0o755)
    res = commands.run_cmd([str(script)], timeout=0.5)
    assert res.problem and "did not answer within 0.5 s" in res.problem
    assert survivors(marker) == []


def test_run_cmd_missing_garbage_and_runaway(tmp_path: Path) -> None:
    assert "not found" in (commands.run_cmd([str(tmp_path / "nope")]).problem or "")
    noexec = tmp_path / "noexec"
    noexec.write_text("x")
    assert commands.run_cmd([str(noexec)]).problem
    res = commands.run_cmd(["/bin/sh", "-c", "printf '\\377\\376ok'"])
    assert res.ok and res.stdout == "\ufffd\ufffdok"
    if os.path.exists("/usr/bin/yes"):
        big = commands.run_cmd(["/usr/bin/yes"], timeout=2)
        assert big.problem and "more than" in big.problem


def test_help_and_docs_say_what_each_check_decides() -> None:
    """`xl doctor --help` lists every check with what it decides; docs/doctor.md has a row for
    each, and names where the wheel facts come from."""
    proc = subprocess.run(
        [sys.executable, "-m", "xl", "doctor", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stderr == ""
    flat = " ".join(proc.stdout.split())
    docs = (REPO / "docs" / "doctor.md").read_text()
    for spec in (*checks.CHECKS, checks.BUILD):
        assert spec.decides and " ".join(spec.decides.split()) in flat, spec.id
        assert f"| `{spec.id}` |" in docs, spec.id
    assert "build_cuda.sh" in docs and "WHEEL_ARCH_ROWS" in docs


@pytest.mark.parametrize(
    ("ids", "version", "family"),
    [
        ("ubuntu debian", "24.04", "ubuntu 24"),
        ("linuxmint ubuntu debian", "22", "ubuntu 22"),  # a derivative installs Ubuntu's packages
        ("debian", "12", "debian 12"),
        ("debian", None, "debian"),  # testing/sid: no VERSION_ID
        ("rocky rhel centos fedora", "9.4", "rhel 9"),
        ("ol fedora", "8.10", "rhel 8"),
        ("rhel fedora", "10.0", "rhel 10"),
        ("fedora", "42", "fedora 42"),
        ("amzn centos rhel fedora", "2023", "rhel 9"),
        ("amzn centos rhel fedora", "2", None),
        ("arch", None, None),
        ("opensuse-leap suse opensuse", "15.6", None),
        ("", None, None),
    ],
)
def test_the_distribution_that_installs_the_driver(
    ids: str, version: str | None, family: str | None
) -> None:
    from xl.doctor.probes.kernel import os_family  # noqa: PLC0415 - the one function under test

    assert os_family(ids, version) == family


@pytest.mark.parametrize(
    ("release", "host"),
    [
        ("5.14.0-427.13.1.el9_4.x86_64", "rhel 9"),
        ("4.18.0-553.el8_10.x86_64", "rhel 8"),
        ("6.1.0-28-cloud-amd64", "debian 12"),  # bookworm's series names it
        ("5.10.0-33-amd64", "debian 11"),
        ("6.5.0-5-amd64", "debian"),  # a backport: Debian, no version to build a URL from
        ("6.12.9+deb13-amd64", "debian 13"),
        ("6.8.0-49-generic", "ubuntu"),
        ("6.8.0-1017-aws", "ubuntu"),
        ("5.15.0-1071-azure", "ubuntu"),
        ("6.11.4-301.fc41.x86_64", "fedora 41"),
        ("6.18.44-fc-v769", None),  # a custom VM kernel: nothing to go by
        ("5.15.167.4-microsoft-standard-WSL2", None),
    ],
)
def test_a_containers_host_distribution_from_its_kernel(release: str, host: str | None) -> None:
    from xl.doctor.probes.kernel import host_os  # noqa: PLC0415 - the one function under test

    assert host_os(release) == host
