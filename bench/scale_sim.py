"""Simulated nodes and ranks for bench_scale.py: one process plays many nodes of a multi-node run.

    python bench/scale_sim.py CONFIG_JSON      (started by bench_scale.py; commands on stdin)

Each simulated node is what a real node > 0 sends node 0 (docs/multinode.md, "Node links"): its
supervisor's **node link**, xl's own ``NodeLink`` (launcher/multinode/nodelink.py: its thread,
handshake, heartbeat, acks), carrying what a follower's journal sends: ``run_started`` and
``rank_started`` events, its ``ranks`` rows, its ranks' output (``log``), its answers to node 0's
stacks requests, at the end its ranks' exits and its ``end``; and once a second what its
telemetry forwards (``forward_records``, launcher/supervisor/safe_telemetry.py): one ``sys`` line
per rank as its sampler gives it, and its ranks' training as xl's own ``Summary``
(launcher/multinode/summary.py) sums it up: one ``train`` row a rank standing for its steps of
that second. Its ranks talk to their own node (they are simulated in this process): each step is
one train line built with the client's encoder (``xl.client.metricline.train_line``), handed to the
node's summary as its collector would.

Everything runs on one asyncio loop beside the links' threads: a rank costs a few microseconds a
step, so thousands fit in a process or two.

Commands on stdin, one per line: ``stall`` (the culprit rank stops stepping: no more train
lines, its node's sys lines go on, as a rank stuck in user code), ``block N``
(every other rank stops too, waiting in all-reduce #N for it, as the ranks of a synchronous job
do: their stacks answers say so, the culprit's says it is in the person's code with #N-1 its
last collective done), ``stats``
(a JSON line of counters on stdout), ``stop`` (every node ends as its supervisor would when node 0
says stop). Node 0's ``stop`` over the link ends the nodes too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import resource
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from xl.client.metricline import train_line
from xl.launcher.multinode.clip import clip_stacks
from xl.launcher.multinode.nodelink import NodeLink, Refused, StacksAsk, StopCommand
from xl.launcher.multinode.protocol import EndMessage, EventMessage, RanksMessage, StacksMessage
from xl.launcher.multinode.summary import Summary
from xl.launcher.rundir.events import EventKind
from xl.launcher.rundir.rows import RankRow
from xl.launcher.rundir.runrecord import RunStatus
from xl.launcher.supervisor.safe_telemetry import forward_records

# The stack a simulated rank answers with: a training loop, the main thread in the script.
_SCRIPT = "/work/proj/train.py"
_TORCH = "/opt/venv/lib/python3.11/site-packages/torch"


def _frames(where: str) -> list[dict[str, Any]]:
    frames = [
        {"file": "<frozen runpy>", "line": 88, "function": "_run_code"},
        {"file": _SCRIPT, "line": 120, "function": "<module>"},
        {"file": _SCRIPT, "line": 97, "function": "main"},
        {"file": _SCRIPT, "line": 61, "function": "train_step"},
    ]
    if where == "allreduce":
        frames += [
            {"file": f"{_TORCH}/nn/parallel/distributed.py", "line": 1637, "function": "forward"},
            {"file": f"{_TORCH}/distributed/c10d_logger.py", "line": 81, "function": "wrapper"},
            {
                "file": f"{_TORCH}/distributed/distributed_c10d.py",
                "line": 2806,
                "function": "all_reduce",
            },
        ]
    elif where == "step":
        frames += [
            {"file": f"{_TORCH}/_tensor.py", "line": 626, "function": "backward"},
            {"file": f"{_TORCH}/autograd/__init__.py", "line": 347, "function": "backward"},
            {
                "file": f"{_TORCH}/autograd/graph.py",
                "line": 823,
                "function": "_engine_run_backward",
            },
        ]
    else:  # stuck in the person's own code
        frames += [{"file": _SCRIPT, "line": 44, "function": "load_batch"}]
    return frames


class Rank:
    __slots__ = ("last_step_t", "local", "pid", "rank", "rates", "step", "stopped", "waiting")

    def __init__(self, rank: int, local: int, pid: int) -> None:
        self.rank, self.local, self.pid = rank, local, pid
        self.step = 0
        self.rates: dict[str, float] = {}
        self.stopped = False  # the culprit, once stalled; every rank once blocked
        self.waiting: int | None = None  # blocked: the all-reduce it waits in
        self.last_step_t = 0.0


class Node:
    def __init__(self, sim: Sim, node: int) -> None:
        self.sim = sim
        self.node = node
        self.host = f"sim-node-{node}"
        rpn = sim.rpn
        self.ranks = [Rank(node * rpn + i, i, 100_000 + node * rpn + i) for i in range(rpn)]
        self.link = NodeLink(sim.host, sim.port, sim.token, node, self.host)
        # its supervisor's telemetry: the ranks' lines summed up, forwarded once a second
        self.summary = Summary()
        self.forward = forward_records(self.link)  # type: ignore[arg-type]  # its journal's send
        self.started = time.time()
        self.ended = False

    def rows(self, state: str = "running", code: int | None = None) -> tuple[RankRow, ...]:
        return tuple(
            RankRow.from_json(
                {
                    "rank": r.rank,
                    "local_rank": r.local,
                    "node": self.host,
                    "node_rank": self.node,
                    "pid": r.pid,
                    "gpu": r.local,
                    "gpu_uuid": None,
                    "state": state,
                    "exit_code": code,
                    "started_at": self.started,
                    "ended_at": None if code is None else time.time(),
                    "attempt": 0,
                }
            )
            for r in self.ranks
        )

    def begin(self) -> None:
        self.link.start()
        now = time.time()
        self.link.send(
            EventMessage(
                EventKind.RUN_STARTED,
                {
                    "t": now,
                    "kind": "run_started",
                    "message": f"starting {len(self.ranks)} ranks on GPUs 0-{len(self.ranks) - 1}",
                },
            )
        )
        for r in self.ranks:
            self.link.send(
                EventMessage(
                    EventKind.RANK_STARTED,
                    {
                        "t": now,
                        "kind": "rank_started",
                        "rank": r.rank,
                        "pid": r.pid,
                        "message": f"rank {r.rank} started (pid {r.pid}, GPU {r.local})",
                    },
                )
            )
        self.link.send(RanksMessage(self.rows()))

    def sample(self, now: float) -> None:
        """What the node's telemetry forwards each second (xl's forward_records): a sys line per
        rank as its sampler gives it, and its ranks' summary rows."""
        records: list[dict[str, Any]] = []
        for r in self.ranks:
            # waiting in I/O; or stepping, or spinning in NCCL
            stuck = 1.0 if r.stopped and r.waiting is None else 98.0
            records.append(
                {
                    "t": round(now, 3),
                    "rank": r.rank,
                    "kind": "sys",
                    "pid": r.pid,
                    "rss_mib": round(5200 + 3 * r.local + random.random(), 1),
                    "cpu_pct": round(stuck + random.random() * 4, 1),
                    "nproc": 6,
                    "gpu": r.local,
                    "gpu_util": 97 if not r.stopped else 0,
                    "gpu_mem_used_mib": 61000 + r.local,
                    "gpu_mem_total_mib": 81559,
                    "proc_gpu_mem_mib": 60500,
                }
            )
        rows = self.summary.take()
        self.sim.rows += sum(1 for row in rows if row.get("kind") == "train")
        self.forward(records + rows)

    def stacks(self, ask: StacksAsk) -> None:
        """Answer node 0's stacks request as a follower does: every rank's entry, one message."""
        want = ask.rank
        entries = []
        for r in self.ranks:
            if want is not None and r.rank != want:
                continue
            where = "allreduce" if r.waiting is not None else "stuck" if r.stopped else "step"
            threads = [
                {"name": "MainThread", "frames": _frames(where)},
                {
                    "name": "xl-log",
                    "frames": [
                        {
                            "file": "/opt/venv/lib/python3.11/threading.py",
                            "line": 331,
                            "function": "wait",
                        }
                    ],
                },
            ]
            seq = self.sim.block_seq
            colls: list[dict[str, Any]] = []
            # the Flight Recorder's last entries: #N-1 done by all; #N begun by the waiting
            if seq is not None:
                colls.append({"pg": "0", "seq": seq - 1, "op": "allreduce", "state": "completed"})
                if r.waiting is not None:
                    colls.append({"pg": "0", "seq": seq, "op": "allreduce", "state": "scheduled"})
            entries.append(
                {
                    "rank": r.rank,
                    "node": self.host,
                    "pid": r.pid,
                    "threads": threads,
                    "collectives": colls,
                }
            )
        self.link.send(StacksMessage(ask.id, clip_stacks(entries)))
        self.sim.stacks_answered += 1

    def end(self, status: str) -> None:
        """The node's part ends as its supervisor's does after a stop: its ranks' exits, then its
        end."""
        if self.ended:
            return
        self.ended = True
        code = -15 if status == "stopped" else 0
        state = "stopped" if status == "stopped" else "exited"
        now = time.time()
        for r in self.ranks:
            r.stopped = True
            self.link.send(
                EventMessage(
                    EventKind.RANK_EXITED,
                    {
                        "t": now,
                        "kind": "rank_exited",
                        "rank": r.rank,
                        "exit_code": code,
                        "message": f"rank {r.rank} {state}",
                    },
                )
            )
        self.link.send(RanksMessage(self.rows(state, code)))
        self.link.send(
            EventMessage(
                EventKind.RUN_ENDED,
                {"t": now, "kind": "run_ended", "status": status, "message": f"run {status}"},
            )
        )
        self.link.send(EndMessage(RunStatus(status), None, now))


class Sim:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.host, self.port, self.token = cfg["host"], int(cfg["port"]), str(cfg["token"])
        self.rpn = int(cfg["ranks_per_node"])
        self.world = int(cfg["world"])
        self.step_s = 1.0 / float(cfg["steps_per_s"])
        self.log_every = int(cfg["log_every"])
        self.culprit = int(cfg["culprit"])
        self.nodes = [Node(self, n) for n in cfg["nodes"]]
        self.rows = 0  # summary rows sent
        self.records = 0  # train lines the ranks gave their node
        self.log_lines = 0
        self.stacks_answered = 0
        self.connected = 0
        self.refused = 0
        self.stalled_at: float | None = None
        self.block_seq: int | None = None
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="sim-stacks")

    async def connect_all(self) -> None:
        """Its ranks talk to their own node (simulated here): nothing dials node 0 per rank."""
        self.connected = sum(len(n.ranks) for n in self.nodes)

    def _step(self, node: Node, r: Rank, now: float) -> None:
        r.step += 1
        data_s = 0.02 + 0.01 * random.random()
        comm_s = 0.08 + 0.02 * random.random()
        compute_s = self.step_s - data_s - comm_s - 0.01
        scalars = {
            "step": r.step,
            "loss": round(4.0 * math.exp(-r.step / 3000) + 0.05 * random.random(), 5),
            "samples": 32,
            "step_s": round(self.step_s, 5),
            "data_s": round(data_s, 5),
            "compute_s": round(compute_s, 5),
            "comm_s": round(comm_s, 5),
            "other_s": 0.01,
        }
        line = train_line(now, scalars, r.rank, r.rates)
        if line is not None:
            node.summary.add(r.rank, [json.loads(line)])  # as its node's collector takes it
            self.records += 1
            r.last_step_t = round(now, 6)
        if self.log_every and r.step % self.log_every == 0:
            node.link.send_log(
                r.rank,
                f"step {r.step} loss {scalars['loss']:.4f} lr 3.0e-04 {self.step_s * 1000:.0f} "
                "ms/step\n".encode(),
            )
            self.log_lines += 1

    async def run_node(self, node: Node) -> None:
        # nodes step out of phase with each other
        await asyncio.sleep(random.random() * self.step_s)
        next_step = time.monotonic()
        next_sample = time.monotonic() + random.random()
        while not self.stopping and not node.ended:
            now_m = time.monotonic()
            if now_m >= next_step:
                next_step += self.step_s
                if next_step < now_m:  # fell behind (a loaded machine): skip, do not burst
                    next_step = now_m + self.step_s
                now = time.time()
                for r in node.ranks:
                    if not r.stopped:
                        self._step(node, r, now)
            if now_m >= next_sample:
                next_sample += 1.0
                if next_sample < now_m:
                    next_sample = now_m + 1.0
                node.sample(time.time())
            for cmd in node.link.commands():
                if isinstance(cmd, StacksAsk):
                    # a follower answers on a thread of its own
                    self.pool.submit(node.stacks, cmd)
                elif isinstance(cmd, StopCommand):
                    node.end("stopped")
                elif isinstance(cmd, Refused):
                    self.refused += 1
            await asyncio.sleep(
                max(0.0, min(next_step, next_sample, time.monotonic() + 0.2) - time.monotonic())
            )

    # -- commands --------------------------------------------------------------------------------

    def stall(self) -> dict[str, Any]:
        for node in self.nodes:
            for r in node.ranks:
                if r.rank == self.culprit:
                    r.stopped = True
                    self.stalled_at = time.time()
                    return {"stalled": r.rank, "last_step_t": r.last_step_t, "last_step": r.step}
        return {"stalled": None}

    def block(self, seq: int) -> dict[str, Any]:
        self.block_seq = seq
        blocked = 0
        for node in self.nodes:
            for r in node.ranks:
                if r.rank != self.culprit and not r.stopped:
                    r.stopped, r.waiting = True, seq
                    blocked += 1
        return {"blocked": blocked}

    def stats(self) -> dict[str, Any]:
        return {
            "frames": self.rows,
            "records": self.records,
            "log_lines": self.log_lines,
            "connected": self.connected,
            "refused": self.refused,
            "stacks_answered": self.stacks_answered,
            "link_dropped": sum(n.link.dropped for n in self.nodes),
            "links_refused": sum(1 for n in self.nodes if n.link.refused),
            "nodes_ended": sum(1 for n in self.nodes if n.ended),
        }

    def command(self, line: str) -> None:
        cmd = line.strip()
        if cmd == "stall":
            _say(self.stall())
        elif cmd.startswith("block ") and cmd[6:].isdigit():
            _say(self.block(int(cmd[6:])))
        elif cmd == "stats":
            _say({"stats": self.stats()})
        elif cmd == "stop":
            for node in self.nodes:
                node.end("stopped")
            _say({"stopping": len(self.nodes)})

    async def main(self) -> None:
        self.loop = asyncio.get_running_loop()
        for node in self.nodes:
            node.begin()
        await self.connect_all()
        _say({"ready": self.connected, "refused": self.refused})

        loop = self.loop

        def read_stdin() -> None:
            for line in sys.stdin:
                loop.call_soon_threadsafe(self.command, line)
            loop.call_soon_threadsafe(setattr, self, "stopping", True)  # the bench is gone

        threading.Thread(target=read_stdin, name="sim-stdin", daemon=True).start()
        await asyncio.gather(*(self.run_node(n) for n in self.nodes))
        # Every node's last words reach node 0 before the links close.
        await asyncio.gather(
            *(self.loop.run_in_executor(self.pool, n.link.close, 5.0) for n in self.nodes)
        )
        _say({"done": self.stats()})


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: scale_sim.py CONFIG_JSON", file=sys.stderr)
        return 2
    cfg = json.loads(argv[0])
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a socket per simulated rank
    random.seed(int(cfg.get("seed", 0)) + os.getpid())
    asyncio.run(Sim(cfg).main())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
