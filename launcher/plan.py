"""LaunchSpec + GPU inventory -> the exact torchrun command and the variables xl sets (pure).

One node: torchrun's default static rendezvous on a loopback port the supervisor holds for it
(``HELD_PORT`` here; docs/launch.md, "One node's rendezvous"); with restarts, c10d on 127.0.0.1
port 0 (like torchrun's --standalone). Several nodes: c10d at the
--rdzv endpoint, store served by node 0, with an id every node derives alike (see rdzv_id);
torch then numbers nodes in arrival order, so global ranks are what each rank's RANK says, not
node_rank * nproc.

Nothing here starts a process or touches NVML: the caller passes the inventory, so `--dry-run`,
the supervisor and the tests all see the same plan.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from xl import envnames
from xl.address import LOOPBACK, format_address
from xl.errors import UsageError
from xl.gpu.models import model_counts, models_text
from xl.launcher.spec import MIXED_PRECISION, LaunchSpec, valid_env_name

if TYPE_CHECKING:
    from xl.gpu.nvml import GPU, Inventory

ENTRY_MODULE = "xl.launcher.entry"
NO_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# A one-node plan's --master-port: the supervisor replaces it with a port it holds
# (xl.launcher.supervisor.ranks.hold_master_port).
HELD_PORT = "0"


@dataclass
class Plan:
    argv: list[str]
    env: dict[str, str]
    devices: list[GPU] = field(default_factory=list)
    nproc: int = 1
    cwd: str = "."
    # Worth saying before the run starts, not worth stopping it (a CUDA_VISIBLE_DEVICES the
    # doctor warns about, GPUs of different models): `xl launch` prints them on stderr.
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, list[str] | dict[str, str]]:
        """What `--dry-run --json` prints: the command and only the variables xl sets."""
        return {"argv": list(self.argv), "env": dict(self.env)}


def _usable(gpus: Sequence[GPU]) -> list[GPU]:
    return [g for g in gpus if not g.lost]


def _describe(gpus: Sequence[GPU]) -> str:
    if not gpus:
        return "this machine has no GPU"
    return "this machine has GPUs " + ", ".join(str(g.index) for g in gpus)


def _default_devices(
    gpus: Sequence[GPU],
    env: Mapping[str, str],
    have_driver: bool,
    gpus_from: str | None,
    warnings: list[str],
) -> list[GPU]:
    """No --gpus: the GPUs the current CUDA_VISIBLE_DEVICES shows (all when it is unset).

    The variable is judged as `xl doctor` judges it (xl.gpu.devices.judge_visible_devices): a
    ``fail`` there stops the launch, a ``warn`` is said and the launch goes on."""
    if "CUDA_VISIBLE_DEVICES" not in env:
        return _usable(gpus)
    from xl.gpu.devices import judge_visible_devices  # noqa: PLC0415 - only a set CUDA_VISIBLE_DEVICES is judged: not every launch's start

    verdict = judge_visible_devices(list(gpus), env, have_driver=have_driver)
    if verdict.status == "fail":
        other = f", or pass {gpus_from}" if gpus_from else ""
        raise UsageError(
            f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r} in your environment is wrong "
            f"({verdict.detail}); fix: {verdict.fix}{other}"
        )
    if verdict.status == "warn":
        warnings.append(
            f"CUDA_VISIBLE_DEVICES {verdict.detail} (xl doctor says the same; fix: {verdict.fix})"
        )
    # An empty CUDA_VISIBLE_DEVICES (or -1) hides every GPU on purpose: a CPU run.
    return list(verdict.devices)


def select_devices(
    spec_gpus: str | None,
    gpus: Sequence[GPU],
    env: Mapping[str, str] | None = None,
    *,
    have_driver: bool = True,
    gpus_from: str | None = "--gpus",
    warnings: list[str] | None = None,
) -> list[GPU]:
    """The chosen GPUs in the order ranks get them (LOCAL_RANK k -> k-th GPU). ``auto``: every
    GPU not busy (xl.gpu.health.busy); ``auto:N``: the N with the most free memory.

    ``gpus_from``: where ``spec_gpus`` came from, as errors name it (``--gpus``, or an
    Accelerate config's ``gpu_ids``); None for a command with no --gpus (`xl demo`).
    ``warnings`` collects what is worth saying but does not stop the launch."""
    env = os.environ if env is None else env
    warnings = [] if warnings is None else warnings
    if spec_gpus is None:
        return _default_devices(gpus, env, have_driver, gpus_from, warnings)
    src = gpus_from or "--gpus"
    text = spec_gpus.strip()
    if not text:
        raise UsageError(f"{src} is empty; give indices like 0,1, UUIDs, 'all' or 'auto:N'")
    if text == "all":
        every = _usable(gpus)
        if not every:
            raise UsageError(f"{src} all: no GPU found here (drop it to run on CPU)")
        return every
    if text == "auto":
        # Every free GPU: none that the app's picker and `xl launch` would call busy.
        from xl.gpu.health import busy  # noqa: PLC0415 - only --gpus auto asks: not every launch's start

        usable = _usable(gpus)
        free = [g for g in usable if not busy(g)]
        if not free:
            why = "; ".join(str(busy(g)) for g in usable) or _describe(usable)
            raise UsageError(
                f"{src} auto: no free GPU here ({why}); choose GPUs with {src} 0,1 or {src} all, "
                f"or the least used with {src} auto:N"
            )
        return free
    if text.startswith("auto:"):
        count = text[5:]
        if not count.isdigit() or int(count) < 1:
            raise UsageError(f"{src} {text}: N in auto:N must be a whole number >= 1")
        n = int(count)
        usable = _usable(gpus)
        if n > len(usable):
            raise UsageError(
                f"{src} {text}: only {len(usable)} usable GPU(s) here ({_describe(usable)})"
            )
        # Most free memory first, then least busy; unknown figures rank last.
        ranked = sorted(
            usable,
            key=lambda g: (
                -(g.memory_free_mib if g.memory_free_mib is not None else -1.0),
                g.util_gpu if g.util_gpu is not None else 101,
                g.index,
            ),
        )
        # The picked set is handed out in nvidia-smi order, so rank k's GPU is predictable.
        return sorted(ranked[:n], key=lambda g: g.index)
    from xl.gpu.devices import find_gpu  # noqa: PLC0415 - only GPUs named by --gpus: not every launch's start

    chosen: list[GPU] = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            raise UsageError(f"{src} {text!r} has an empty entry; write e.g. 0,1")
        gpu = find_gpu(list(gpus), token)
        if gpu is None:
            raise UsageError(
                f"unknown GPU {token!r} in {src} ({_describe(gpus)}; 'xl gpus' lists them)"
            )
        if gpu.lost:
            raise UsageError(f"GPU {gpu.index} in {src} is lost (fell off the bus); choose another")
        if any(g.index == gpu.index for g in chosen):
            raise UsageError(f"GPU {gpu.index} appears twice in {src} {text!r}; list each GPU once")
        chosen.append(gpu)
    return chosen


def check_target(spec: LaunchSpec, cwd: str) -> None:
    """The script or module exists here: checked before any process starts (and by `xl sbatch`
    on the login node, before a job waits in the queue for a typo)."""
    if (spec.script is None) == (spec.module is None):
        raise UsageError("give a training script (xl launch train.py) or a module (-m pkg.mod)")
    if spec.script is not None:
        path = spec.script if os.path.isabs(spec.script) else os.path.join(cwd, spec.script)
        if os.path.isdir(path):
            raise UsageError(
                f"{spec.script} is a directory, not a script; give the training script in it "
                f"(e.g. {os.path.join(spec.script, 'train.py')}) or run a package with -m NAME"
            )
        if not os.path.isfile(path):
            raise UsageError(f"no such script: {spec.script} (check the path, or use -m MODULE)")
        if not os.access(path, os.R_OK):
            raise UsageError(f"cannot read script {spec.script} (check its permissions)")
    else:
        top = str(spec.module).split(".")[0]
        # Only the top-level name: find_spec on a dotted name would import its parents (torch...).
        found = top and (
            os.path.isdir(os.path.join(cwd, top)) or os.path.isfile(os.path.join(cwd, top + ".py"))
        )
        if not found and importlib.util.find_spec(top) is None:
            raise UsageError(
                f"no module named {top!r} (check -m {spec.module} and your environment)"
            )


def check_nproc(nproc: int | None) -> None:
    if nproc is not None and nproc < 1:
        raise UsageError(f"--nproc must be at least 1 (got {nproc})")


def parse_rdzv(rdzv: str) -> tuple[str, int]:
    """``--rdzv HOST:PORT`` -> (host, port); an IPv6 address written [ADDR]:PORT comes back bare."""
    host, sep, port = rdzv.strip().rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]  # [IPv6]:PORT; torchrun wants the bare address
    if (
        not sep
        or not host
        or not (port.isascii() and port.isdigit())
        or (":" in host and not bracketed)
    ):
        raise UsageError(
            f"--rdzv {rdzv!r} is not HOST:PORT (e.g. --rdzv 10.0.0.1:29500 or [fd00::1]:29500)"
        )
    if not 0 < int(port) < 65536:
        raise UsageError(f"--rdzv {rdzv!r}: port {port} is out of range; use 1-65535 (e.g. 29500)")
    return host, int(port)


def rdzv_id(host: str, port: int, env: Mapping[str, str]) -> str:
    """The c10d rendezvous id, the same on every node of a run with no input from the person.

    With the run's token (XL_TOKEN: node 0 makes it before its plan, every other node is given
    it) the id is a short hash of it: each run gets its own id even when runs reuse an endpoint
    one after another, so a late or stale agent of another run never joins this one, and the
    token stays secret (12 hex digits of its SHA-256 on the command line). Without one (a dry
    run on node 0) it falls back to the endpoint."""
    token = env.get(envnames.TOKEN, "")
    if token:
        return token_rdzv_id(token)
    return "xl-" + re.sub(r"[^A-Za-z0-9.-]", "-", f"{host}-{port}")


def token_rdzv_id(token: str) -> str:
    """The rendezvous id of the run whose token is ``token`` (rdzv_id)."""
    import hashlib  # noqa: PLC0415 - several nodes only: not a one-node launch's start

    return "xl-" + hashlib.sha256(token.encode()).hexdigest()[:12]


def with_token(plan: Plan, token: str) -> Plan:
    """``plan`` as it is, its rendezvous id now the run's token's: the app's Launch form shows a
    multi-node plan before node 0's token is made (as the run starts), and the run is that plan."""
    argv = list(plan.argv)
    if "--rdzv-id" in argv:
        argv[argv.index("--rdzv-id") + 1] = token_rdzv_id(token)
    return replace(plan, argv=argv)


def _mixed_models(devices: Sequence[GPU]) -> str | None:
    """The warning for a run over GPUs of different models, its models counted and named as the
    doctor's `gpus` check and the app's picker name them (xl.gpu.models), with the launch's
    advice."""
    counts = model_counts(devices)
    if len(counts) < 2:
        return None
    return (
        f"the run's GPUs are of different models ({models_text(counts)}): every step waits for "
        "the slowest; choose alike GPUs with --gpus (xl gpus lists them)"
    )


def build_plan(
    spec: LaunchSpec,
    inventory: Inventory | None,
    env: Mapping[str, str] | None = None,
    *,
    gpus_from: str | None = "--gpus",
    cpu_nproc: Callable[[], int | None] | None = None,
) -> Plan:
    """The torchrun command for ``spec`` on this machine; UsageError on bad input.

    ``gpus_from``: what errors about ``spec.gpus`` blame (see select_devices). ``cpu_nproc``:
    asked once no GPU is chosen and ``spec.nproc`` is unset, how many CPU ranks to run (torchrun's
    ``--nproc-per-node auto``; None: one), after every other check of the spec, so the plan is
    made once.

    With fewer processes than GPUs chosen, the run gets the first ``nproc`` of them in the
    order chosen (``--gpus`` as written; without it nvidia-smi order, or CUDA_VISIBLE_DEVICES's
    order): only those are exposed to the ranks and recorded as the run's devices."""
    env = os.environ if env is None else env
    cwd = spec.cwd or os.getcwd()
    check_target(spec, cwd)
    gpus = list(inventory.gpus) if inventory is not None else []
    have_driver = inventory is not None and not inventory.driver.error
    warnings: list[str] = []
    devices = select_devices(
        spec.gpus, gpus, env, have_driver=have_driver, gpus_from=gpus_from, warnings=warnings
    )
    check_nproc(spec.nproc)
    nproc = spec.nproc if spec.nproc is not None else max(1, len(devices))
    if devices and nproc > len(devices):
        chosen = ",".join(str(g.index) for g in devices)
        # torchrun would start them all on these GPUs; with none chosen, CPU ranks are what a
        # person asking for more processes than GPUs may mean: say how (an empty
        # CUDA_VISIBLE_DEVICES hides every GPU, see _default_devices).
        cpu = (
            ""
            if spec.gpus is not None
            else ", or run CPU ranks: CUDA_VISIBLE_DEVICES= xl launch ..."
        )
        raise UsageError(
            f"--nproc {nproc} is more than the {len(devices)} GPU(s) chosen ({chosen}); "
            f"choose more GPUs with {gpus_from or '--gpus'} or fewer processes{cpu}"
        )
    devices = devices[:nproc]
    mixed = _mixed_models(devices)
    if mixed:
        warnings.append(mixed)
    if spec.max_restarts < 0:
        raise UsageError(f"--max-restarts must be 0 or more (got {spec.max_restarts})")
    if spec.nnodes < 1:
        raise UsageError(f"--nnodes must be at least 1 (got {spec.nnodes})")
    if not 0 <= spec.node_rank < spec.nnodes:
        raise UsageError(
            f"--node-rank {spec.node_rank} must be in 0..{spec.nnodes - 1} "
            f"(--nnodes {spec.nnodes}; give each node its own rank, 0 on the node at --rdzv)"
        )
    if spec.mixed_precision is not None and spec.mixed_precision not in MIXED_PRECISION:
        raise UsageError(
            f"--mixed-precision {spec.mixed_precision!r}: use one of {', '.join(MIXED_PRECISION)}"
        )

    python = spec.python or sys.executable
    argv = [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(spec.nnodes),
        "--nproc-per-node",
        str(nproc),
    ]
    nproc_at = len(argv) - 1
    if spec.nnodes == 1 and spec.rdzv is None and not spec.max_restarts:
        # torchrun's default, the static rendezvous: unlike c10d's it does not sleep 0-0.3 s
        # before joining nor keep heartbeats. Its store's port is one the supervisor holds until
        # the store binds it (SO_REUSEADDR), so nothing else can take it in between.
        argv += ["--master-addr", LOOPBACK, "--master-port", HELD_PORT]
    elif spec.nnodes == 1 and spec.rdzv is None:
        # With restarts the static store is shared with the ranks (stale keys after a restart,
        # see NO_SHARED_STORE below): torchrun's --standalone, a c10d store on a port the OS picks.
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{LOOPBACK}:0", "--rdzv-id", "xl"]
    else:
        if not spec.rdzv:
            raise UsageError("--nnodes > 1 needs --rdzv HOST:PORT (the address of node 0)")
        host, port = parse_rdzv(spec.rdzv)
        # c10d rendezvous at node 0's address. torch ignores --node-rank under c10d and numbers
        # nodes (GROUP_RANK, hence RANK) in arrival order, so it is not passed: xl keeps
        # --node-rank as its own node identity (node 0 is the hub gathering every node) and
        # learns each rank's global rank from the rank itself. Node 0, which runs on the --rdzv
        # host, serves the store (is_host): torch's guess from the hostname fails when the
        # address given is not what the hostname resolves to (hosts files, several interfaces).
        endpoint = format_address(host, port)
        argv += [
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-id",
            rdzv_id(host, port, env),
        ]
        argv += ["--rdzv-conf", f"is_host={1 if spec.node_rank == 0 else 0}"]
    argv += ["--max-restarts", str(spec.max_restarts), "-m", ENTRY_MODULE]
    if spec.script is not None:
        argv.append(spec.script)
    else:
        argv += ["-m", str(spec.module)]
    argv += list(spec.args)

    plan_env: dict[str, str] = {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        # Empty hides every GPU: a CPU run stays a CPU run whatever the shell had set.
        "CUDA_VISIBLE_DEVICES": ",".join(str(g.index) for g in devices),
    }
    if spec.mixed_precision is not None:
        plan_env["ACCELERATE_MIXED_PRECISION"] = spec.mixed_precision
    if spec.max_restarts:
        # torchrun's agent shares its rendezvous store with the ranks, so a restarted rank reads
        # its process group's keys from the attempt before (dead peers' addresses): it fails with
        # "Gloo connectFullMesh failed" or sits in _new_process_group_helper for good (seen in
        # half the runs, --standalone too). Without sharing, rank 0 serves a new store on every
        # attempt (docs/launch.md, "Restarts").
        plan_env[NO_SHARED_STORE] = "1"
    for key, value in spec.env.items():
        if not valid_env_name(key):
            raise UsageError(f"--env {key}={value}: {key!r} is not a valid variable name")
        plan_env[key] = value
    if not devices and spec.nproc is None and cpu_nproc is not None:
        # Asked last, so that a mistake in the spec itself is said first.
        nproc = cpu_nproc() or nproc
        argv[nproc_at] = str(nproc)
    return Plan(argv=argv, env=plan_env, devices=devices, nproc=nproc, cwd=cwd, warnings=warnings)
