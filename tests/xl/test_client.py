"""xl.log / xl.flush as a training script sees them: real rank processes, a real collector."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from eventlines import Lines
from xltele import assert_gone, rank_env

from xl.launcher.rundir.layout import RunLayout
from xl.launcher.telemetry.service import Telemetry
from xl.launcher.view.reader import RunReader


def _rank(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a rank-like script; afterwards neither it nor anything it printed as a pid lives."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=rank_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    pids = {proc.pid} | {int(w[4:]) for w in out.split() if w.startswith("pid=")}
    assert_gone(pids)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _strict(path: Path) -> list[dict]:
    def no_constants(name: str) -> None:
        raise AssertionError(f"non-strict JSON constant {name} in {path.name}")

    return [
        json.loads(line, parse_constant=no_constants)
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def test_outside_a_run_log_is_a_no_op_without_threads_or_sockets() -> None:
    code = (
        "import sys, threading, xl\n"
        "for i in range(1000):\n"
        "    xl.log(step=i, loss=0.5, samples=8)\n"
        "    xl.log({'loss': 0.5}, 'junk')\n"
        "print(xl.watch('not a model'), xl.flush(), threading.active_count(),\n"
        "      'socket' in sys.modules and 'xl.launcher.telemetry.collector' in sys.modules)\n"
    )
    out = _rank(code, {}).stdout.split()
    assert out == ["not", "a", "model", "True", "1", "False"]


@pytest.mark.e2e
def test_every_record_stored_with_tensors_rates_and_nonfinite_loss(tmp_path: Path) -> None:
    events = Lines()
    tel = Telemetry(tmp_path, token="tok", emit_event=events, inventory=False)
    env = tel.start()
    code = (
        "import math, time, torch, xl\n"
        "for i in range(1, 401):\n"
        "    loss = torch.tensor(float('nan') if i == 300 else 1.0 / i)\n"
        "    xl.log({'lr': torch.tensor(0.1), 'loss': 99.0}, step=i, loss=loss, samples=32,"
        " tokens=4096, rank='user rank', note='x' * 1000, bad=[1, 2])\n"
        "    if i % 100 == 0:\n"
        "        time.sleep(0.05)\n"
    )
    try:
        _rank(code, {**env, "XL_RUN_DIR": str(tmp_path), "RANK": "3", "LOCAL_RANK": "1"})
    finally:
        tel.stop()
    train = [r for r in _strict(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert sorted(r["step"] for r in train) == list(range(1, 401))
    assert {r["rank"] for r in train} == {3}
    by_step = {r["step"]: r for r in train}
    assert by_step[4]["loss"] == pytest.approx(0.25)
    assert by_step[4]["lr"] == pytest.approx(0.1)
    # A scalar named like a reserved field is kept under another name, never overwriting it.
    assert by_step[4]["user_rank"] == "user rank"
    assert len(by_step[4]["note"]) == 256
    assert "bad" not in by_step[4]  # not a scalar: left out, the rest of the record kept
    # Rates come from consecutive records; the first record has nothing to compare with.
    assert "samples_per_s" not in by_step[1]
    assert all(by_step[i]["samples_per_s"] > 0 for i in range(2, 401))
    assert by_step[50]["tokens_per_s"] == pytest.approx(by_step[50]["samples_per_s"] * 128)
    assert by_step[300]["loss"] is None and by_step[300]["nonfinite"] == {"loss": "nan"}
    nan_events = [e for e in events if e["kind"] == "nan_loss"]
    assert len(nan_events) == 1 and nan_events[0]["rank"] == 3 and nan_events[0]["step"] == 300
    view = RunReader(tmp_path).poll()
    assert view.ranks[3].step == 400
    assert view.ranks[3].loss == pytest.approx(1 / 400)


@pytest.mark.e2e
def test_unreachable_collector_spools_and_the_supervisor_stores_it(tmp_path: Path) -> None:
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens here once the socket closes
    code = (
        "import os, xl\nfor i in range(1, 301):\n    xl.log(step=i, loss=1.0)\nprint(os.getpid())\n"
    )
    env = {"XL_COLLECTOR": f"127.0.0.1:{port}", "XL_TOKEN": "tok", "XL_RUN_DIR": str(tmp_path)}
    pid = int(_rank(code, {**env, "RANK": "1"}).stdout.split()[-1])
    assert RunLayout(tmp_path).spool_file(1, pid).exists()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    # A (re)started supervisor stores what the dead rank spooled, exactly once.
    tel = Telemetry(tmp_path, token="tok", inventory=False)
    tel.start()
    tel.stop()
    tel = Telemetry(tmp_path, token="tok", inventory=False)
    tel.start()
    tel.stop()
    steps = [r["step"] for r in _strict(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert sorted(steps) == list(range(1, 301))
    assert not list((tmp_path / "spool").iterdir())


@pytest.mark.e2e
def test_a_full_queue_drops_are_counted_and_reported(tmp_path: Path) -> None:
    events = Lines()
    tel = Telemetry(tmp_path, token="tok", emit_event=events, inventory=False)
    env = tel.start()
    # flush() says True while everything was stored, and False once anything was dropped.
    code = (
        "import xl\nxl.log(step=-1)\nprint('first', xl.flush(10))\n"
        "for i in range(20000):\n    xl.log(step=i)\nprint('after drops', xl.flush(10))\n"
    )
    try:
        out = _rank(
            code, {**env, "XL_RUN_DIR": str(tmp_path), "XL_LOG_QUEUE": "50", "RANK": "0"}
        ).stdout
    finally:
        tel.stop()
    assert "first True" in out and "after drops False" in out, out
    stored = [r for r in _strict(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    dropped = sum(e["count"] for e in events if e["kind"] == "dropped")
    assert dropped > 0, "a 50-slot queue fed 20000 calls in a tight loop must overflow"
    assert len(stored) + dropped == 20001
    assert all(
        e["rank"] == 0 and "dropped" in e["message"] for e in events if e["kind"] == "dropped"
    )


@pytest.mark.e2e
def test_a_forked_child_logs_on_its_own_and_nothing_is_sent_twice(tmp_path: Path) -> None:
    tel = Telemetry(tmp_path, token="tok", inventory=False)
    env = tel.start()
    code = (
        "import os, xl\n"
        "log = xl.log\n"
        "for i in range(100):\n"
        "    log(step=i, who=0)\n"
        "pid = os.fork()\n"
        "print(f'pid={pid}' if pid else '', flush=True)\n"
        "if pid == 0:\n"
        "    for i in range(100, 150):\n"
        "        log(step=i, who=1)\n"
        "    ok = xl.flush(10)\n"
        "    os._exit(0 if ok else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "assert status == 0, status\n"
        "for i in range(150, 200):\n"
        "    log(step=i, who=0)\n"
    )
    try:
        _rank(code, {**env, "XL_RUN_DIR": str(tmp_path), "RANK": "0"})
    finally:
        tel.stop()
    train = [r for r in _strict(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert sorted(r["step"] for r in train) == list(range(200))
    assert {r["step"] for r in train if r["who"] == 1} == set(range(100, 150))


@pytest.mark.e2e
def test_odd_values_never_raise_and_what_can_be_stored_is(tmp_path: Path) -> None:
    tel = Telemetry(tmp_path, token="tok", inventory=False)
    env = tel.start()
    code = (
        "import numpy as np, xl\n"
        "class Broken:\n"
        "    ndim = 0\n"
        "    def item(self):\n"
        "        raise RuntimeError('device lost')\n"
        "xl.log(step=1, a=np.float32(0.5), b=np.int64(7), c=np.array(2.5), broken=Broken(),\n"
        "       flag=True, none=None, big=2**70, vec=np.zeros(3), obj=object())\n"
        "xl.log(step=2, **{f'k{i}': i for i in range(200)})\n"
        "xl.log(step=3, **{'x' * 500: 1.0})\n"
    )
    try:
        _rank(code, {**env, "XL_RUN_DIR": str(tmp_path), "RANK": "0"})
    finally:
        tel.stop()
    by_step = {r["step"]: r for r in _strict(tmp_path / "metrics.jsonl") if r["kind"] == "train"}
    first = by_step[1]
    assert (first["a"], first["b"], first["c"]) == (0.5, 7, 2.5)
    assert (first["flag"], first["none"], first["big"]) == (True, None, 2**70)
    assert not {"broken", "vec", "obj"} & set(first)
    assert 40 <= len(by_step[2]) <= 64  # capped, not rejected
    assert by_step[3]["x" * 64] == 1.0


def test_a_rank_whose_only_lines_are_torchs_steps_wakes_less_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each wake-up takes the GIL from the training thread: with nothing but the steps' line (one
    # per LINE_EVERY_S slot of the wall-clock grid) the sender wakes once a slot, just after its
    # line is due; an xl.log call brings back INTERVAL_S for its lines' latency, until a wake-up
    # finds nothing logged again.
    from xl.client import sender as sender_mod  # noqa: PLC0415 - the module under test, in-process
    from xl.integrations.steplines import LINE_EVERY_S  # noqa: PLC0415 - as above

    monkeypatch.delenv("XL_COLLECTOR", raising=False)
    sender = sender_mod.Sender()  # its thread is never started here
    assert sender.interval() == sender_mod.INTERVAL_S  # plain xl.log, no torch: as always
    sender.step_source = lambda given, final: None
    sender.step_grid = (LINE_EVERY_S, 0.05)
    assert 0 < sender.interval() <= LINE_EVERY_S
    assert LINE_EVERY_S < 1.0  # a line each wake-up, several a second
    sender.queue.append((1.0, {"accuracy": 0.5}))
    sender._drain_queue()
    assert sender.interval() == sender_mod.INTERVAL_S
    sender._drain_queue()  # nothing logged since
    assert 0 < sender.interval() <= LINE_EVERY_S
