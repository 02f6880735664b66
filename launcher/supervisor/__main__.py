"""``python -m xl.launcher.supervisor RUN_DIR``: the path in argv stays; the code lives in ``loop``."""

import sys

if __name__ == "__main__":
    from xl.launcher.supervisor.loop import main

    raise SystemExit(main(sys.argv[1:]))
