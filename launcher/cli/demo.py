"""``xl demo``: launch the bundled example on this machine's devices and watch it live."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path

from xl.errors import ArgumentParser, UsageError
from xl.launcher.cli.launch import Viewer, inventory, launch, say_warnings
from xl.launcher.cli.options import positive_seconds
from xl.launcher.plan import build_plan
from xl.launcher.spec import LaunchSpec

# The demo's total, fixed: about 90 s on 2 CPU ranks of a laptop (~36 ms a step), less on GPUs.
DEMO_STEPS = 2500


def positive_steps(text: str) -> int:
    """A step count for ``--steps``: a whole number above 0 (argparse says so in one line)."""
    try:
        steps = int(text)
    except ValueError:
        steps = 0
    if steps <= 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of steps above 0, got {text!r}")
    return steps


def demo_script() -> Path:
    """The bundled examples/train.py, shipped as ``xl.examples`` (checkout or wheel alike)."""
    path = Path(str(files("xl.examples").joinpath("train.py")))
    if not path.is_file():
        raise UsageError(f"the demo script is missing ({path}); reinstall xl (pip install -e .)")
    return path


def main(argv: Sequence[str], viewer: Viewer | None = None) -> int:
    p = ArgumentParser(
        prog="xl demo",
        description=(
            "Train a small model on synthetic data (one rank per GPU, or 2 CPU ranks) and watch it."
        ),
    )
    p.add_argument(
        "--steps",
        type=positive_steps,
        default=DEMO_STEPS,
        help=f"how many steps to train (default {DEMO_STEPS}: the same total on every run)",
    )
    p.add_argument(
        "--seconds",
        type=positive_seconds,
        help="instead of a step count, about how long to train (sized from this machine's steps)",
    )
    p.add_argument("--nproc", type=int, help="ranks (default: one per GPU, 2 on CPU)")
    p.add_argument("--detach", action="store_true", help="start it and return at once")
    p.add_argument(
        "--no-tui", action="store_true", help="a plain live table instead of the monitor"
    )
    ns = p.parse_args(list(argv))
    inv = inventory()
    usable = [g for g in inv.gpus if not g.lost]
    spec = LaunchSpec(
        script=str(demo_script()),
        args=["--seconds", str(ns.seconds)] if ns.seconds else ["--steps", str(ns.steps)],
        gpus="all" if usable and "CUDA_VISIBLE_DEVICES" not in os.environ else None,
        nproc=ns.nproc if ns.nproc is not None else (None if usable else 2),
        name="demo",
        cwd=os.getcwd(),
    )
    # `xl demo` has no --gpus: a wrong CUDA_VISIBLE_DEVICES gets the doctor's fix only.
    plan = build_plan(spec, inv, gpus_from=None)
    say_warnings(plan)
    return launch(
        spec, detach=ns.detach, plain=None, plan=plan, viewer=None if ns.no_tui else viewer
    )
