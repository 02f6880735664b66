"""Fixes tried before they are printed: a candidate fix is applied to the facts (torch from
another index, another toolkit exported) and kept only when every check still passes that passed
before, so the report never prints a fix that breaks something else."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from xl.doctor.checks.derived import python_of, torch_version
from xl.doctor.checks.toolkit_choice import export_toolkit
from xl.doctor.facts import CmdResult, Facts, Toolkit, TorchInfo, major_minor
from xl.doctor.status import Status
from xl.doctor.wheels import (
    NEWEST_KNOWN,
    TAG_CUDA,
    base_version,
    install_command,
    version_for,
)

Apply = Callable[[Facts], Facts]

# The checks of what a training run needs to start and run. A fix for one of them that breaks
# nothing is taken first; failing that, one that breaks only a build check (the toolkit that
# builds extensions then needs its own fix, which the build checks give next run): a torch wheel
# that makes the GPUs usable is not traded for a driver upgrade it does not need.
RUNTIME_CHECKS = frozenset(
    {
        "driver",
        "gpus",
        "torch",
        "driver_cuda",
        "ld_library_path",
        "cuda_libraries",
        "cuda_init",
        "nccl",
        "cuda_visible_devices",
    }
)


def first_safe(
    f: Facts, check_id: str, candidates: Sequence[tuple[str, Apply]], strict: bool = False
) -> str | None:
    """The first candidate fix that, applied to the facts, clears this check's failure and makes
    no other check fail that did not fail before; for a runtime check's fix (unless `strict`),
    failing that, the first that makes no other runtime check fail. None when none does. On
    hypothetical facts (a fix being tried) the first candidate stands, so trying never recurses."""
    if not candidates:
        return None
    if f.what_if or f.recheck is None:
        return candidates[0][0]
    before = f.recheck(replace(f, what_if=True))
    tried = [(text, f.recheck(apply(f))) for text, apply in candidates]
    passes: list[frozenset[str] | None] = [None]
    if check_id in RUNTIME_CHECKS and not strict:
        passes.append(RUNTIME_CHECKS)
    for judged in passes:
        for text, after in tried:
            if after.get(check_id) == Status.FAIL:
                continue
            if any(
                s == Status.FAIL
                and before.get(k) != Status.FAIL
                and (judged is None or k in judged)
                for k, s in after.items()
                if k != check_id
            ):
                continue
            return text
    return None


def with_torch(tag: str, version: str | None) -> Apply:
    """The facts after installing torch `version` (None: the index's newest) from `tag`."""

    def apply(f: Facts) -> Facts:
        base = version or base_version(torch_version(f)) or NEWEST_KNOWN
        t = f.torch if f.torch is not None else TorchInfo(python=f.python)
        new = replace(
            t, found=True, cuda=TAG_CUDA[tag], hip=None, version=f"{base}+{tag}", problem=None
        )
        return replace(f, torch=new, what_if=True)

    return apply


def torch_candidates(
    python: str, current: str | None, tags: Sequence[str]
) -> list[tuple[str, Apply]]:
    """For each index tag, the `pip install torch ... --index-url .../<tag>` for ``python``
    (keeping ``current``'s version where that index has it; a downgrade is said in the
    command's note) and what it does to the facts."""
    return [
        (install_command(python, tag, current), with_torch(tag, version_for(tag, current)))
        for tag in tags
    ]


def torch_fix(f: Facts, check_id: str, tags: Sequence[str], strict: bool = False) -> str | None:
    """The first of torch_candidates that breaks no other check; `strict` as in first_safe."""
    return first_safe(f, check_id, torch_candidates(python_of(f), torch_version(f), tags), strict)


def with_toolkit(tk: Toolkit) -> Apply:
    """The facts after `export_toolkit(tk)`: CUDA_HOME and PATH's nvcc are this toolkit's."""

    def apply(f: Facts) -> Facts:
        run = tk.nvcc_run
        if run is None or not run.ok:
            mm = major_minor(tk.version) or "?"
            line = f"Cuda compilation tools, release {mm}, V{tk.version}"
            run = CmdResult(argv=[tk.nvcc or "nvcc", "--version"], stdout=line)
        return replace(
            f,
            env={**f.env, "CUDA_HOME": tk.root},
            cuda_home=tk.root,
            cuda_home_from="CUDA_HOME",
            cuda_home_dir=tk,
            home_toolkit=tk.real,
            path_toolkit=tk.real,
            path_nvcc=tk.nvcc,
            path_nvcc_run=run,
            cuda_home_nvcc_run=run,
            what_if=True,
        )

    return apply


def toolkit_candidates(tks: Sequence[Toolkit]) -> list[tuple[str, Apply]]:
    """For each toolkit, its `export CUDA_HOME=... PATH=...` and what it does to the facts."""
    return [(export_toolkit(tk), with_toolkit(tk)) for tk in tks]


def toolkit_fix(f: Facts, check_id: str, tks: Sequence[Toolkit]) -> str | None:
    """The first of toolkit_candidates that breaks no other check."""
    return first_safe(f, check_id, toolkit_candidates(tks))
