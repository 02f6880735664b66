"""Probes: look at the machine (files, subprocesses, NVML) and return plain facts.

Every probe is bounded: subprocesses run in their own session with a timeout and are killed as a
group (a hanging `nvcc` wrapper script must not leave its `sleep` behind), output is capped and
decoded with errors="replace", and every folder read tolerates missing or unreadable paths.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import selectors
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from xl.doctor.facts import CmdResult, Compiler, LdEntry, Toolkit, TorchInfo
from xl.doctor.tables import parse_host_config

CMD_TIMEOUT = 2.5  # seconds; the issue allows at most 3
OUTPUT_CAP = 256 * 1024


def run_cmd(
    argv: list[str],
    timeout: float = CMD_TIMEOUT,
    env: Mapping[str, str] | None = None,
    label: str | None = None,
) -> CmdResult:
    """Run argv; never raises. The whole process group dies on timeout or runaway output.
    `label` names the command in messages (default: the program's name and its arguments)."""
    result = CmdResult(argv=list(argv))
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=dict(env) if env is not None else None,
        )
    except FileNotFoundError:
        result.problem = f"{argv[0]} not found"
        return result
    except PermissionError:
        result.problem = f"{argv[0]} is not executable (permission denied)"
        return result
    except OSError as exc:
        result.problem = f"{argv[0]} can't run: {exc.strerror or exc}"
        return result

    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs: dict[int, bytearray] = {out_fd: bytearray(), err_fd: bytearray()}
    deadline = time.monotonic() + timeout
    overflow = timed_out = False
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map() and not overflow:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(left):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                bufs[key.fd] += chunk
                overflow = overflow or len(bufs[key.fd]) > OUTPUT_CAP
    if timed_out or overflow:
        _kill_group(proc)
    try:
        # Both pipes closed: the process is exiting; a short wait covers the gap.
        proc.wait(timeout=1 if (timed_out or overflow) else max(0.2, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
        timed_out = True
    for stream in (proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            stream.close()
    result.stdout = bytes(bufs[out_fd][:OUTPUT_CAP]).decode("utf-8", "replace")
    result.stderr = bytes(bufs[err_fd][:OUTPUT_CAP]).decode("utf-8", "replace")
    result.returncode = proc.returncode
    name = label or " ".join([os.path.basename(argv[0]), *argv[1:]])
    if timed_out:
        result.problem = f"`{name}` did not answer within {timeout:g} s"
    elif overflow:
        result.problem = f"`{name}` printed more than {OUTPUT_CAP // 1024} KiB"
    elif proc.returncode != 0:
        line = result.first_line() or "no output"
        result.problem = f"`{name}` exited with {proc.returncode}: {line}"
    return result


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()


class Parallel:
    """Start callables on threads now, collect their results later (each bounded by its own timeout)."""

    def __init__(self) -> None:
        self._jobs: dict[str, tuple[threading.Thread, dict[str, Any]]] = {}

    def start(self, name: str, fn: Callable[[], Any]) -> None:
        box: dict[str, Any] = {}

        def target() -> None:
            t0 = time.perf_counter()
            try:
                box["value"] = fn()
            except BaseException as exc:  # a probe bug must not cost the report
                box["error"] = f"{type(exc).__name__}: {exc}"
            box["ms"] = (time.perf_counter() - t0) * 1000

        thread = threading.Thread(target=target, name=f"xl-doctor-{name}", daemon=True)
        thread.start()
        self._jobs[name] = (thread, box)

    def result(
        self, name: str, timeout: float = CMD_TIMEOUT + 1.5
    ) -> tuple[Any, str | None, float]:
        thread, box = self._jobs[name]
        thread.join(timeout)
        if thread.is_alive():
            return None, f"did not finish within {timeout:g} s", timeout * 1000
        return box.get("value"), box.get("error"), box.get("ms", 0.0)


# ---------------------------------------------------------------------------------------------
# files


def _is_file(path: str) -> bool:
    try:
        return os.path.isfile(path)
    except (OSError, ValueError):
        return False


def _is_dir(path: str) -> bool:
    try:
        return os.path.isdir(path)
    except (OSError, ValueError):
        return False


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (OSError, ValueError):
        return []


def _read_text(path: str, limit: int = 1 << 20) -> str | None:
    """A regular file's text, or None. Anything else is refused without blocking: opening a FIFO
    (a `version.json` made by mkfifo) for reading waits for a writer forever, and a device such
    as /dev/zero never ends, so the file is opened non-blocking and checked before reading."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            return fh.read(limit).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def why_not_a_folder(path: str) -> str:
    """Why `path` can't be used as a folder, in words (for a path that is not one)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "does not exist"
    except NotADirectoryError:
        return "does not exist (a part of the path is a file, not a folder)"
    except (OSError, ValueError) as exc:
        return f"can't be read: {getattr(exc, 'strerror', None) or exc}"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return f"is a dangling symlink (to {target}, which does not exist)"
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return f"is a symlink loop (to {target})"
            return f"is a symlink to {target}, which can't be read: {exc.strerror or exc}"
    if stat.S_ISREG(st.st_mode):
        return "is a file, not a folder"
    if stat.S_ISFIFO(st.st_mode):
        return "is a named pipe (FIFO), not a folder"
    if stat.S_ISDIR(st.st_mode):
        return "is a folder but can't be read"
    return "is not a folder"


def which(name: str, path_value: str | None) -> str | None:
    """shutil.which without its import cost and with unreadable PATH entries tolerated. An unset
    PATH means the system default, as for exec and shutil.which; an empty one means nothing."""
    if path_value is None:
        path_value = os.defpath
    for entry in path_value.split(os.pathsep):
        if not entry:
            continue
        cand = os.path.join(entry, name)
        try:
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand
        except (OSError, ValueError):
            continue
    return None


_WRAPPED_NVCC = re.compile(r"(/[^\s\"'$;|&]+/bin/nvcc)\b")


def follow_nvcc(path: str) -> str:
    """The real nvcc behind `path`: symlinks resolved, and a small `exec .../bin/nvcc` wrapper
    script followed (e.g. /usr/local/bin/nvcc -> /usr/local/cuda-13.0/bin/nvcc)."""
    real = os.path.realpath(path)
    try:
        if os.path.getsize(real) < 4096:
            text = _read_text(real, 4096) or ""
            if text.startswith("#!"):
                for cand in _WRAPPED_NVCC.findall(text):
                    target = os.path.realpath(cand)
                    if target != real and _is_file(target):
                        return target
    except (OSError, ValueError):
        pass
    return real


def toolkit_root_of_nvcc(nvcc: str) -> str:
    return os.path.dirname(os.path.dirname(follow_nvcc(nvcc)))


def resolve_cuda_home(
    env: Mapping[str, str], path_nvcc: str | None, default: str = "/usr/local/cuda"
) -> tuple[str | None, str | None]:
    """CUDA_HOME exactly as torch.utils.cpp_extension._find_cuda_home resolves it on Linux:

        cuda_home = os.environ.get('CUDA_HOME') or os.environ.get('CUDA_PATH')
        if cuda_home is None: the folder above shutil.which('nvcc') (not resolved), else
                              /usr/local/cuda when it exists (a dangling link does not)

    The `or` chain skips an empty CUDA_HOME, but a CUDA_PATH that is set and empty comes back as
    "" and stops the search: torch then looks for nvcc at the relative path bin/nvcc. That case
    returns ("", "CUDA_PATH") so the check can say so.
    """
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home is not None:
        return home, "CUDA_HOME" if env.get("CUDA_HOME") else "CUDA_PATH"
    if path_nvcc:
        return os.path.dirname(os.path.dirname(path_nvcc)), "nvcc on PATH"
    if os.path.exists(default):
        return default, default
    return None, None


_VERSION_TXT = re.compile(r"CUDA Version (\d+\.\d+(?:\.\d+)?)")
_DISTINFO_NVCC = re.compile(r"^nvidia_cuda_nvcc(?:_cu\d+)?-(\d+\.\d+(?:\.\d+)?)[^/]*\.dist-info$")
_CUDART = re.compile(r"^libcudart\.so\.(\d+)$")


def inspect_toolkit(root: str, found_by: str) -> Toolkit:
    """Read a toolkit's version, limits and libraries from its files (no subprocess)."""
    try:
        real = os.path.realpath(root)
    except (OSError, ValueError):
        real = root
    tk = Toolkit(root=root, real=real, found_by=[found_by])
    if not _is_dir(real):
        tk.problem = f"{root} {why_not_a_folder(root)}"
        return tk
    if not os.access(real, os.R_OK | os.X_OK):
        tk.problem = f"{root} is not readable"
        return tk
    nvcc = os.path.join(root, "bin", "nvcc")
    if _is_file(nvcc):
        tk.nvcc = nvcc
    text = _read_text(os.path.join(real, "version.json"))
    if text is not None:
        try:
            data = json.loads(text)
            ver = (data.get("cuda") or {}).get("version") or (data.get("cuda_nvcc") or {}).get(
                "version"
            )
            if isinstance(ver, str):
                tk.version, tk.version_from = ver, "version.json"
        except (ValueError, AttributeError):
            pass
    if tk.version is None:
        text = _read_text(os.path.join(real, "version.txt"))
        m = _VERSION_TXT.search(text or "")
        if m:
            tk.version, tk.version_from = m.group(1), "version.txt"
    if tk.version is None:
        for name in _listdir(os.path.join(real, "dist-info")):
            m = _DISTINFO_NVCC.match(name)
            if m:
                tk.version, tk.version_from = m.group(1), "dist-info"
                break
    hc = os.path.join(real, "include", "crt", "host_config.h")
    text = _read_text(hc)
    if text is not None:
        tk.host_config = hc
        tk.gcc_min, tk.gcc_max, tk.clang_min, tk.clang_max = parse_host_config(text)
    tk.has_headers = _is_file(os.path.join(real, "include", "cuda_runtime.h"))
    for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib")):
        libdir = os.path.join(real, sub)
        if _is_dir(libdir):
            lreal = os.path.realpath(libdir)
            if lreal not in tk.lib_dirs:
                tk.lib_dirs.append(lreal)
        for name in _listdir(libdir):
            if _CUDART.match(name) and name not in tk.cudart:
                tk.cudart.append(name)
    tk.cudart.sort()
    return tk


def toolkit_root_of_libdir(entry: str) -> str | None:
    """The toolkit a library folder belongs to (ROOT/lib64, ROOT/lib or
    ROOT/targets/<arch>/lib, as written or once resolved), when ROOT looks like one."""
    if not entry or not _is_dir(entry):
        return None
    roots: list[str] = []
    for path in dict.fromkeys((os.path.normpath(entry), os.path.realpath(entry))):
        parent = os.path.dirname(path)
        if os.path.basename(path) in ("lib64", "lib"):
            roots.append(parent)
            if os.path.basename(os.path.dirname(parent)) == "targets":
                roots.append(os.path.dirname(os.path.dirname(parent)))
    for root in roots:
        if any(
            _is_file(os.path.join(root, n)) for n in ("bin/nvcc", "version.json", "version.txt")
        ):
            return root
    return None


def discover_toolkits(
    env: Mapping[str, str], path_nvcc: str | None, cuda_home: str | None
) -> list[Toolkit]:
    """Every toolkit we can see, deduplicated by real path, with where each was found."""
    cands: list[tuple[str, str]] = []
    for base, label in (("/usr/local", "/usr/local/cuda*"), ("/opt", "/opt/cuda*")):
        for name in sorted(_listdir(base)):
            if name.startswith("cuda"):
                cands.append((os.path.join(base, name), label))
    if cuda_home:
        # torch's CUDA_HOME may be the folder above a wrapper (/usr/local for /usr/local/bin/nvcc):
        # the toolkit is where the wrapper leads; the cuda_home check judges the folder itself.
        home_nvcc = os.path.join(cuda_home, "bin", "nvcc")
        root = toolkit_root_of_nvcc(home_nvcc) if _is_file(home_nvcc) else cuda_home
        cands.append((root, "CUDA_HOME"))
    if env.get("CUDA_PATH") and env.get("CUDA_HOME"):
        cands.append((env["CUDA_PATH"], "CUDA_PATH"))
    if path_nvcc:
        cands.append((toolkit_root_of_nvcc(path_nvcc), "PATH"))
    for entry in (env.get("PATH") or "").split(os.pathsep):
        if entry and _is_file(os.path.join(entry, "nvcc")):
            cands.append((toolkit_root_of_nvcc(os.path.join(entry, "nvcc")), "PATH"))
    # A toolkit's library folder on LD_LIBRARY_PATH (cuda-12.1/lib64 and the like) names a toolkit
    # too: without it, which toolkit LD_LIBRARY_PATH selects could not be told.
    for entry in (env.get("LD_LIBRARY_PATH") or "").split(os.pathsep):
        lib_root = toolkit_root_of_libdir(entry)
        if lib_root is not None:
            cands.append((lib_root, "LD_LIBRARY_PATH"))
    if env.get("CONDA_PREFIX"):
        prefix = env["CONDA_PREFIX"]
        if _is_file(os.path.join(prefix, "bin", "nvcc")):
            cands.append((prefix, "$CONDA_PREFIX"))
    found: dict[str, Toolkit] = {}
    for root, label in cands:
        try:
            real = os.path.realpath(root)
        except (OSError, ValueError):
            real = root
        if real in found:
            tk = found[real]
            if label not in tk.found_by:
                tk.found_by.append(label)
            if root != tk.root and root not in tk.aliases:
                tk.aliases.append(root)
            continue
        tk = inspect_toolkit(root, label)
        # /usr/local/cuda-foo.bak without nvcc or version is not a toolkit; a named variable is
        # reported even when broken (the checks say why).
        if tk.problem is None and tk.nvcc is None and tk.version is None and label.endswith("*"):
            continue
        found[real] = tk
    return list(found.values())


def scan_ld_library_path(value: str | None) -> list[LdEntry]:
    entries: list[LdEntry] = []
    if value is None:
        return entries
    for raw in value.split(":"):
        entry = LdEntry(path=raw, real=os.path.realpath(raw) if raw else "")
        if raw == "":
            entry.exists = False
            entries.append(entry)
            continue
        if not os.path.exists(raw):
            entry.exists = False
            entry.why = why_not_a_folder(raw)
        elif not _is_dir(raw):
            entry.is_dir = False
            entry.why = why_not_a_folder(raw)
        else:
            try:
                names = os.listdir(raw)
            except OSError as exc:
                entry.problem = exc.strerror or str(exc)
                names = []
            for name in names:
                if _CUDART.match(name):
                    entry.cudart.append(name)
                elif name.startswith("libnccl.so"):
                    entry.nccl.append(name)
                elif name.startswith("libcudnn.so"):
                    entry.cudnn.append(name)
            entry.cudart.sort()
        entries.append(entry)
    return entries


_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(.+?)\s*$")
_LD_INTEREST = ("libcudart.so", "libnccl.so", "libcuda.so", "libnvidia-ml.so", "libcudnn.so")
# The ABI word ldconfig prints for 64-bit libraries ("libc6,x86-64", "libc6,AArch64", ...).
_LD_64BIT = ("x86-64", "AArch64", "64bit", "IA-64")


def parse_ldconfig(text: str, bits64: bool = sys.maxsize > 2**32) -> dict[str, list[str]]:
    """`ldconfig -p` -> {soname: [paths in cache order]} for the CUDA libraries. A 64-bit
    process can't load the 32-bit copies (the driver's i386 libcuda.so.1, say), so those are
    left out; when no line carries a 64-bit ABI word (another architecture), all are kept."""
    rows: list[tuple[str, bool, str]] = []
    for line in text.splitlines():
        m = _LDCONFIG_LINE.match(line)
        if m and m.group(1).startswith(_LD_INTEREST):
            flags = [f.strip() for f in m.group(2).split(",")]
            rows.append((m.group(1), any(f in _LD_64BIT for f in flags), m.group(3)))
    if bits64 and any(is64 for _, is64, _ in rows):
        rows = [r for r in rows if r[1]]
    out: dict[str, list[str]] = {}
    for name, _, path in rows:
        out.setdefault(name, []).append(path)
    return out


def find_ldconfig(env: Mapping[str, str]) -> str | None:
    return which("ldconfig", env.get("PATH")) or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if _is_file(p)), None
    )


def shm_size(path: str = "/dev/shm") -> tuple[int | None, int | None, str | None]:
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return None, None, f"{path}: {exc.strerror or exc}"
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, None


_COMPILER_RE = re.compile(r"^(g\+\+|gcc|clang\+\+|clang)-(\d+)$")


def other_compilers(path_value: str | None) -> list[tuple[str, str, int]]:
    """Versioned compilers on PATH (g++-12, clang++-17, ...): candidates for NVCC_CCBIN."""
    seen: set[str] = set()
    out: list[tuple[str, str, int]] = []
    for entry in (os.defpath if path_value is None else path_value).split(os.pathsep):
        if not entry or entry in seen:
            continue
        seen.add(entry)
        for name in _listdir(entry):
            m = _COMPILER_RE.match(name)
            if m:
                kind = "clang" if m.group(1).startswith("clang") else "gcc"
                out.append((os.path.join(entry, name), kind, int(m.group(2))))
    return out


def _ccbin_in_flags(value: str) -> str | None:
    """The last `-ccbin X` / `--compiler-bindir X` (or `=X`) in an NVCC_*_FLAGS value."""
    words = value.split()
    found = None
    for i, word in enumerate(words):
        for opt in ("-ccbin", "--compiler-bindir"):
            if word == opt and i + 1 < len(words):
                found = words[i + 1]
            elif word.startswith(opt + "="):
                found = word[len(opt) + 1 :]
    return found


def pick_compiler(env: Mapping[str, str]) -> tuple[str | None, str]:
    """The host compiler nvcc runs when torch's extension builder (and so DeepSpeed's op builder)
    calls it, and the variable that chose it.

    Checked against nvcc 13.0 (`nvcc --dryrun`) and torch 2.13's torch/utils/cpp_extension.py:
    - nvcc reads no CC, CXX or CUDAHOSTCXX. Without `-ccbin` it takes NVCC_CCBIN, and without
      that it runs `gcc` from PATH (not `c++`).
    - A `-ccbin` on nvcc's command line beats NVCC_CCBIN, and when several are given the last one
      wins. The command line is NVCC_PREPEND_FLAGS, then the caller's flags, then
      NVCC_APPEND_FLAGS.
    - torch's builder (setup.py BuildExtension and JIT `load`) adds `-ccbin $CC` when CC is set;
      it never passes CXX to nvcc (CXX compiles the .cpp files).
    - CUDAHOSTCXX is CMake's (the default of CMAKE_CUDA_HOST_COMPILER): torch's builder and
      plain nvcc ignore it, so it does not pick the compiler here.
    - `-ccbin DIR` / NVCC_CCBIN=DIR makes nvcc run DIR/gcc; a bare name is looked up on PATH.
    """
    path_value = env.get("PATH")
    order: list[tuple[str, str | None]] = [
        ("NVCC_APPEND_FLAGS", _ccbin_in_flags(env.get("NVCC_APPEND_FLAGS") or "")),
        ("CC", (env.get("CC") or "").strip() or None),
        ("NVCC_PREPEND_FLAGS", _ccbin_in_flags(env.get("NVCC_PREPEND_FLAGS") or "")),
        ("NVCC_CCBIN", (env.get("NVCC_CCBIN") or "").strip() or None),
    ]
    for var, value in order:
        if not value:
            continue
        # Values may carry a launcher ("ccache gcc"): the last word is the compiler.
        word = value.split()[-1]
        if _is_dir(word):
            return os.path.join(word, "gcc"), var
        if os.sep in word:
            return word, var
        return which(word, path_value) or word, var
    found = which("gcc", path_value)
    if found:
        return found, "gcc"
    return None, "gcc"


def classify_compiler(comp: Compiler, version_run: CmdResult, dump_run: CmdResult) -> Compiler:
    comp.run = version_run
    if not version_run.ok:
        comp.problem = version_run.problem
        return comp
    text = version_run.stdout + version_run.stderr
    first = text.strip().splitlines()[0] if text.strip() else ""
    if "clang" in first.lower():
        comp.kind = "clang"
        m = re.search(r"clang version (\d+(?:\.\d+)*)", text)
        comp.version = m.group(1) if m else None
    elif re.search(r"\b(gcc|g\+\+|GCC|c\+\+|cc)\b", first) or "Free Software Foundation" in text:
        comp.kind = "gcc"
        dumped = dump_run.stdout.strip() if dump_run.ok else ""
        if re.fullmatch(r"\d+(?:\.\d+)*", dumped):
            comp.version = dumped
        else:
            m = re.search(r"(\d+\.\d+(?:\.\d+)?)\s*$", first)
            comp.version = m.group(1) if m else None
    if comp.version is None:
        comp.problem = f"`{os.path.basename(comp.path)} --version` printed no version I recognise: {first[:80]!r}"
    return comp


# The torch probe runs in the interpreter given by --python. It finds torch without importing it
# (find_spec does not execute torch/__init__.py) and reads version.py as literals.
TORCH_PROBE = r"""
import ast, json, os, sys
out = {"python": sys.executable, "bin_dir": os.path.dirname(sys.executable)}
try:
    import importlib.util
    spec = importlib.util.find_spec("torch")
except Exception as e:
    spec = None
    out["problem"] = "finding torch failed: %s" % (e,)
def dists(site, prefix):
    try:
        return sorted(n for n in os.listdir(site) if n.startswith(prefix) and n.endswith(".dist-info"))
    except OSError:
        return []
if spec is not None and spec.origin:
    d = os.path.dirname(spec.origin)
    out["location"] = d
    vals = {}
    try:
        vp = os.path.join(d, "version.py")
        if os.path.exists(vp) and not os.path.isfile(vp):  # open() on a FIFO blocks forever
            raise OSError("not a regular file")
        with open(vp, "rb") as fh:
            tree = ast.parse(fh.read().decode("utf-8", "replace"))
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and node.value is not None:
                    try:
                        vals[t.id] = ast.literal_eval(node.value)
                    except Exception:
                        pass
    except Exception as e:
        out["problem"] = "can't read %s: %s" % (os.path.join(d, "version.py"), e)
    out["version"] = vals.get("__version__")
    out["cuda"] = vals.get("cuda")
    out["hip"] = vals.get("hip")
    site = os.path.dirname(d)
    td = dists(site, "torch-")
    if td and not out.get("version"):
        out["version"] = td[-1][len("torch-"):-len(".dist-info")]
    elif not td and not out.get("version"):
        try:
            import importlib.metadata as md
            out["version"] = md.version("torch")
        except Exception:
            pass
    def version_of(n):
        return n[: -len(".dist-info")].split("-", 1)[1]
    for n in dists(site, "nvidia_nccl_cu"):
        out["nccl"] = version_of(n)
        out["nccl_from"] = n[: -len(".dist-info")].split("-", 1)[0].replace("_", "-")
    nvd = os.path.join(site, "nvidia")
    pip_tk = []
    for n in dists(site, "nvidia_cuda_nvcc"):
        ver = version_of(n)
        # nvidia-cuda-nvcc-cu12 installs nvidia/cuda_nvcc; the 13.x wheels install nvidia/cu13
        tag = n.split("-")[0].rsplit("_", 1)[-1]
        subs = ["cuda_nvcc"] if tag[:2] == "cu" and tag[2:].isdigit() else ["cu" + ver.split(".")[0], "cuda_nvcc"]
        for sub in subs:
            if os.path.isfile(os.path.join(nvd, sub, "bin", "nvcc")):
                pip_tk.append((os.path.join(nvd, sub), ver))
                break
    out["pip_toolkits"] = pip_tk
print(json.dumps(out))
"""


def probe_torch(python: str) -> TorchInfo:
    info = TorchInfo(python=python)
    res = run_cmd(
        [python, "-c", TORCH_PROBE],
        timeout=CMD_TIMEOUT,
        label=f"{os.path.basename(python)} -c <torch probe>",
    )
    if not res.ok:
        info.problem = res.problem
        return info
    lines = [ln for ln in res.stdout.strip().splitlines() if ln.startswith("{")]
    try:
        data = json.loads(lines[-1])
    except (ValueError, IndexError):
        info.problem = (
            f"{python} printed something that is not the probe's answer: {res.first_line()!r}"
        )
        return info
    info.python = data.get("python") or python
    info.bin_dir = data.get("bin_dir")
    info.problem = data.get("problem")
    info.location = data.get("location")
    info.found = bool(info.location)
    for key in ("version", "cuda", "hip", "nccl", "nccl_from"):
        value = data.get(key)
        setattr(info, key, value if isinstance(value, str) else None)
    info.pip_toolkits = [
        tuple(x) for x in data.get("pip_toolkits") or [] if isinstance(x, list) and len(x) == 2
    ]
    return info


def probe_inventory() -> Any:
    from xl.gpu import nvml

    return nvml.inventory(processes=False)


def env_snapshot() -> dict[str, str]:
    """The environment as text: bytes that aren't UTF-8 become U+FFFD instead of breaking output."""
    try:
        return {
            k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
            for k, v in os.environb.items()
        }
    except AttributeError:  # pragma: no cover - platforms without environb
        return dict(os.environ)
