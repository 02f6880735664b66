"""The one LD_LIBRARY_PATH every fix in a report sets (the `ld_library_path` check's, the
`driver_cuda` check's when a libcuda on it cannot work), so no two fixes export two values."""

from __future__ import annotations

import os
from collections.abc import Sequence, Set

from xl.doctor.checks.compat import unusable
from xl.doctor.checks.derived import torch_cuda
from xl.doctor.checks.loaded import older_on_ld_path, unknown_nccl_on_path
from xl.doctor.checks.toolkit_choice import in_use_toolkit
from xl.doctor.facts import Facts, LdEntry, Toolkit, vtuple


def shadowed_torch_libs(f: Facts) -> list[tuple[LdEntry, str, str, str]]:
    """(entry, soname, its version, torch's version) for each CUDA library on LD_LIBRARY_PATH
    older than the one a pip torch brings in nvidia/: the loader takes LD_LIBRARY_PATH's first
    (torch's wheels find theirs through RUNPATH, which comes after). A version that can't be
    told (no versioned file name, no known toolkit) is not judged."""
    t = f.torch
    if not torch_cuda(f) or t is None or not t.pip_libs:
        return []
    ours = {soname: ver for soname, ver, _ in t.pip_libs}
    own = {os.path.realpath(folder) for _, _, folder in t.pip_libs}
    out = []
    for e in f.ld_entries:
        if not e.exists or not e.is_dir or e.real in own:
            continue
        tk = next((x for x in f.toolkits if e.real in x.lib_dirs), None)
        for soname, full in sorted(e.cuda_libs.items()):
            # Only these carry the toolkit's own version; cuBLAS, cuSPARSE, ... have their own.
            tracks = soname.startswith(("libcudart.", "libnvJitLink.", "libnvrtc."))
            theirs = full or (tk.version if tk is not None and tracks else None)
            if soname in ours and theirs and vtuple(theirs)[:2] < vtuple(ours[soname])[:2]:
                out.append((e, soname, theirs, ours[soname]))
    return out


def ld_fix(f: Facts) -> str:
    """`export LD_LIBRARY_PATH=...` with the entries that are folders that exist and can be
    read, without CUDA runtimes of another toolkit, without libraries older than torch's own,
    without cuDNN, NCCL or cuBLAS older than torch's pins, without a libcuda that cannot work;
    with the toolkit in use's own library folder when none of its folders is there.
    `unset LD_LIBRARY_PATH` when nothing is left."""
    drop = {e.path for e, *_ in shadowed_torch_libs(f)}
    drop |= {x.where for x in older_on_ld_path(f)}
    drop |= set(unknown_nccl_on_path(f))
    bad = unusable(f)
    if bad is not None and bad.source == "LD_LIBRARY_PATH":
        drop.add(bad.folder)
    return ld_command(f.ld_entries, drop, in_use_toolkit(f))


def ld_command(entries: Sequence[LdEntry], drop: Set[str], tk: Toolkit | None) -> str:
    """The LD_LIBRARY_PATH that keeps ``entries`` in their order, less those in ``drop``, those
    that are not readable folders, and CUDA runtimes that are not toolkit ``tk``'s; with ``tk``'s
    own library folder first when none of its folders is there."""
    lib_dirs = tk.lib_dirs if tk is not None else []
    keep = [
        e.path
        for e in entries
        if e.path
        and e.path not in drop
        and e.exists
        and e.is_dir
        and not e.problem
        and (not e.cudart or e.real in lib_dirs)
    ]
    if tk is not None and tk.lib_dirs and not any(e.real in tk.lib_dirs for e in entries):
        keep.insert(0, f"{tk.root}/lib64")
    keep = list(dict.fromkeys(keep))
    return f"export LD_LIBRARY_PATH={':'.join(keep)}" if keep else "unset LD_LIBRARY_PATH"
