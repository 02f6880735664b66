"""Probes: look at the machine (files, subprocesses, NVML, another interpreter) and return facts.

Every probe is bounded: subprocesses run in their own session with a timeout and are killed as a
group (a hanging `nvcc` wrapper script must not leave its `sleep` behind), output is capped and
decoded with errors="replace", and every folder read tolerates missing or unreadable paths.

One module per job: `commands` (the bounded runner, and `Job`: a probe on its own thread whose
`Outcome` is typed by what it returns), `files` (reads that never block or raise), `toolkits`
(CUDA toolkit discovery), `libraries` (LD_LIBRARY_PATH and the ldconfig cache), `compilers` (the
host compiler nvcc would run), `pytorch` (torch's facts from the interpreter under test, through
the stdlib-only script `torch_probe`), `shm` (segments dead jobs left in /dev/shm), `system`
(shared memory, the environment, the NVML inventory), `compile` (the --build proof). They run
from doctor/collect.py.
"""
