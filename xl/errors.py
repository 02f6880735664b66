"""What every xl command shares: one-line usage errors and exit codes."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

EXIT_FAILED = 1  # the doctor found a failure, or the run failed
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the person at the keyboard: shown as one line, exit 2."""


class NotYours(UsageError):
    """A run of another user that this one may not read nor stop: one line, exit 1 (the
    permission is denied; the command was right)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad usage as a single line (what is wrong, where to look)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_USAGE)
