"""A big run in memory for the Monitor's tests and its timing script: RankViews of N ranks on
nodes of 8, served by a reader that hands out a new RunView each poll (no run directory).

``python tests/tui/big_monitor_run.py [RANKS [PID_FILE]]`` opens the Monitor on the troubled run
in this terminal (as `xl attach` would), its ranks stepping every second, having written its pid to
PID_FILE: the tmux test's app.

The run's ground truth is the ``FakeRun`` itself: each rank's step time, split and state are what
the test set, so a test checks the Monitor's node rows and outliers against them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from pathlib import Path
from typing import Any

from xl.launcher.rundir.runrecord import RunRecord
from xl.launcher.view.reader import RunReader
from xl.launcher.view.runview import Point, Points, RankView, RunView
from xl.tui.backend import LocalBackend

T0 = 1_780_000_000.0
PER_NODE = 8
SLOW_NODE = 5  # troubled(): its ranks wait 0.6 s a step longer for data, 1.1 s against 0.5 s
FAILED, STALLED = 77, 100
# A healthy rank's split of its step: data, compute, comm, other (seconds), 0.5 s in all.
SPLIT = (0.02, 0.40, 0.05, 0.03)


def host(node: int) -> str:
    return f"gpu-node-{node:03d}"


class FakeRun:
    """Ranks 0..N-1, 8 a node, stepping every second since T0 (``now`` seconds in)."""

    def __init__(self, ranks: int, *, now: float = 60.0, history: int = 60) -> None:
        self.lock = threading.Lock()
        self.now = now
        self.status = "running"
        self.history = history
        self.ranks: dict[int, RankView] = {}
        self._histories: dict[int, tuple[list[Point], list[Point]]] = {}  # rank -> loss, samples/s
        for r in range(ranks):
            jitter = 1.0 + 0.02 * ((r * 7) % 5 - 2) / 2  # within ±2%: an even run
            self.set(r, split=tuple(p * jitter for p in SPLIT))

    def set(
        self,
        rank: int,
        *,
        split: tuple[float, ...] | None = None,
        state: str = "running",
        exit_code: int | None = None,
        diagnosis: str | None = None,
        straggler_phase: str | None = None,
    ) -> None:
        split = split or SPLIT
        step_s = sum(split)
        n = self.history
        # Grown by tick() and handed out as the reader does: Points over a list only appended to.
        losses = [(T0 + self.now - n + i, 4.0 - i * 0.01 + rank * 1e-4) for i in range(n)]
        rates = [(T0 + self.now - n + i, 8 / step_s) for i in range(n)]
        self._histories[rank] = (losses, rates)
        with self.lock:
            self.ranks[rank] = RankView(
                rank=rank,
                host=host(rank // PER_NODE),
                node_rank=rank // PER_NODE,
                gpu=rank % PER_NODE,
                pid=1000 + rank,
                state=state,
                step=float(int(self.now / step_s)),
                total_steps=1000.0,
                loss=losses[-1][1],
                samples_per_s=8 / step_s,
                step_s=step_s,
                data_s=split[0],
                compute_s=split[1],
                comm_s=split[2],
                other_s=split[3],
                last_seen=T0 + self.now,
                exit_code=exit_code,
                diagnosis=diagnosis,
                straggler_phase=straggler_phase,
                loss_history=Points(losses),
                samples_history=Points(rates),
            )

    def tick(self, seconds: float = 1.0) -> None:
        """Every running rank a second further: a new point on each history."""
        with self.lock:
            self.now += seconds
            for r, rv in list(self.ranks.items()):
                if rv.state != "running":
                    continue
                t = T0 + self.now
                losses, rates = self._histories[r]
                losses.append((t, losses[-1][1] - 0.01))
                rates.append((t, rates[-1][1]))
                self.ranks[r] = dataclasses.replace(
                    rv,
                    step=(rv.step or 0) + 1,
                    last_seen=t,
                    loss=losses[-1][1],
                    loss_history=Points(losses),
                    samples_history=Points(rates),
                )

    def view(self) -> RunView:
        with self.lock:
            nodes = len({rv.node_rank for rv in self.ranks.values()})
            record = RunRecord.from_json(
                {
                    "run_id": "20261128-big",
                    "name": "big-run",
                    "status": self.status,
                    "world_size": len(self.ranks),
                    "nnodes": nodes,
                    "started_at": T0,
                }
            )
            return RunView(record=record, ranks=dict(self.ranks), events=[], new_events=[])


class FakeReader(RunReader):
    """RunReader's surface the Monitor uses, answered from a FakeRun."""

    def __init__(self, run: FakeRun, run_dir: Path) -> None:
        self.run = run
        self.run_dir = run_dir
        self.polls = 0

    def poll(self, *args: Any, **kwargs: Any) -> RunView:  # type: ignore[override]
        self.polls += 1
        return self.run.view()

    def new_log_lines(self, rank: int, restart: bool = False) -> list[str]:  # type: ignore[override]
        return [f"[rank {rank}] step {self.polls}"]

    def log_skipped(self, rank: int) -> int:
        return 0

    def log_path(self, rank: int) -> Path:
        return self.run_dir / "logs" / f"rank{rank}.log"


class FakeRunBackend(LocalBackend):
    def __init__(self, run: FakeRun) -> None:
        super().__init__()
        self.run = run

    def reader(self, run_dir: Path) -> RunReader:
        return FakeReader(self.run, run_dir)

    def run_status(self, run_dir: Path) -> str | None:
        return self.run.status


def troubled(ranks: int = 128) -> FakeRun:
    """``ranks`` ranks, of which SLOW_NODE's are slow in data (one a straggler), FAILED failed
    (exit code 3) and STALLED stalled."""
    run = FakeRun(ranks)
    for r in range(SLOW_NODE * PER_NODE, SLOW_NODE * PER_NODE + PER_NODE):
        run.set(r, split=(0.62, 0.40, 0.05, 0.03))
    run.set(
        SLOW_NODE * PER_NODE + 1,
        split=(0.64, 0.40, 0.05, 0.03),
        state="straggler",
        diagnosis="rank 41 is 2.2x slower than the median rank",
        straggler_phase="data",
    )
    run.set(FAILED, state="failed", exit_code=3)
    run.set(STALLED, state="stalled", diagnosis="rank 100 has not stepped for 45 s")
    return run


def main(argv: list[str]) -> int:
    from xl.tui.app import build_app  # noqa: PLC0415 - the script's alone: the tests need no app

    run = troubled(int(argv[0]) if argv else 128)
    if len(argv) > 1:
        Path(argv[1]).write_text(str(os.getpid()))
    stop = threading.Event()

    def step() -> None:
        while not stop.wait(1.0):
            run.tick()

    threading.Thread(target=step, daemon=True).start()
    app = build_app(
        FakeRunBackend(run),
        monitor_run_dir=Path("/nonexistent/20261128-big"),
        attach_only=True,
        clock=lambda: T0 + run.now,
    )
    app.run()
    stop.set()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
