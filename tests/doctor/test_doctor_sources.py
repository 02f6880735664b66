"""Where the doctor's CUDA facts come from, run as the real `xl doctor --json` process in scenario
sandboxes: which host compiler nvcc runs, CUDA_HOME as torch resolves it, the libcudart the
ldconfig cache resolves, which toolkit PATH / CUDA_HOME / LD_LIBRARY_PATH each select, and
folders that are not what they claim to be (files, dangling symlinks, loops, FIFOs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fakecuda import Sandbox, assert_complete, by_id, run_doctor_json, statuses, survivors

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def _no_leftovers(tmp_path: Path):
    yield
    assert survivors(str(tmp_path)) == []


# -- host compiler -------------------------------------------------------------------------------


def _compiler_box(tmp_path: Path, header: bool) -> tuple[Sandbox, Path, dict[str, Path]]:
    """A 12.4 toolkit (its host_config.h, when present, allows gcc <= 12; NVIDIA's table says 13)
    and a compiler of a different version behind every variable that might choose one."""
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.4", "12.4.131", gcc_max=12 if header else None)
    if not header:
        assert not (tk / "include" / "crt" / "host_config.h").exists()
    c = {
        "NVCC_CCBIN": box.compiler("g++", "gcc", "11.4.0", where=tmp_path / "nvccbin"),
        "CUDAHOSTCXX": box.compiler("g++", "gcc", "13.2.0", where=tmp_path / "cmake"),
        "CXX": box.compiler("g++", "gcc", "14.1.0", where=tmp_path / "cxx"),
        "CC": box.compiler("gcc", "gcc", "12.3.0", where=tmp_path / "cc"),
        "PREPEND": box.compiler("g++", "gcc", "13.2.0", where=tmp_path / "prepend"),
        "APPEND": box.compiler("gcc", "gcc", "13.2.0", where=tmp_path / "append"),
        "DIR": box.compiler("gcc", "gcc", "12.3.0", where=tmp_path / "ccbindir"),
        "gcc": box.compiler("gcc", "gcc", "15.1.0"),  # nvcc's default: `gcc` on PATH
    }
    box.compiler("g++", "gcc", "16.1.0", where=tmp_path / "ccbindir")  # nvcc runs DIR/gcc
    box.compiler("c++", "gcc", "9.5.0")  # nvcc never runs `c++` by itself
    # Older compilers the fix can name: g++-13 is too new for the header, fine for the table.
    for name, version in (("g++-12", "12.3.0"), ("gcc-12", "12.3.0"), ("g++-13", "13.2.0")):
        box.compiler(name, "gcc", version)
    return box, tk, c


# (variables set, which compiler nvcc runs, the variable reported, its version)
COMPILER_CASES = [
    (("NVCC_CCBIN", "CUDAHOSTCXX", "CXX"), "NVCC_CCBIN", "NVCC_CCBIN", "11.4.0"),
    (("CUDAHOSTCXX", "CXX"), "gcc", "gcc", "15.1.0"),  # neither is read by nvcc or torch
    (("CC", "NVCC_CCBIN", "CUDAHOSTCXX", "CXX"), "CC", "CC", "12.3.0"),  # torch: -ccbin $CC
    (("NVCC_CCBIN", "PREPEND"), "PREPEND", "NVCC_PREPEND_FLAGS", "13.2.0"),
    (("CC", "APPEND"), "APPEND", "NVCC_APPEND_FLAGS", "13.2.0"),  # last -ccbin wins
    (("DIR",), "DIR", "NVCC_CCBIN", "12.3.0"),  # NVCC_CCBIN=folder: nvcc runs folder/gcc
]


def _compiler_env(box: Sandbox, tk: Path, c: dict[str, Path], names: tuple[str, ...]) -> dict:
    values: dict[str, str] = {}
    for name in names:
        if name == "PREPEND":
            values["NVCC_PREPEND_FLAGS"] = f"-O2 -ccbin {c['PREPEND']}"
        elif name == "APPEND":
            values["NVCC_APPEND_FLAGS"] = f"--compiler-bindir={c['APPEND'].parent} -lineinfo"
        elif name == "DIR":
            values["NVCC_CCBIN"] = str(c["DIR"].parent)
        else:
            values[name] = str(c[name])
    return box.env(PATH=[tk / "bin"], CUDA_HOME=tk, extra=values)


@pytest.mark.parametrize("header", [True, False], ids=["host_config.h", "table"])
@pytest.mark.parametrize(("names", "picked", "source", "version"), COMPILER_CASES)
def test_host_compiler_is_the_one_nvcc_runs(
    tmp_path: Path,
    header: bool,
    names: tuple[str, ...],
    picked: str,
    source: str,
    version: str,
) -> None:
    box, tk, c = _compiler_box(tmp_path, header)
    report, _ = run_doctor_json(_compiler_env(box, tk, c, names))
    assert_complete(report)
    hc = by_id(report)["host_compiler"]
    assert hc["data"]["path"] == str(c[picked]), hc
    assert hc["data"]["source"] == source and hc["data"]["version"] == version
    assert f"from {source})" in hc["detail"]
    limit = 12 if header else 13
    assert hc["data"]["max_major"] == limit
    if header:
        assert hc["data"]["limit_from"] == str(tk / "include" / "crt" / "host_config.h")
    else:
        assert hc["data"]["limit_from"] == "NVIDIA's support table for CUDA 12.4"
    major = int(version.split(".")[0])
    if major <= limit:
        assert hc["status"] == "ok" and f"accepts gcc <= {limit}" in hc["detail"], hc
        return
    assert hc["status"] == "fail", hc
    assert f"gcc <= {limit}" in hc["detail"] and "outside what nvcc 12.4 accepts" in hc["detail"]
    # The fix names the newest installed compiler inside the limit, C and C++ side by side.
    if header:
        want = f"NVCC_CCBIN={box.bin / 'g++-12'} CC={box.bin / 'gcc-12'} CXX={box.bin / 'g++-12'}"
    else:
        want = f"NVCC_CCBIN={box.bin / 'g++-13'} CC={box.bin / 'g++-13'} CXX={box.bin / 'g++-13'}"
    assert hc["fix"].endswith(f"export {want}"), hc["fix"]
    if source == "NVCC_APPEND_FLAGS":
        # Its -ccbin beats every variable: the flags are kept, without it, before the rest.
        assert hc["fix"].startswith("export NVCC_APPEND_FLAGS=-lineinfo && "), hc["fix"]


def test_host_compiler_without_an_older_one_says_what_to_install(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-11.8", "11.8.89", gcc_max=11)
    box.compiler("gcc", "gcc", "12.2.0")
    box.compiler("g++-13", "gcc", "13.1.0")  # installed, but newer still
    report, proc = run_doctor_json(box.env(PATH=[tk / "bin"], CUDA_HOME=tk))
    hc = by_id(report)["host_compiler"]
    assert hc["status"] == "fail" and proc.returncode == 1
    assert hc["fix"] == (
        "sudo apt-get install -y g++-11 && "
        "export NVCC_CCBIN=/usr/bin/g++-11 CC=/usr/bin/gcc-11 CXX=/usr/bin/g++-11"
    )


# -- CUDA_HOME ------------------------------------------------------------------------------------


def test_cuda_home_from_cuda_path_and_empty_values(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    tk124 = box.toolkit("cuda-12.4", "12.4.131")
    tk126 = box.toolkit("cuda-12.6", "12.6.77")

    # CUDA_PATH alone: torch takes it, not the nvcc on PATH.
    report, _ = run_doctor_json(box.env(PATH=[tk126 / "bin"], CUDA_PATH=tk124))
    home = by_id(report)["cuda_home"]
    assert home["data"] == {
        "cuda_home": str(tk124),
        "from": "CUDA_PATH",
        "nvcc_version": "12.4.131",
    }
    assert home["status"] == "warn" and "torch builds with 12.4" in home["detail"]
    assert report["cuda_home"] == {"path": str(tk124), "from": "CUDA_PATH"}

    # An empty CUDA_HOME is skipped by torch's `or`: CUDA_PATH decides.
    report, _ = run_doctor_json(box.env(PATH=[tk124 / "bin"], CUDA_HOME="", CUDA_PATH=tk124))
    home = by_id(report)["cuda_home"]
    assert home["status"] == "ok" and home["data"]["from"] == "CUDA_PATH"

    # CUDA_HOME beats CUDA_PATH; both are listed as toolkits.
    report, _ = run_doctor_json(box.env(PATH=[tk124 / "bin"], CUDA_HOME=tk124, CUDA_PATH=tk126))
    assert by_id(report)["cuda_home"]["data"]["from"] == "CUDA_HOME"
    found = {t["root"]: t["found_by"] for t in report["toolkits"]}
    assert "CUDA_PATH" in found[str(tk126)] and "CUDA_HOME" in found[str(tk124)]

    # A CUDA_PATH that is set but empty comes back from torch's `or` as "" and stops the search:
    # torch then runs bin/nvcc relative to the build folder.
    report, _ = run_doctor_json(box.env(PATH=[tk124 / "bin"], CUDA_PATH=""))
    assert_complete(report)
    home = by_id(report)["cuda_home"]
    assert home["status"] == "warn"  # fail when torch has a CUDA build (below)
    assert home["data"] == {"cuda_home": "", "from": "CUDA_PATH"}
    assert "CUDA_PATH is set but empty" in home["detail"]
    assert home["fix"] == f"unset CUDA_PATH; export CUDA_HOME={tk124} PATH={tk124}/bin:$PATH"
    site = box.torch("2.4.0+cu124", cuda="12.4")
    report, proc = run_doctor_json(
        box.env(PATH=[tk124 / "bin"], CUDA_HOME="", CUDA_PATH="", PYTHONPATH=site)
    )
    assert by_id(report)["cuda_home"]["status"] == "fail" and proc.returncode == 1


def test_cuda_home_is_the_folder_above_the_nvcc_symlink_not_its_target(tmp_path: Path) -> None:
    """torch does not resolve `which nvcc`: a symlinked nvcc makes CUDA_HOME the link's folder."""
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.4", "12.4.131")
    (box.bin / "nvcc").symlink_to(tk / "bin" / "nvcc")
    report, _ = run_doctor_json(box.env())
    home = by_id(report)["cuda_home"]
    assert home["data"]["cuda_home"] == str(tmp_path) and home["data"]["from"] == "nvcc on PATH"
    assert home["status"] == "warn" and "has no include/cuda_runtime.h" in home["detail"]
    assert f"its nvcc leads to {tk}" in home["detail"]
    assert home["fix"] == f"export CUDA_HOME={tk} PATH={tk}/bin:$PATH"
    # The toolkit listing names the folder too, not only where its nvcc leads.
    assert by_id(report)["toolkits"]["detail"].endswith(
        f"PATH -> {tk}, CUDA_HOME ({tmp_path}) -> {tk}"
    )


def test_cuda_home_falls_back_to_usr_local_cuda(tmp_path: Path) -> None:
    if not os.path.exists("/usr/local/cuda"):
        pytest.skip("no /usr/local/cuda on this machine (the unit test covers the absent case)")
    report, _ = run_doctor_json(Sandbox(tmp_path).env())  # no CUDA_HOME/CUDA_PATH, no nvcc
    home = by_id(report)["cuda_home"]
    assert home["data"]["cuda_home"] == "/usr/local/cuda"
    assert home["data"]["from"] == "/usr/local/cuda"
    assert report["cuda_home"] == {"path": "/usr/local/cuda", "from": "/usr/local/cuda"}


# -- the ldconfig cache ----------------------------------------------------------------------------


def test_the_libcudart_the_ldconfig_cache_resolves(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.4", "12.4.131")
    old = box.toolkit("cuda-11.8", "11.8.89")
    cached = tk / "lib64" / "libcudart.so.12"
    box.ldconfig(
        {
            "libcudart.so.12": cached,
            "libcudart.so.11.0": old / "lib64" / "libcudart.so.11.0",
            "libcudart.so": tk / "lib64" / "libcudart.so",
            "libnccl.so.2": "/usr/lib/x86_64-linux-gnu/libnccl.so.2",
        }
    )
    env = box.env(PATH=[tk / "bin"], CUDA_HOME=tk)
    report, _ = run_doctor_json(env)
    ld = by_id(report)["ld_library_path"]
    assert ld["status"] == "ok"
    assert ld["detail"] == f"unset; the ldconfig cache resolves libcudart.so.12 to {cached}"
    assert ld["data"]["ldconfig"] == {
        "libcudart.so.12": [str(cached)],
        "libcudart.so.11.0": [str(old / "lib64" / "libcudart.so.11.0")],
        "libcudart.so": [str(tk / "lib64" / "libcudart.so")],
        "libnccl.so.2": ["/usr/lib/x86_64-linux-gnu/libnccl.so.2"],
    }
    # LD_LIBRARY_PATH without a libcudart.so.12: the loader still falls back to the cache.
    other = box.lib_dir("plain-libs")
    report, _ = run_doctor_json({**env, "LD_LIBRARY_PATH": str(other)})
    ld = by_id(report)["ld_library_path"]
    assert ld["status"] == "ok" and ld["detail"].endswith(
        f"; the ldconfig cache resolves libcudart.so.12 to {cached}"
    )
    # LD_LIBRARY_PATH that provides it: the cache is not the answer, so not named.
    report, _ = run_doctor_json({**env, "LD_LIBRARY_PATH": str(tk / "lib64")})
    ld = by_id(report)["ld_library_path"]
    assert ld["status"] == "ok" and "ldconfig" not in ld["detail"]


def test_a_broken_ldconfig_costs_nothing_but_its_answer(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.4", "12.4.131")
    box.script(box.bin / "ldconfig", f"/bin/sleep {box.marker}\n")
    report, _ = run_doctor_json(box.env(PATH=[tk / "bin"], CUDA_HOME=tk), timeout=30)
    assert_complete(report)
    ld = by_id(report)["ld_library_path"]
    assert ld["status"] == "ok" and ld["detail"] == "unset" and ld["data"]["ldconfig"] == {}
    assert "did not answer within" in ld["data"]["ldconfig_problem"]
    assert box.leftovers() == []


# -- which toolkit each variable selects ---------------------------------------------------------


@pytest.mark.parametrize("layout", ["lib64", "targets"])
def test_path_cuda_home_and_ld_library_path_select_three_toolkits(
    tmp_path: Path, layout: str
) -> None:
    box = Sandbox(tmp_path)
    tk124 = box.toolkit("cuda-12.4", "12.4.131")
    tk126 = box.toolkit("cuda-12.6", "12.6.77")
    tk121 = box.toolkit("cuda-12.1", "12.1.105")  # named by LD_LIBRARY_PATH only
    ld_dir = tk121 / "lib64"
    if layout == "targets":
        # A real toolkit's layout: lib64 -> targets/x86_64-linux/lib, and LD_LIBRARY_PATH
        # naming the real folder.
        real = tk121 / "targets" / "x86_64-linux" / "lib"
        real.parent.mkdir(parents=True)
        ld_dir.rename(real)
        ld_dir.symlink_to(Path("targets") / "x86_64-linux" / "lib")
        ld_dir = real
    env = box.env(PATH=[tk126 / "bin"], CUDA_HOME=tk124, LD_LIBRARY_PATH=ld_dir)
    report, _ = run_doctor_json(env)
    assert_complete(report)
    tks = by_id(report)["toolkits"]
    assert tks["status"] == "warn"
    assert tks["data"]["selected"] == {
        "PATH": str(tk126),
        "CUDA_HOME": str(tk124),
        "LD_LIBRARY_PATH": str(tk121),
    }
    assert "they disagree: PATH 12.6, CUDA_HOME 12.4, LD_LIBRARY_PATH 12.1" in tks["detail"]
    assert tks["fix"] == (
        f"export CUDA_HOME={tk124} PATH={tk124}/bin:$PATH"
        f" LD_LIBRARY_PATH={tk124}/lib64:$LD_LIBRARY_PATH"
    )
    found = {t["root"]: t for t in report["toolkits"]}
    assert found[str(tk121)]["found_by"] == ["LD_LIBRARY_PATH"]
    assert found[str(tk121)]["version"] == "12.1.105"
    # The same libcudart.so.12 from 12.1 wins over the 12.4 toolkit's at run time.
    ld = by_id(report)["ld_library_path"]
    assert ld["status"] == "warn" and f"{ld_dir}/libcudart.so.12 shadows" in ld["detail"]

    # All three on one toolkit: ok, and the listing says what each selects.
    env = box.env(PATH=[tk124 / "bin"], CUDA_HOME=tk124, LD_LIBRARY_PATH=tk124 / "lib64")
    report, _ = run_doctor_json(env)
    tks = by_id(report)["toolkits"]
    assert tks["status"] == "ok"
    assert tks["data"]["selected"] == dict.fromkeys(
        ("PATH", "CUDA_HOME", "LD_LIBRARY_PATH"), str(tk124)
    )
    assert tks["detail"].endswith(
        f"PATH -> {tk124}, CUDA_HOME -> {tk124}, LD_LIBRARY_PATH -> {tk124}"
    )


# -- folders that are not what they claim to be ----------------------------------------------------


def _not_a_folder(tmp_path: Path, kind: str, name: str) -> Path:
    path = tmp_path / name
    if kind == "file":
        path.write_text("not a toolkit\n")
    elif kind == "dangling":
        path.symlink_to(tmp_path / "gone")
    elif kind == "loop":
        path.symlink_to(tmp_path / f"{path.name}-back")
        (tmp_path / f"{path.name}-back").symlink_to(path)
    elif kind == "fifo":
        os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("file", "is a file, not a folder"),
        ("dangling", "is a dangling symlink"),
        ("loop", "is a symlink loop"),
        ("fifo", "is a named pipe (FIFO), not a folder"),
    ],
)
def test_files_links_loops_and_fifos_where_folders_belong(
    tmp_path: Path, kind: str, why: str
) -> None:
    """Root reads everything, so chmod can't make a folder unreadable in these tests; these do
    fail for root. The report is complete, names the reason, and the process ends promptly: a
    FIFO named version.json or host_config.h would block a naive open() forever."""
    box = Sandbox(tmp_path)
    # The toolkit on PATH: FIFOs where its version.json and host_config.h belong, a library
    # folder holding a link to itself, and nvcc that answers.
    tk = box.toolkit("cuda-12.4", "12.4.131", version_file=None, headers=True)
    (tk / "include" / "crt").mkdir(parents=True)
    os.mkfifo(tk / "version.json")
    os.mkfifo(tk / "include" / "crt" / "host_config.h")
    (tk / "lib64" / "self").symlink_to(".")
    box.compiler("gcc", "gcc", "13.2.0")
    bad = _not_a_folder(tmp_path, kind, "cuda-home")
    dangling = _not_a_folder(tmp_path, "dangling", "dangling")
    loop = _not_a_folder(tmp_path, "loop", "loop")
    a_file = tmp_path / "libfoo.so"
    a_file.write_bytes(b"\x7fELF")
    # A torch install whose version.py is a FIFO: the probe refuses it instead of hanging.
    site = box.torch("2.4.0+cu124", cuda="12.4")
    (site / "torch" / "version.py").unlink()
    os.mkfifo(site / "torch" / "version.py")
    env = box.env(
        PATH=[tk / "bin", bad, dangling],
        CUDA_HOME=bad,
        CONDA_PREFIX=loop,
        LD_LIBRARY_PATH=f"{dangling}:{loop}:{a_file}:{tk / 'lib64'}",
        PYTHONPATH=site,
    )
    report, proc = run_doctor_json(env, timeout=20)
    assert_complete(report)
    st = statuses(report)
    checks = by_id(report)
    assert st["cuda_home"] == "fail"
    assert checks["cuda_home"]["detail"].startswith(f"CUDA_HOME={bad}: {bad} {why}")
    assert checks["cuda_home"]["fix"] == f"export CUDA_HOME={tk} PATH={tk}/bin:$PATH"
    broken = next(t for t in report["toolkits"] if t["root"] == str(bad))
    assert broken["problem"].startswith(f"{bad} {why}")
    # The FIFO version.json was skipped: nvcc told the version; the FIFO header was skipped:
    # the table decided the compiler's limit.
    good = next(t for t in report["toolkits"] if t["root"] == str(tk))
    assert good["version"] == "12.4.131" and good["version_from"] == "nvcc"
    assert good["host_config"] is None
    assert st["nvcc"] == "ok"
    hc = checks["host_compiler"]
    assert hc["status"] == "ok" and hc["data"]["limit_from"].startswith("NVIDIA's support table")
    ld = checks["ld_library_path"]
    assert ld["status"] == "warn"
    assert f"{dangling} (is a dangling symlink (to {tmp_path / 'gone'}" in ld["detail"]
    assert f"{loop} (is a symlink loop" in ld["detail"]
    assert f"not a folder: {a_file}" in ld["detail"]
    assert ld["fix"] == f"export LD_LIBRARY_PATH={tk / 'lib64'}"
    assert st["torch"] == "error" and "version.py: not a regular file" in checks["torch"]["detail"]
    assert proc.returncode == 1
