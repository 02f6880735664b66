"""``python -m xl.launcher.entry (SCRIPT | -m MODULE) ARGS...``: what torchrun starts for each rank.

The module path is a contract (it appears in every rank's argv): this file keeps it, and the code
lives in ``xl.launcher.rank.entry``.
"""

if __name__ == "__main__":
    from xl.launcher.rank.entry import run

    run()
