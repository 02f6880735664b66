"""The process that owns a run: ``python -m xl.launcher.supervisor RUN_DIR`` (see ``loop``).

The module path is a contract (it appears in ``ps`` and in the tests): this package keeps it, and
``__main__`` starts the loop.
"""
