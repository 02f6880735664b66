"""``python -m xl.launcher.supervisor RUN_DIR``: the path in argv stays; the code lives in
``loop``."""

from __future__ import annotations

import sys

from xl.launcher.supervisor.loop import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
