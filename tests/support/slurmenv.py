"""A Slurm allocation as its variables say it, for the Slurm tests (no cluster needed).

``fake_alloc_env``: the variables of a 3-node job, as srun/sbatch set them. ``env_without_slurm``:
the environment for a real `xl` with none of this shell's SLURM* variables and, by default, an
`scontrol` that fails at once (a real one with no cluster to ask retries for a minute), so xl's
own parser and the node names answer.
"""

from __future__ import annotations

import os
from pathlib import Path

from procs import xl_env


def fake_alloc_env(**extra: str) -> dict[str, str]:
    """A job on gpu07, gpu08 and gpu10 (4 GPUs each), ``extra`` set over it."""
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu[07-08],gpu10",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_JOB_CPUS_PER_NODE": "64(x2),32",
    }
    env.update(extra)
    return env


def env_without_slurm(work: Path, *, stub_scontrol: bool = True, **extra: str) -> dict[str, str]:
    """xl's environment for a test, with none of this shell's SLURM* variables."""
    env = xl_env(work / "home")
    for key in [k for k in env if k.startswith("SLURM")]:
        del env[key]
    if not stub_scontrol:
        env.update(extra)
        return env
    # An scontrol that fails at once (a real one, with no cluster to ask, retries for a minute):
    # xl's own parser and the node names answer.
    stub = work / "stub-bin"
    stub.mkdir(exist_ok=True)
    (stub / "scontrol").write_text("#!/bin/sh\nexit 1\n")
    (stub / "scontrol").chmod(0o755)
    env["PATH"] = f"{stub}{os.pathsep}{env['PATH']}"
    env.update(extra)
    return env
