"""The host compiler nvcc would run for torch's extension builder, and what it is."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from xl.doctor.facts import CmdResult, Compiler
from xl.doctor.probes.files import is_dir, listdir, which

_COMPILER_RE = re.compile(r"^(g\+\+|gcc|clang\+\+|clang)-(\d+)$")


def other_compilers(path_value: str | None) -> list[tuple[str, str, int]]:
    """Versioned compilers on PATH (g++-12, clang++-17, ...): candidates for NVCC_CCBIN."""
    seen: set[str] = set()
    out: list[tuple[str, str, int]] = []
    for entry in (os.defpath if path_value is None else path_value).split(os.pathsep):
        if not entry or entry in seen:
            continue
        seen.add(entry)
        for name in listdir(entry):
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
        if is_dir(word):
            return os.path.join(word, "gcc"), var
        if os.sep in word:
            return word, var
        return which(word, path_value) or word, var
    found = which("gcc", path_value)
    if found:
        return found, "gcc"
    return None, "gcc"


def classify_compiler(comp: Compiler, version_run: CmdResult, dump_run: CmdResult) -> Compiler:
    """Fill in the compiler's kind (gcc or clang) and version from its `--version` and
    `-dumpfullversion` output; a compiler that can't say is a problem, not a guess."""
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
        comp.problem = (
            f"`{os.path.basename(comp.path)} --version` printed no version I recognise: "
            f"{first[:80]!r}"
        )
    return comp
