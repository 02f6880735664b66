"""The names of xl's own environment variables, each written once (docs/contracts.md, "The
environment").

A variable's name is a contract between processes that share no code path but this one: ``xl
launch`` sets it, the supervisor and every rank read it, other tools (``xl gpus``, ``xl stop``) find
a run's processes by it. Standard library only and importing nothing, so the rank entry and
``xl.log``'s client can use it before the user's script at no cost.

How a tunable's value is read (a missing or bad number takes its default) is ``xl.settings``'s.
"""

from __future__ import annotations

# -- what every rank of a run gets (set by the supervisor; the contract with the ranks)
RUN_ID = "XL_RUN_ID"  # how every process of the run is found (`xl stop`, `xl gpus`)
RUN_DIR = "XL_RUN_DIR"
COLLECTOR = "XL_COLLECTOR"  # host:port that `xl.log` sends to
# a node > 0's ranks: node 0's collector, dialled only while their own node's cannot be reached
COLLECTOR_NODE_0 = "XL_COLLECTOR_NODE_0"
TOKEN = "XL_TOKEN"  # the run's secret: proven in the handshake, never sent
SUPERVISOR_PID = "XL_SUPERVISOR_PID"  # the last rank to end settles the run when it is gone

# -- multi-node: the same on every node (docs/multinode.md)
COLLECTOR_PORT = "XL_COLLECTOR_PORT"

# -- where xl keeps things
HOME = "XL_HOME"
CONFIG_HOME = "XL_CONFIG_HOME"
# the cgroup folder run cgroups are made in, instead of under this process's own (xl.cgroup)
CGROUP_ROOT = "XL_CGROUP_ROOT"

# -- tunables (docs/contracts.md, "Tunables")
STOP_GRACE = "XL_STOP_GRACE"
STALL_MIN_S = "XL_STALL_MIN_S"
STALL_FACTOR = "XL_STALL_FACTOR"
STRAGGLER_WINDOW_S = "XL_STRAGGLER_WINDOW_S"
STRAGGLER_SUSTAIN = "XL_STRAGGLER_SUSTAIN"
STRAGGLER_MIN_WAIT_S = "XL_STRAGGLER_MIN_WAIT_S"
PRINTED_HOLD_S = "XL_PRINTED_HOLD_S"
GPU_MEM_HIGH = "XL_GPU_MEM_HIGH"
NODE_TIMEOUT = "XL_NODE_TIMEOUT"
NODE_0_LOST_S = "XL_NODE_0_LOST_S"
LOG_QUEUE = "XL_LOG_QUEUE"
INSTRUMENT = "XL_INSTRUMENT"
SERVE_TOKEN = "XL_SERVE_TOKEN"
EXPORTER_TOKEN = "XL_EXPORTER_TOKEN"

# -- for tests and debugging, not documented for users
SIMULATED_GPUS = "XL_SIMULATED_GPUS"  # the test suite's simulated NVML (tests/support)
DEBUG_TIMING = "XL_DEBUG_TIMING"  # the supervisor prints where its start-up time went
DOCTOR_SHM = "XL_DOCTOR_SHM"  # the doctor's /dev/shm, moved for tests
# node 0's wait past the grace for a node's end (10 s), shortened for tests
NODE_END_WAIT = "XL_NODE_END_WAIT"

# Every variable that is the run's own (what a rank gets from the supervisor).
RUN_VARS = (RUN_ID, RUN_DIR, COLLECTOR, COLLECTOR_NODE_0, TOKEN, SUPERVISOR_PID)
