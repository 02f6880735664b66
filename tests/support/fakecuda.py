"""Scenario sandboxes for `xl doctor`: fake CUDA toolkits, compilers, torch installs and tools.

Everything lives under one temporary folder and is selected only through the environment the
test passes to the `xl doctor` process, so the machine itself is never touched::

    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.4", "12.4.131", gcc_max=13)
    box.compiler("c++", "gcc", "12.3.0")
    site = box.torch("2.4.0+cu124", cuda="12.4", nccl="2.20.5")
    env = box.env(PATH=[tk / "bin"], CUDA_HOME=tk, PYTHONPATH=site)
    report = run_doctor_json(env)

Fake tools are /bin/sh scripts that only use shell builtins, so a PATH holding nothing but the
sandbox's folders still runs them. The nvcc outputs follow the real `nvcc --version` format.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

# (Built on ..., build id) for the nvcc versions the tests use; the format is nvcc's own.
NVCC_BUILDS: dict[str, tuple[str, str]] = {
    "11.4.48": ("Wed_Jun__2_19:15:15_PDT_2021", "30033411"),
    "11.8.89": ("Wed_Sep_21_10:33:58_PDT_2022", "31833905"),
    "12.1.105": ("Mon_Apr__3_17:16:06_PDT_2023", "32688072"),
    "12.4.131": ("Thu_Mar_28_02:18:24_PDT_2024", "34097967"),
    "12.6.77": ("Wed_Aug_14_10:10:22_PDT_2024", "34714021"),
    "12.8.93": ("Fri_Feb_21_20:23:50_PST_2025", "35583870"),
    "13.0.88": ("Wed_Aug_20_01:58:59_PM_PDT_2025", "36424714"),
}


def nvcc_output(full: str) -> str:
    major, minor = full.split(".")[:2]
    built, build = NVCC_BUILDS.get(full, ("Mon_Jan__1_00:00:00_PST_2024", "00000000"))
    return (
        "nvcc: NVIDIA (R) Cuda compiler driver\n"
        "Copyright (c) 2005-2025 NVIDIA Corporation\n"
        f"Built on {built}\n"
        f"Cuda compilation tools, release {major}.{minor}, V{full}\n"
        f"Build cuda_{major}.{minor}.r{major}.{minor}/compiler.{build}_0\n"
    )


def host_config(gcc_max: int, clang_max: int) -> str:
    """The part of include/crt/host_config.h that carries the compiler limits (real layout)."""
    return (
        "#if defined(__GNUC__)\n\n"
        f"#if __GNUC__ > {gcc_max}\n\n"
        f"#error -- unsupported GNU version! gcc versions later than {gcc_max} are not supported! "
        "The nvcc flag '-allow-unsupported-compiler' can be used to override this version check\n\n"
        f"#endif /* __GNUC__ > {gcc_max} */\n\n"
        "#if defined(__clang__) && !defined(__ibmxl_vrm__) && !defined(__ICC) && "
        "!defined(__HORIZON__)\n\n"
        f"#if (__clang_major__ >= {clang_max + 1}) || (__clang_major__ < 3) || ((__clang_major__ "
        "== 3) &&  (__clang_minor__ < 3))\n"
        f"#error -- unsupported clang version! clang version must be less than {clang_max + 1} "
        "and greater than 3.2 .\n"
        "#endif\n\n#endif\n\n#endif /* __GNUC__ */\n"
    )


# soname stem -> the pip package that ships it (nvidia-<package>-cu12)
PIP_PACKAGES = {
    "cudart": "cuda_runtime",
    "nvJitLink": "nvjitlink",
    "cublas": "cublas",
    "cublasLt": "cublas",
    "cusparse": "cusparse",
}


def _sh(lines: str) -> str:
    return "#!/bin/sh\n" + lines


def _heredoc(text: str) -> str:
    return (
        f"cat_() {{ while IFS= read -r l; do printf '%s\\n' \"$l\"; done; }}\ncat_ "
        f"<<'XLEOF'\n{text}XLEOF\n"
    )


class Sandbox:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.bin = self.root / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        # A number no other process on the machine has in its command line: the hang marker.
        self.marker = f"{29 + random.random():.6f}"

    # -- files -----------------------------------------------------------------------------------

    def script(self, path: Path, body: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_sh(body))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return path

    def nvcc_script(self, path: Path, full: str | None, behaviour: str = "ok") -> Path:
        if behaviour == "hang":
            # The shell waits on a child that holds the pipe: only a group kill ends both.
            return self.script(path, f"/bin/sleep {self.marker}\n")
        if behaviour == "garbage":
            return self.script(path, "printf '\\377\\376garbage \\200\\201 no version here\\n'\n")
        if behaviour == "fail":
            return self.script(path, "printf 'nvcc fatal : broken install\\n' >&2\nexit 3\n")
        assert full is not None
        return self.script(path, _heredoc(nvcc_output(full)))

    def toolkit(
        self,
        name: str,
        full: str | None,
        *,
        version_file: str | None = "json",  # json | txt | None
        nvcc: str | None = "ok",  # ok | hang | garbage | fail | None (no bin/nvcc)
        gcc_max: int | None = None,
        clang_max: int | None = None,
        cudart: int | None = -1,  # -1: the toolkit's major; None: no libcudart
        headers: bool | str = True,  # True | False | "conda"
    ) -> Path:
        root = self.root / name
        (root / "bin").mkdir(parents=True, exist_ok=True)
        if full and version_file == "json":
            (root / "version.json").write_text(
                json.dumps(
                    {"cuda": {"name": "CUDA SDK", "version": full}, "cuda_nvcc": {"version": full}}
                )
            )
        elif full and version_file == "txt":
            (root / "version.txt").write_text(f"CUDA Version {full}\n")
        if nvcc is not None:
            self.nvcc_script(root / "bin" / "nvcc", full, nvcc)
        if gcc_max is not None:
            inc = root / "include" / "crt"
            inc.mkdir(parents=True, exist_ok=True)
            (inc / "host_config.h").write_text(host_config(gcc_max, clang_max or 17))
        if headers == "conda":
            # conda-forge's layout: the headers only under targets/x86_64-linux/include.
            inc = root / "targets" / "x86_64-linux" / "include"
            inc.mkdir(parents=True, exist_ok=True)
            (inc / "cuda_runtime.h").write_text("/* fake */\n")
            (root / "include").mkdir(exist_ok=True)
        elif headers:
            (root / "include").mkdir(exist_ok=True)
            (root / "include" / "cuda_runtime.h").write_text("/* fake */\n")
        if cudart is not None:
            major = int(full.split(".")[0]) if cudart == -1 and full else cudart
            lib = root / "lib64"
            lib.mkdir(exist_ok=True)
            (lib / f"libcudart.so.{major}").write_bytes(b"\x7fELF fake")
            (lib / "libcudart.so").write_bytes(b"\x7fELF fake")
        return root

    def compiler(
        self,
        name: str,
        kind: str,
        version: str,
        *,
        where: Path | None = None,
        behaviour: str = "ok",
    ) -> Path:
        """A compiler answering --version and -dumpfullversion the way gcc/clang do."""
        path = (where or self.bin) / name
        if behaviour == "hang":
            return self.script(path, f"/bin/sleep {self.marker}\n")
        if behaviour == "garbage":
            return self.script(path, "printf '\\001\\002\\377 what\\n'\n")
        if kind == "gcc":
            banner = (
                f"{name} (GCC) {version}\nCopyright (C) 2023 Free Software Foundation, Inc.\n"
                "This is free software; see the source for copying conditions.\n"
            )
        else:
            banner = f"clang version {version}\nTarget: x86_64-pc-linux-gnu\nThread model: posix\n"
        body = (
            f"if [ \"$1\" = -dumpfullversion ]; then printf '%s\\n' '{version}'; exit 0; fi\n"
            'if [ "$1" = --version ]; then\n' + _heredoc(banner) + "exit 0\nfi\nexit 1\n"
        )
        return self.script(path, body)

    def tool(self, name: str, output: str) -> Path:
        return self.script(self.bin / name, _heredoc(output))

    def torch(
        self,
        version: str,
        *,
        cuda: str | None,
        nccl: str | None = None,
        pip_nvcc: str | None = None,
        name: str = "site",
        pip_libs: Mapping[str, str] | None = None,
        pip_ptxas: str | None = None,
        hip: str | None = None,
        nccl_wheels: Mapping[str, str] | None = None,
        requires_nccl: str | None = None,
        requires: Mapping[str, str] | None = None,
        wheels: Mapping[str, str] | None = None,
    ) -> Path:
        """A torch install that explodes if imported: the doctor must read it, not import it.
        `hip`: a ROCm build's HIP version; `nccl_wheels`: more nvidia-nccl-cuN wheels
        ({"cu11": "2.21.5"}); `requires_nccl`: the NCCL pin in torch's METADATA
        ("nvidia-nccl-cu12==2.21.5"); `requires`: more pins ({"nvidia-cudnn-cu12": "9.10.2.21"});
        `wheels`: nvidia-* wheels installed with their library in nvidia/<name>/lib
        ({"nvidia-cudnn-cu12": "9.10.2.21"}: nvidia/cudnn/lib/libcudnn.so.9, no version in its
        name, as the real wheel ships it)."""
        site = self.root / name
        pkg = site / "torch"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('xl doctor imported torch')\n")
        (pkg / "version.py").write_text(
            "from typing import Optional\n\n"
            "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n"
            f"__version__ = {version!r}\n"
            "debug = False\n"
            f"cuda: Optional[str] = {cuda!r}\n"
            "git_version = 'cf30153c4c131c8164ee7798e5022d810682e2cb'\n"
            f"hip: Optional[str] = {hip!r}\n"
        )
        dist = site / f"torch-{version}.dist-info"
        dist.mkdir(exist_ok=True)
        pins = [requires_nccl] if requires_nccl else []
        pins += [f"{dist}=={ver}" for dist, ver in (requires or {}).items()]
        requires = "".join(
            f'Requires-Dist: {pin}; platform_system == "Linux" and platform_machine == "x86_64"\n'
            for pin in pins
        )
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n{requires}"
        )
        for tag, ver in (nccl_wheels or {}).items():
            # nvidia-nccl-cu11 / -cu12 / -cu13 all install nvidia/nccl/lib/libnccl.so.2.
            d = site / f"nvidia_nccl_{tag}-{ver}.dist-info"
            d.mkdir(exist_ok=True)
            (d / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: nvidia-nccl-{tag}\nVersion: {ver}\n"
            )
            lib = site / "nvidia" / "nccl" / "lib"
            lib.mkdir(parents=True, exist_ok=True)
            (lib / "libnccl.so.2").write_bytes(b"\x7fELF fake")
        for dist, ver in (wheels or {}).items():
            stem = re.sub(r"-cu\d+$", "", dist)[len("nvidia-") :]
            d = site / f"{dist.replace('-', '_')}-{ver}.dist-info"
            d.mkdir(exist_ok=True)
            (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {ver}\n")
            lib = site / "nvidia" / stem / "lib"
            lib.mkdir(parents=True, exist_ok=True)
            so = {"nccl": "libnccl.so.2"}.get(stem, f"lib{stem}.so.{ver.split('.')[0]}")
            (lib / so).write_bytes(b"\x7fELF fake")
        if nccl:
            d = site / f"nvidia_nccl_cu{(cuda or '12').split('.')[0]}-{nccl}.dist-info"
            d.mkdir(exist_ok=True)
            (d / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: nvidia-nccl\nVersion: {nccl}\n"
            )
        if pip_nvcc:
            # The wheels' real layouts: nvidia-cuda-nvcc-cu12 -> nvidia/cuda_nvcc,
            # nvidia-cuda-nvcc 13.x -> nvidia/cu13.
            major = pip_nvcc.split(".")[0]
            if int(major) >= 13:
                d, sub = site / f"nvidia_cuda_nvcc-{pip_nvcc}.dist-info", f"cu{major}"
            else:
                d, sub = site / f"nvidia_cuda_nvcc_cu{major}-{pip_nvcc}.dist-info", "cuda_nvcc"
            d.mkdir(exist_ok=True)
            self.nvcc_script(site / "nvidia" / sub / "bin" / "nvcc", pip_nvcc)
        if pip_ptxas:
            # nvidia-cuda-nvcc-cu12 as Triton pulls it in: ptxas, no nvcc.
            major = pip_ptxas.split(".")[0]
            (site / f"nvidia_cuda_nvcc_cu{major}-{pip_ptxas}.dist-info").mkdir(exist_ok=True)
            self.script(site / "nvidia" / "cuda_nvcc" / "bin" / "ptxas", "exit 0\n")
        for soname, ver in (pip_libs or {}).items():
            # The CUDA libraries a pip torch loads: nvidia/<package>/lib for CUDA 12 wheels
            # (nvidia_<package>_cu12-<v>.dist-info), nvidia/cu13/lib for 13 (nvidia_<package>-<v>).
            package = PIP_PACKAGES[soname.split(".so")[0][3:]]
            major = ver.split(".")[0]
            if int(major) >= 13:
                lib, wheel = site / "nvidia" / f"cu{major}" / "lib", f"nvidia_{package}-{ver}"
            else:
                lib, wheel = site / "nvidia" / package / "lib", f"nvidia_{package}_cu{major}-{ver}"
            lib.mkdir(parents=True, exist_ok=True)
            (lib / soname).write_bytes(b"\x7fELF fake")
            (site / f"{wheel}.dist-info").mkdir(exist_ok=True)
        return site

    def ldconfig(self, libs: Mapping[str, str | Path]) -> Path:
        """A fake `ldconfig` on the sandbox's PATH whose `-p` prints this cache (soname -> path)
        in the real format (glibc 2.36), with unrelated libraries around it."""
        lines = [f"{len(libs) + 2} libs found in cache `/etc/ld.so.cache'"]
        lines.append("\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1")
        lines += [f"\t{name} (libc6,x86-64) => {path}" for name, path in libs.items()]
        lines.append(
            "\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6"
        )
        lines.append(
            "Cache generated by: ldconfig (Debian GLIBC 2.36-9+deb12u14) stable release version "
            "2.36"
        )
        return self.tool("ldconfig", "\n".join(lines) + "\n")

    def lib_dir(
        self,
        name: str,
        *,
        cudart: Sequence[int] = (),
        nccl: bool = False,
        libs: Mapping[str, str] | None = None,
        libcuda: str | None = None,
    ) -> Path:
        """A library folder; `libs` maps sonames to the full version their real file carries
        (libnvJitLink.so.12 -> libnvJitLink.so.12.1.105), as a toolkit's lib64 holds them."""
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        for soname, full in (libs or {}).items():
            # The real layout: the soname a link to the versioned file.
            (d / f"{soname}.{full.split('.', 1)[1]}").write_bytes(b"\x7fELF fake")
            (d / soname).symlink_to(f"{soname}.{full.split('.', 1)[1]}")
        for major in cudart:
            (d / f"libcudart.so.{major}").write_bytes(b"\x7fELF fake")
        if nccl:
            (d / "libnccl.so.2").write_bytes(b"\x7fELF fake")
        if libcuda:
            # A user-space driver as cuda-compat ships it: libcuda.so.1 -> libcuda.so.<driver>.
            (d / f"libcuda.so.{libcuda}").write_bytes(b"\x7fELF fake")
            (d / "libcuda.so.1").symlink_to(f"libcuda.so.{libcuda}")
        return d

    def libcuda(self, name: str = "libcuda", code: int = 0, version: str | None = None) -> Path:
        """A folder holding a libcuda.so.1 whose cuInit returns `code` (0: CUDA starts; 802: the
        NVSwitch fabric is not ready; 803: libcuda and the kernel module disagree), built with
        gcc: what the doctor's cuInit probe loads through LD_LIBRARY_PATH. `version`: the file
        is libcuda.so.<version> with libcuda.so.1 a link to it, as a driver (or cuda-compat)
        installs it."""
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        src = d / "fakecuda.c"
        src.write_text(f"int cuInit(unsigned int flags) {{ (void)flags; return {int(code)}; }}\n")
        out = d / (f"libcuda.so.{version}" if version else "libcuda.so.1")
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-o", str(out), str(src)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        if version:
            (d / "libcuda.so.1").symlink_to(out.name)
        return d

    # -- running ---------------------------------------------------------------------------------

    def env(
        self,
        *,
        PATH: Sequence[Path | str] = (),
        extra: Mapping[str, str] | None = None,
        **values: Any,
    ) -> dict[str, str]:
        """A clean environment: only what the scenario sets, plus HOME and a tidy locale."""
        env = {
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
            "PATH": os.pathsep.join([*(str(p) for p in PATH), str(self.bin)]),
        }
        for key, value in values.items():
            if value is not None:
                env[key] = str(value)
        env.update(extra or {})
        return env

    def leftovers(self) -> list[psutil.Process]:
        """Processes still running one of this sandbox's hanging tools."""
        return survivors(self.marker)


def survivors(needle: str, grace: float = 5.0) -> list[psutil.Process]:
    """Live processes whose command line holds `needle`. A process already sent SIGKILL may take
    a moment to be reaped on a busy machine, so each gets `grace` seconds to disappear first."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid != os.getpid() and needle in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    _, alive = psutil.wait_procs(found, timeout=grace) if found else ([], [])
    out = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def run_doctor(
    env: Mapping[str, str] | Mapping[bytes, bytes], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """The real `xl doctor` as a new process."""
    return subprocess.run(
        [sys.executable, "-m", "xl", "doctor", *args],
        env=env,  # type: ignore[arg-type]
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
    )


def run_doctor_json(
    env: Mapping[str, str] | Mapping[bytes, bytes], *args: str, timeout: float = 60
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    proc = run_doctor(env, "--json", *args, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    try:
        data = json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(
            f"not JSON (exit {proc.returncode}): {proc.stdout[:400]!r} {proc.stderr[:400]!r}"
        ) from exc
    # Every fix any test sees: a published wheel, a path that exists, and all of them
    # pulling one way: a fix that broke another check was printed before this was asserted.
    assert_fixes_sound(data)
    assert_one_direction(data)
    assert_fixes_are_commands(data)
    return data, proc


ALL_IDS = [
    "driver",
    "gpus",
    "cuda_home",
    "nvcc",
    "toolkits",
    "torch",
    "torch_cuda_match",
    "driver_cuda",
    "host_compiler",
    "ld_library_path",
    "cuda_visible_devices",
    "cuda_device_order",
    "shm",
    "nccl",
    "ninja",
    "arch_list",
    "cuda_libraries",
    "cuda_init",
    "cgroup",
]


def assert_complete(report: dict[str, Any]) -> None:
    """The report always has every check, each with the contract's fields."""
    assert [c["id"] for c in report["checks"]] == ALL_IDS
    for c in report["checks"]:
        assert c["status"] in ("ok", "warn", "fail", "skip", "error"), c
        assert c["title"] and c["detail"], c
        assert "\n" not in c["detail"], c
        if c["status"] in ("warn", "fail"):
            assert c["fix"], c
    order = ["ok", "skip", "warn", "error", "fail"]
    assert report["status"] == max((c["status"] for c in report["checks"]), key=order.index)


def by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in report["checks"]}


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in report["checks"]}


# -- fixes: each one a real published wheel or a real path, and applying it breaks nothing -------

_PIP_FIX = re.compile(
    r"(\S+) -m pip install --force-reinstall torch(?:==(\S+))? "
    r"--index-url https://download\.pytorch\.org/whl/(cu\d+)"
)
_ASSIGN = re.compile(r"([A-Z_]+)=([^\s)]+)")


def fix_command(fix: str) -> str:
    """The command of a fix: up to the first '; ' or ' (' (the rest is an alternative)."""
    return re.split(r"; | \(|, or ", fix, maxsplit=1)[0].strip()


def assert_fixes_sound(report: dict[str, Any]) -> None:
    """Every torch wheel a fix names was published, and every path it exports exists."""
    from xl.doctor.wheels import PUBLISHED, TAG_CUDA  # noqa: PLC0415 - tests only

    for c in report["checks"]:
        for m in _PIP_FIX.finditer(c["fix"]):
            assert m.group(3) in TAG_CUDA, c
            if m.group(2):
                assert (m.group(2), m.group(3)) in PUBLISHED, f"unpublished wheel in {c}"
        cmd = fix_command(c["fix"])
        if cmd.startswith("export "):  # not "install gcc 13 and export ..."
            for var, value in _ASSIGN.findall(cmd):
                if var in ("CUDA_HOME", "NVCC_CCBIN", "CC", "CXX"):
                    assert os.path.exists(value), f"{var}={value} does not exist: {c}"


_TOOLKIT_IN_FIX = re.compile(r"\bCUDA_HOME=(\S+)|\bPATH=([^\s:$]+)/bin:")


# The programs a doctor fix may start: the first word of each command in it (after `sudo` and
# VAR=value). A fix is pasted into a shell as it is printed, so prose in it ("install ...",
# "check ...", "see ...") is a command that fails, and a note in parentheses stops bash at `(`.
FIX_PROGRAMS = frozenset(
    {
        "apt-get", "chmod", "conda", "dkms", "dmesg", "dnf", "docker", "dpkg", "export", "grep",
        "journalctl", "kill", "ldconfig", "modprobe", "mokutil", "mount", "nvidia-ctk",
        "nvidia-smi", "podman", "python", "python3", "reboot", "rm", "rmmod", "sed", "sh",
        "systemctl", "ubuntu-drivers", "unset", "usermod", "wget", "wsl.exe", "xl",
    }
)  # fmt: skip
_REDIRECTS = frozenset({">", ">>", "<", "2>", "&>"})


def fix_problem(fix: str) -> str | None:
    """Why this fix is not a command a shell accepts pasted as it is, or None when it is one:
    bash's own syntax check (`bash -n`), no backticks or parentheses (a quoted command or a
    note), and every command in it one of FIX_PROGRAMS or a path (an interpreter's)."""
    if not fix:
        return None
    if "`" in fix:
        return "backticks: a command quoted in prose, which the shell would run"
    run = subprocess.run(
        ["bash", "-n", "-c", fix], capture_output=True, text=True, timeout=30, check=False
    )
    if run.returncode or run.stderr.strip():
        return f"bash -n: {run.stderr.strip() or run.returncode}"
    lex = shlex.shlex(fix, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    start, skip_next = True, False
    for tok in lex:
        if skip_next:
            skip_next = False
            continue
        if tok in ("&&", "||", ";", "|"):
            start = True
            continue
        if tok in ("(", ")"):
            return "parentheses: a note belongs in the detail"
        if tok in _REDIRECTS:
            skip_next = True
            continue
        if not start:
            continue
        if re.fullmatch(r"[A-Za-z_]\w*=.*", tok) or tok == "sudo" or tok.startswith("-"):
            continue  # an assignment before the command, sudo and its options
        if tok not in FIX_PROGRAMS and not tok.startswith("/"):
            return f"{tok!r} is not a program a fix runs (prose?)"
        start = False
    return None


def assert_fixes_are_commands(report: dict[str, Any]) -> None:
    """Every fix in the report is a command a shell takes pasted as it is (fix_problem)."""
    for c in report["checks"]:
        why = fix_problem(c["fix"] or "")
        assert why is None, f"{c['id']}'s fix is not a command ({why}): {c['fix']!r}"


def assert_one_direction(report: dict[str, Any]) -> None:
    """No two fixes in one report contradict: every toolkit they point CUDA_HOME or PATH at is
    the same one, every torch wheel they install comes from the same index, and every
    TORCH_CUDA_ARCH_LIST or LD_LIBRARY_PATH they set is the same value."""
    toolkits: dict[str, str] = {}
    wheels: dict[str, str] = {}
    arch: dict[str, str] = {}
    ld: dict[str, str] = {}
    for c in report["checks"]:
        fix = c["fix"] or ""
        for value in re.findall(r"\bexport LD_LIBRARY_PATH=(\S*)|\b(unset LD_LIBRARY_PATH)\b", fix):
            ld.setdefault(value[0] or value[1], c["id"])
        for home, path in _TOOLKIT_IN_FIX.findall(fix):
            # PATH=X/bin names a toolkit only when X/bin holds an nvcc (not ninja's folder, say).
            if home or os.path.isfile(os.path.join(path, "bin", "nvcc")):
                toolkits.setdefault(os.path.realpath(home or path), c["id"])
        for m in _PIP_FIX.finditer(fix):
            wheels.setdefault(m.group(3), c["id"])
        for value in re.findall(r'TORCH_CUDA_ARCH_LIST="([^"]*)"', fix):
            arch.setdefault(value, c["id"])
    assert len(toolkits) <= 1, f"fixes point at different toolkits: {toolkits}"
    assert len(wheels) <= 1, f"fixes install torch from different indexes: {wheels}"
    assert len(arch) <= 1, f"fixes set different TORCH_CUDA_ARCH_LIST values: {arch}"
    assert len(ld) <= 1, f"fixes set different LD_LIBRARY_PATH values: {ld}"


def apply_fix(box: Sandbox, env: Mapping[str, str], fix: str) -> dict[str, str]:
    """The environment after a person ran the fix, each of its commands in turn: exports and
    unsets applied (with $VAR and ${VAR:+:$VAR} expanded), a pip install of torch replaced by that
    wheel, faked."""
    from xl.doctor.wheels import NEWEST_KNOWN, TAG_CUDA  # noqa: PLC0415 - tests only

    out = dict(env)
    for cmd in re.split(r"; | && ", fix):
        cmd = cmd.strip()
        m = _PIP_FIX.search(cmd)
        if m:
            version, tag = m.group(2) or NEWEST_KNOWN, m.group(3)
            site = box.torch(f"{version}+{tag}", cuda=TAG_CUDA[tag], name=f"site-{tag}-{version}")
            out["PYTHONPATH"] = str(site)
            continue
        if cmd.startswith("unset "):
            for var in cmd.split()[1:]:
                out.pop(var, None)
            continue
        if cmd == "sudo reboot":
            continue  # a new driver loads: the test gives the simulated one itself
        assert cmd.startswith("export "), f"not a command a test can apply: {fix!r}"
        for word in shlex.split(cmd)[1:]:
            var, _, value = word.partition("=")
            old = out.get(var, "")
            value = re.sub(r"\$\{(\w+):\+:\$\1\}", (":" + old) if old else "", value)
            out[var] = value.replace(f"${var}", old)
    return out


def assert_fix_works(box: Sandbox, env: Mapping[str, str], check_id: str, *args: str) -> None:
    """Run the doctor, apply `check_id`'s fix, run it again: that check no longer fails and no
    other check fails that did not fail before."""
    before, _ = run_doctor_json(env, *args)
    assert_fixes_sound(before)
    fix = by_id(before)[check_id]["fix"]
    after, _ = run_doctor_json(apply_fix(box, env, fix), *args)
    assert_fixes_sound(after)
    was, now = statuses(before), statuses(after)
    assert now[check_id] != "fail", (fix, by_id(after)[check_id])
    broken = [k for k, s in now.items() if s == "fail" and was.get(k) != "fail"]
    assert not broken, (fix, [by_id(after)[k] for k in broken])
