"""The process that owns a run: ``python -m xl.launcher.supervisor RUN_DIR``.

The module path is a contract (it appears in ``ps`` and in the tests): this package keeps it, and
``__main__`` starts the loop. Started by ``start_run`` in its own session with stdin from
/dev/null, so neither Ctrl-C in the launching terminal nor the terminal closing reaches it. It
names itself ``xl-supervisor`` and runs torchrun as its child. One module a job:

- ``loop``: the Supervisor (start, a short loop that acts on what changed, finish);
- ``torchrun``: its child torchrun, and the port its store gets on one node;
- ``ranks``: who is who (rank records ``ranks/rank-<r>.json``, pids checked by their
  environment), how each ended, reaping (it is a child subreaper: ranks orphaned by a killed
  torchrun become its children); it returns what changed (``RankChange``);
- ``lifecycle``: what a rank's start, restart or end means (events, restarts, the stop);
- ``logsink``: every rank's ``logs/rank-<r>.log`` (written by the rank's own relay), read as it
  grows and parsed; nothing a rank prints waits on the supervisor;
- ``resilience``: descriptors raised to the hard limit, a private run dir, a crash that says so;
- ``escapes``: the run's descendants that left its environment, recorded for ``xl stop``;
- ``failure``: the root cause, the first failing rank and why;
- ``stopping``: SIGTERM to every rank, SIGKILL after the grace (``XL_STOP_GRACE``, default 10);
- ``nodes``: the other nodes, as the loop asks the same of them on every node: ``hub`` (node 0 of
  several) or ``follower`` (every other node), nothing on one node;
- ``journal``: run.json (through ``xl.launcher.rundir.runrecord``) and events.jsonl (its lines are
  ``xl.launcher.rundir.events``'s typed events);
- ``safe_telemetry``: every call into telemetry made safely (``SafeTelemetry``), telemetry
  imported once torchrun has started.

Only what starts torchrun is imported before it starts (tests/test_import_budgets.py): the rest
of the loop loads during torchrun's own start (docs/launch.md, "How a launch starts").

Several nodes (xl.launcher.multinode.nodelink): node 0's collector listens where every node can
reach it and its run dir becomes the run's one view; every other node keeps its own run dir and
also sends node 0 its ranks, output, lifecycle events, metrics and failure (see ``hub``).
"""
