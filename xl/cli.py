"""The ``xl`` command: dispatches to one module per subcommand.

Each subcommand lives in the package that owns it and exposes ``main(argv) -> int``. Modules are
imported only when their command runs, so ``xl gpus`` never pays for Textual and ``xl doctor``
never pays for the launcher.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from xl._version import __version__
from xl.errors import EXIT_FAILED, EXIT_USAGE, NotYours, UsageError

# name -> ("module[:function]", one-line help); the function defaults to main(argv) -> int.
# Only commands that work are listed.
COMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("xl.doctor.cli", "check this machine for distributed training; print each fix"),
    "gpus": ("xl.gpu.cli", "one-shot GPU inventory: memory, utilization, processes (--json)"),
    "ui": ("xl.tui.app", "the app: GPUs, doctor, launch, live monitor, runs (also plain `xl`)"),
    "launch": (
        "xl.tui.commands:launch_main",
        "launch a supervised torchrun run (--gpus, --nproc, --dry-run, ...)",
    ),
    "sbatch": (
        "xl.launcher.cli.sbatch:sbatch_main",
        "print a Slurm batch script that runs `xl launch --slurm` (> job.sh)",
    ),
    "runs": ("xl.launcher.cli.runs", "list runs and their status (--json)"),
    "logs": ("xl.launcher.cli.logs", "print a run's per-rank logs (--rank R, -f)"),
    "stop": ("xl.launcher.cli.stop", "stop a run: every rank ends, none is left behind"),
    "compare": (
        "xl.launcher.cli.compare",
        "compare two runs: what changed, speed, loss, where the time went (--json)",
    ),
    "stacks": (
        "xl.launcher.cli.stacks",
        "where every rank of a live run is, and who the others wait for (--rank R, --json)",
    ),
    "attach": ("xl.tui.commands:attach_main", "watch an existing run live"),
    "demo": (
        "xl.tui.commands:demo_main",
        "train a small bundled model on this machine's devices and watch it",
    ),
    "serve": (
        "xl.tui.serve",
        "the app in a browser: one app per tab, behind a token (--read-only for viewers)",
    ),
    "exporter": (
        "xl.launcher.exporter.command",
        "every live run's ranks on /metrics for Prometheus (bearer token)",
    ),
}

# `xl` alone opens the app once the TUI exists.
DEFAULT_COMMAND: str | None = "ui"


def _usage() -> str:
    width = max((len(n) for n in COMMANDS), default=0)
    lines = [
        "usage: xl [--version] [--help] <command> [ARGS...]",
        "",
        "Diagnose, launch and watch multi-GPU PyTorch training.",
        "",
        "commands:",
    ]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run 'xl <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        if DEFAULT_COMMAND is None:
            print(_usage())
            return 0
        args = [DEFAULT_COMMAND]
    head = args[0]
    if head in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if head in ("-V", "--version"):
        print(f"xl {__version__}")
        return 0
    if head not in COMMANDS:
        import difflib  # noqa: PLC0415 - only a mistyped command pays for it

        close = difflib.get_close_matches(head, list(COMMANDS), n=1, cutoff=0.6)
        known = ", ".join(COMMANDS) or "none yet"
        hint = (
            f"; did you mean {close[0]}? (see 'xl --help')"
            if close
            else f" (commands: {known}; see 'xl --help')"
        )
        sys.stderr.write(f"xl: unknown command {head!r}{hint}\n")
        return EXIT_USAGE
    module_name, _, func_name = COMMANDS[head][0].partition(":")
    entry = getattr(importlib.import_module(module_name), func_name or "main")
    try:
        return int(entry(args[1:]) or 0)
    except NotYours as exc:  # another user's run: refused, one line (the command was right)
        sys.stderr.write(f"xl {head}: {exc}\n")
        return EXIT_FAILED
    except UsageError as exc:
        sys.stderr.write(f"xl {head}: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `xl gpus | head`: the reader left; that is not an error worth a traceback.
        try:
            sys.stdout = None  # type: ignore[assignment]
        except Exception:
            pass
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
