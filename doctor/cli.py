"""`xl doctor [--json] [--strict] [--python PY] [--build]`: can this machine build and run
distributed training?"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Sequence

from xl.doctor.checks import BUILD, CHECKS
from xl.doctor.render import render_plain, render_report
from xl.doctor.run import run_doctor
from xl.errors import ArgumentParser, UsageError
from xl.python_arg import find_python


def _python_arg(value: str) -> str:
    found, why = find_python(value)
    if found is None:
        raise UsageError(f"--python {value}: {why} (give the path to a Python interpreter)")
    return found


def _color_terminal() -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return bool(os.environ.get("FORCE_COLOR")) and not os.environ.get("NO_COLOR")
    return sys.stdout.isatty() or bool(os.environ.get("FORCE_COLOR"))


def _what_each_decides() -> str:
    """The registry's own words for each check (docs/doctor.md says more), wrapped for a
    terminal."""
    lines = ["checks, and what each decides (docs/doctor.md has the rules and their sources):"]
    for spec in (*CHECKS, BUILD):
        lines += textwrap.wrap(
            spec.decides, width=100, initial_indent=f"  {spec.id:<21}", subsequent_indent=" " * 23
        )
    lines.append("")
    lines.append(
        "exit status: 0 when no check fails, 1 when one does (--strict: or warns or errors), "
        "2 on bad usage."
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(
        prog="xl doctor",
        description="Check the driver, GPUs, CUDA toolkits, compiler, torch and environment for "
        "distributed training; print each problem with its fix. Each check is ok, warn, fail, "
        "skip (does not apply here) or error (the check itself could not run).",
        epilog=_what_each_decides(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--json",
        action="store_true",
        help='one JSON object on stdout: {"status", "checks": [{"id", "status", "title", '
        '"detail", "fix", "data"?}...], "gpus", ...}; status is the worst check\'s',
    )
    ap.add_argument("--strict", action="store_true", help="exit 1 on warnings and errors too")
    ap.add_argument(
        "--python", metavar="PY", help="inspect torch in this interpreter (default: this one)"
    )
    ap.add_argument(
        "--build",
        action="store_true",
        help="also compile a tiny CUDA extension the way torch's extension builder would (same "
        "nvcc, host compiler, include folders and arch flags) and report it as the `build` "
        "check; takes the compile's time (a few seconds)",
    )
    ap.add_argument(
        "--nodes",
        nargs="*",
        metavar="HOST",
        help="compare these hosts' environments, as a multi-node launch does before its ranks "
        "start (inside a Slurm allocation, without HOST: its nodes); each is asked over ssh "
        "(BatchMode); exit 1 when a difference stops a run or a host cannot be asked",
    )
    # What --nodes runs on each host (one JSON line): hidden, not for people.
    ap.add_argument("--fingerprint", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    python = _python_arg(args.python) if args.python else None
    if args.nodes is not None or args.fingerprint:
        from xl.doctor import nodes  # noqa: PLC0415 - only --nodes asks other hosts

        if args.fingerprint:
            return nodes.print_fingerprint(python)
        return nodes.main_nodes(args.nodes, python, args.json)
    report = run_doctor(python, build=args.build)
    # Text may carry U+FFFD from undecodable environment bytes; never die on a narrow locale.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    elif _color_terminal():
        from rich.console import Console  # noqa: PLC0415 - Rich costs ~45 ms; only a colour terminal needs it

        Console(highlight=False).print(render_report(report, args.strict))
    else:
        sys.stdout.write(render_plain(report, args.strict))
    sys.stdout.flush()
    return report.exit_code(args.strict)
