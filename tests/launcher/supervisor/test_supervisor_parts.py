"""The supervisor's parts, driven directly: its state is values (a rank's phase, the stop, the
root cause), with plain processes standing in for ranks and no torchrun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakeranks import end_rank as _end
from fakeranks import events as _events
from fakeranks import fake_rank as _fake_rank
from fakeranks import unit_run_dir as _unit_run_dir
from procs import run_json, wait_for

from xl.launcher.rundir import runrecord as run_record
from xl.launcher.rundir.runrecord import RunStatus
from xl.launcher.supervisor.failure import RootCause
from xl.launcher.supervisor.journal import Journal
from xl.launcher.supervisor.logsink import LogSink
from xl.launcher.supervisor.loop import Supervisor
from xl.launcher.supervisor.ranks import Change, Ranks
from xl.launcher.supervisor.stopping import StopReason, grace_from_env


def test_first_failing_rank_is_the_cause_and_a_rank_ignoring_sigterm_is_killed(
    tmp_path: Path,
) -> None:
    # the cause's first reading (its imports) is within it
    run_dir = _unit_run_dir(tmp_path, grace=2.0)
    sup = Supervisor(run_dir)
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    failed.wait(10)
    stubborn = _fake_rank(ignore_term=True)
    try:
        sup.act(sup.ranks.hello(0, failed.pid))
        sup.act(sup.ranks.hello(1, stubborn.pid))
        tb = "Traceback (most recent call last):\nValueError: boom\n"
        (run_dir / "ranks" / "rank-0.json").write_text(
            json.dumps(
                {
                    "pid": failed.pid,
                    "local_rank": 0,
                    "exit_code": 3,
                    "traceback": tb,
                    "ended_at": time.time(),
                }
            )
        )
        sup.act(sup.ranks.scan_records())
        stop = sup.stopping.current
        assert stop is not None and stop.reason is StopReason.FAILURE
        # what the loop's turn does next
        assert sup.cause.decide(sup.ranks, None, sup.sink.drain) is not None
        time.sleep(0.1)
        sup.stopping.advance()
        assert stubborn.poll() is None  # SIGTERM ignored, and the grace is not over
        time.sleep(2.0)
        sup.stopping.advance()
        assert stubborn.wait(5) == -signal.SIGKILL
        sup.act(sup.ranks.check_alive())
        status = sup.finish()
    finally:
        _end(stubborn)
    assert status is RunStatus.FAILED and status.exit_code == 1
    run = run_json(run_dir)
    assert run["status"] == "failed" and run["ended_at"] is not None
    assert run["failure"] == {
        "rank": 0,
        "exit_code": 3,
        "traceback": tb,
        "error": None,
        "message": "rank 0 failed first: rank 0 exited with code 3",
        "node": "here",
        "node_rank": 0,
        "cause": {
            "kind": "exception",
            "summary": "ValueError: boom",
            "fix": None,
            "evidence": ["ValueError: boom"],
        },
    }
    assert [(r["rank"], r["state"], r["exit_code"]) for r in run["ranks"]] == [
        (0, "failed", 3),
        (1, "stopped", -9),
    ]
    events = _events(run_dir)
    assert [e["kind"] for e in events] == [
        "rank_started", "rank_started", "rank_exited", "failure", "rank_exited", "run_ended",
    ]
    assert events[-1]["status"] == "failed" and events[-1]["message"] == "run failed"
    # As the rank table shows it: stopped, with its code (not "killed", not "exit code unknown").
    assert events[4]["message"] == "rank 1 stopped (-9)"


def test_a_requested_stop_ends_every_rank_as_stopped(tmp_path: Path) -> None:
    run_dir = _unit_run_dir(tmp_path)
    sup = Supervisor(run_dir)
    ranks = [_fake_rank(), _fake_rank()]
    try:
        for rank, proc in enumerate(ranks):
            sup.act(sup.ranks.hello(rank, proc.pid))
        sup.stopping.begin(StopReason.REQUESTED)
        assert [proc.wait(5) for proc in ranks] == [-signal.SIGTERM, -signal.SIGTERM]
        sup.act(sup.ranks.check_alive())
        status = sup.finish()
    finally:
        for proc in ranks:
            _end(proc)
    assert status is RunStatus.STOPPED and status.exit_code == 1
    run = run_json(run_dir)
    assert run["status"] == "stopped" and run["failure"] is None
    assert [(r["state"], r["exit_code"]) for r in run["ranks"]] == [
        ("stopped", -15),
        ("stopped", -15),
    ]
    exits = [e["message"] for e in _events(run_dir) if e["kind"] == "rank_exited"]
    assert exits == ["rank 0 stopped (-15)", "rank 1 stopped (-15)"], exits


def _ended_ranks(tmp_path: Path) -> tuple[Path, Journal, Ranks, RootCause]:
    """A 2-rank run's journal, ranks (pids 1000 and 1001, ended at 100 and 101) and root cause."""
    run_dir = _unit_run_dir(tmp_path)
    record = run_record.load(run_dir)
    assert record is not None
    journal = Journal(run_dir, record)
    ranks = Ranks(run_dir, record)
    for st in ranks:
        st.pid, st.ended_at = 1000 + st.rank, 100.0 + st.rank
    return run_dir, journal, ranks, RootCause(run_dir, "here", 0, journal)


def test_torchrun_summary_names_the_rank_that_really_failed(tmp_path: Path) -> None:
    """Rank 0 was found first (SIGTERM: torchrun's closing signal, its summary says so); the
    rank that died of its own signal is the cause, decided once torchrun's summary is in, and
    one failure event says so."""
    run_dir, _journal, ranks, cause = _ended_ranks(tmp_path)
    rank0, rank1 = ranks.get(0), ranks.get(1)
    assert rank0 is not None and rank1 is not None
    rank0.end(None, 100.0, stopped=False)
    rank0.vanished = rank1.vanished = True
    rank1.end(None, 101.0, stopped=True)  # found while the stop was under way
    rank0.alive_at, rank1.alive_at = 100.0, 99.0
    cause.suspect(rank0)
    # gone without a word: their signals first (torchrun's report has not come)
    assert cause.decide(ranks, None, lambda rank: None) is None and cause.deciding
    (run_dir / "logs" / "torchrun.log").write_text(
        "Sending process 1000 closing signal SIGTERM\n"
        "Failures:\n[1]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -6 (pid: 1001)\n"
        "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode "
        " : -15 (pid: 1000)\n"
    )
    failure = cause.decide(ranks, 1, lambda rank: None)
    assert failure is not None and cause.failure is failure
    assert (failure.rank, failure.exit_code) == (1, -6)
    assert failure.message == "rank 1 failed first: rank 1 was killed by SIGABRT"
    assert (
        failure.cause is not None
        and failure.cause.kind.value == "exception"
        and failure.cause.summary.startswith("aborted (SIGABRT)")
    )
    assert [(st.state.value, st.exit_code) for st in ranks] == [("stopped", -15), ("failed", -6)]
    failures = [e for e in _events(run_dir) if e["kind"] == "failure"]
    assert (
        len(failures) == 1
        and failures[0]["rank"] == 1
        and failures[0]["cause"]["kind"] == "exception"
    )


def test_a_rank_whose_script_returned_and_whose_process_then_aborted_is_the_cause(
    tmp_path: Path,
) -> None:
    """Both ranks' records say 0 (their scripts returned); torchrun failed, and its summary has
    rank 0 killed by SIGABRT (a C++ abort at interpreter exit): rank 0 failed, and is named with
    its signal, not "rank None" with torchrun's traceback; its last line is evidence in its
    cause, not glued onto the message as if it were the cause."""
    run_dir, journal, ranks, cause = _ended_ranks(tmp_path)
    for st in ranks:
        st.end(0, st.ended_at, stopped=False)
    (run_dir / "logs" / "rank-0.log").write_text(
        "step 6/6\nterminate called without an active exception\n"
    )
    (run_dir / "logs" / "torchrun.log").write_text(
        "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode "
        " : -6 (pid: 1000)\n"
    )
    cause.fill_from_torchrun_log(ranks, torchrun_code=1)
    assert cause.conclude(False, 1, False, ranks) is RunStatus.FAILED
    assert cause.failure is not None and (cause.failure.rank, cause.failure.exit_code) == (0, -6)
    assert (
        cause.failure.message
        == "rank 0 failed first: rank 0 was killed by SIGABRT after its script had returned"
    )
    assert cause.failure.cause is not None
    assert (
        cause.failure.cause.summary
        == "aborted (SIGABRT) after: terminate called without an active exception"
    )
    assert cause.failure.traceback == "step 6/6\nterminate called without an active exception\n"
    assert [(st.state.value, st.exit_code) for st in ranks] == [("failed", -6), ("exited", 0)]
    failures = [e for e in _events(run_dir) if e["kind"] == "failure"]
    assert len(failures) == 1 and failures[0]["rank"] == 0
    # A run whose torchrun succeeded is not read for this: nothing failed.
    ok = RootCause(run_dir, "here", 0, journal)
    for st in ranks:
        st.end(0, st.ended_at, stopped=False)
    ok.fill_from_torchrun_log(ranks, torchrun_code=0)
    assert ok.conclude(False, 0, False, ranks) is RunStatus.SUCCEEDED and ok.failure is None


def test_no_rank_started_the_failure_quotes_torchrun(tmp_path: Path) -> None:
    run_dir = _unit_run_dir(tmp_path)
    sup = Supervisor(run_dir)
    (run_dir / "logs" / "torchrun.log").write_text(
        "\nusage: torchrun ...\n\ntorchrun: error: bad --nnodes\n"
    )
    sup.torchrun.code = 2
    assert sup.ranks.all_done(sup.torchrun.code, stopping=False)
    status = sup.finish()
    assert status is RunStatus.FAILED
    run = run_json(run_dir)
    assert run["failure"]["rank"] is None and run["failure"]["exit_code"] == 2
    assert run["failure"]["traceback"] == "usage: torchrun ...\ntorchrun: error: bad --nnodes"
    assert run["failure"]["message"] == "torchrun exited with code 2 (see logs/torchrun.log)"
    assert [r["state"] for r in run["ranks"]] == ["failed", "failed"]


def test_log_sink_reads_each_rank_log_as_it_grows_and_parses_whole_lines(tmp_path: Path) -> None:
    run_dir = _unit_run_dir(tmp_path)
    lines: list[tuple[int, str]] = []
    sink = LogSink(run_dir)
    sink.on_line = lambda rank, line: lines.append((rank, line))
    log = run_dir / "logs" / "rank-1.log"
    log.write_bytes(b"epoch 1\n 10%|#\r 20%|##\rhalf a li")
    sink.tail()
    assert lines == [(1, "epoch 1"), (1, " 10%|#"), (1, " 20%|##")]
    with open(log, "ab") as fh:
        fh.write(b"ne\nlast without newline")
    sink.tail()
    sink.close_logs()
    assert lines[3:] == [(1, "half a line"), (1, "last without newline")]
    # Another node's rank output (node 0 of several) is written here, and not read back.
    assert sink.append(5, b"remote\npart", b"") == b"part"
    assert (run_dir / "logs" / "rank-5.log").read_bytes() == b"remote\npart"
    sink.tail()
    assert lines[-1] == (5, "remote")
    sink.close_all()


def test_log_chunks_nothing_may_use_are_not_split_into_lines(tmp_path: Path) -> None:
    """A flood of plain lines costs no call a line; a chunk holding one line worth parsing hands
    on every line of it, in order, as without the test; a bar's redraw is never lost."""
    from xl.launcher.telemetry.logparse import worth_parsing  # noqa: PLC0415 - the test the supervisor is given

    run_dir = _unit_run_dir(tmp_path)
    lines: list[tuple[int, str]] = []
    asked: list[str] = []

    def wants(text: str) -> bool:
        asked.append(text)
        return worth_parsing(text)

    sink = LogSink(
        run_dir,
        on_line=lambda rank, line: lines.append((rank, line)),
        wants=wants,
    )
    log = run_dir / "logs" / "rank-0.log"
    log.write_bytes(b"".join(b"plain line %d\n" % i for i in range(5000)))
    sink.tail()
    assert lines == [] and len(asked) == 1  # one test for the whole chunk, no line handed on
    with open(log, "ab") as fh:
        fh.write(b"before\n 50%|#####     | 5/10 [00:01<00:01, 4.00it/s]\nafter\n")
    sink.tail()
    assert lines == [
        (0, "before"),
        (0, " 50%|#####     | 5/10 [00:01<00:01, 4.00it/s]"),
        (0, "after"),
    ]
    with open(log, "ab") as fh:
        fh.write(b"\r 60%|######    | 6/10 [00:01<00:01, 4.00it/s]")
    sink.tail()
    sink.tail()  # a tick without news: the redraw is whole
    assert lines[-1] == (0, " 60%|######    | 6/10 [00:01<00:01, 4.00it/s]")
    with open(log, "ab") as fh:
        fh.write(b"\nplain again\n")
    sink.close_logs()
    # The chunk that ends the redraw holds it: its lines go on as ever, the redraw not twice.
    assert lines[-2:] == [(0, " 60%|######    | 6/10 [00:01<00:01, 4.00it/s]"), (0, "plain again")]


@pytest.mark.parametrize("chunk_test", [False, True], ids=["every line", "chunk test"])
@pytest.mark.parametrize("seed", [1, 2])
def test_log_sink_hands_on_every_line_once_in_order_however_the_log_grows(
    tmp_path: Path, seed: int, chunk_test: bool
) -> None:
    """A log grown by pieces that end anywhere (mid-line, between \\r and \\n, in a UTF-8
    character), read between the pieces: each line whole, once, in order; the bytes forwarded
    are the file's; with the chunk test, every line worth parsing still arrives."""
    import random  # noqa: PLC0415 - this test only

    from xl.launcher.telemetry.logparse import worth_parsing  # noqa: PLC0415 - the sink's test

    rng = random.Random(seed)
    words = ["loss 0.5", "{'loss': 0.25}", "", "é", "x" * 3000, "\x1b[2K"]
    ends = ["\n", "\r\n"]
    text = "".join(rng.choice(words) + rng.choice(ends) for _ in range(3000)) + "the end"
    data = text.encode()
    run_dir = _unit_run_dir(tmp_path)
    lines: list[tuple[int, str]] = []
    sink = LogSink(
        run_dir,
        on_line=lambda rank, line: lines.append((rank, line)),
        wants=worth_parsing if chunk_test else None,
    )
    at = 0
    with open(run_dir / "logs" / "rank-2.log", "ab") as fh:
        while at < len(data):
            step = rng.choice([1, 7, 100, 5000, 70000])
            fh.write(data[at : at + step])
            fh.flush()
            at += step
            if rng.random() < 0.3:
                sink.tail(budget=rng.choice([3, 1000, 1 << 20]))
    sink.close_logs()
    expected = text.replace("\r\n", "\n").split("\n")
    if chunk_test:
        worth = [line for line in expected if "{'" in line]
        assert [line for _, line in lines if "{'" in line] == worth
    else:
        assert lines == [(2, line) for line in expected]


def test_worth_parsing_holds_for_a_chunk_whenever_for_one_of_its_lines() -> None:
    """The supervisor tests whole chunks of output with it before splitting them into lines."""
    from xl.launcher.telemetry.logparse import worth_parsing  # noqa: PLC0415 - the property the supervisor relies on

    worth = [
        "{'loss': 0.5, 'epoch': 1.0}",
        " 50%|#####     | 5/10 [00:01<00:01, 4.00it/s]",
        "Epoch 1: 3/9 [00:02, 1.50s/it]",
    ]
    for line in worth:
        assert worth_parsing(line)
        for chunk in (f"a\n{line}\nb", f"{line}\n" * 2, f"x\r{line}"):
            assert worth_parsing(chunk), chunk
    assert not worth_parsing("plain\nlines 1/2\nonly")


@pytest.mark.parametrize(
    ("value", "grace"), [(None, 10.0), ("2.5", 2.5), ("-3", 0.0), ("soon", 10.0)]
)
def test_stop_grace_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str | None, grace: float
) -> None:
    if value is None:
        monkeypatch.delenv("XL_STOP_GRACE", raising=False)
    else:
        monkeypatch.setenv("XL_STOP_GRACE", value)
    assert grace_from_env() == grace


@pytest.mark.parametrize("given", [0, 1])
def test_node_1_s_rows_show_only_the_rank_torch_gave_it_whichever_node_joined_first(
    tmp_path: Path, given: int
) -> None:
    """Node 1 of two, one rank: torch numbers nodes in the order they join, so its rank is 1
    (it joined second) or 0 (it joined first). Until the rank reports, its number is only a
    guess (1) and run.json lists no row; once it reports, one row with the rank torch gave it.
    A viewer polling all along never shows a row for a rank this node does not have."""
    from xl.launcher.view.reader import RunReader  # noqa: PLC0415 - the viewer, only for this test

    run_dir = _unit_run_dir(tmp_path, nproc=1)
    data = json.loads((run_dir / "run.json").read_text())
    data.update(nnodes=2, node_rank=1, world_size=2, spec={"rdzv": "127.0.0.1:29400"})
    (run_dir / "run.json").write_text(json.dumps(data))
    record = run_record.load(run_dir)
    assert record is not None
    journal = Journal(run_dir, record)
    ranks = Ranks(run_dir, record)
    reader = RunReader(run_dir)
    journal.save(ranks.rows(), None)
    assert run_json(run_dir)["ranks"] == [] and reader.poll().ranks == {}
    env = {
        **os.environ,
        "XL_RUN_ID": record.run_id,
        "LOCAL_RANK": "0",
        "RANK": str(given),
        "WORLD_SIZE": "2",
    }
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        wait_for(
            lambda: (
                f"XL_RUN_ID={record.run_id}".encode()
                in Path(f"/proc/{rank.pid}/environ").read_bytes()
            ),
            timeout=10,
            what="the rank's environment",
        )
        (run_dir / "ranks" / f"rank-{given}.json").write_text(
            json.dumps({"rank": given, "local_rank": 0, "pid": rank.pid, "started_at": time.time()})
        )
        changes = ranks.scan_records()
        journal.save(ranks.rows(), None)
        rows = run_json(run_dir)["ranks"]
        assert [(r["rank"], r["pid"], r["state"]) for r in rows] == [
            (given, rank.pid, "running")
        ], rows
        started = [
            (c.change, c.st.rank)
            for c in changes
            if c.change is Change.STARTED and c.st is not None
        ]
        assert started == [(Change.STARTED, given)]
        assert sorted(reader.poll().ranks) == [given]
    finally:
        rank.kill()
        rank.wait(5)


@pytest.mark.parametrize(
    "said",
    [
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error "
        "[127.0.0.1]:4321: Connection reset by peer",
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Write error "
        "[127.0.0.1]:4321: Broken pipe",
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
        "peer [127.0.0.1]:52345",
        "torch.distributed.DistBackendError: NCCL error in: "
        "../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, remote process exited or "
        "there was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly "
        "due to a network error or a remote process exiting prematurely.",
    ],
)
def test_a_survivor_s_broken_collective_never_beats_the_rank_that_was_killed(
    tmp_path: Path, said: str
) -> None:
    """The survivor's record (its collective broke) is read first, the killed rank is found gone
    on the same turn: the killed rank is the cause, decided once its signal is known; the
    survivor is not blamed in between (no failure event until then)."""
    run_dir, _journal, ranks, cause = _ended_ranks(tmp_path)
    survivor, killed = ranks.get(0), ranks.get(1)
    assert survivor is not None and killed is not None
    survivor.error, survivor.traceback = said, f"Traceback (most recent call last):\n{said}"
    survivor.end(1, 100.5, stopped=False)
    cause.suspect(survivor)
    killed.vanished, killed.alive_at = True, 100.2
    killed.end(None, None, stopped=True)  # found gone once the stop had begun
    assert (
        cause.decide(ranks, None, lambda rank: None) is None
        and not (run_dir / "events.jsonl").exists()
    )
    (run_dir / "logs" / "torchrun.log").write_text(
        "E1128 01:02:03.000000 99 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
        "(exitcode: -9) local_rank: 1 (pid: 1001) of binary: python\n"
    )
    failure = cause.decide(ranks, 1, lambda rank: None)
    assert failure is not None and (failure.rank, failure.exit_code) == (1, -9)
    assert failure.message == "rank 1 failed first: rank 1 was killed by SIGKILL"
    assert failure.cause is not None and failure.cause.kind.value == "killed"
    assert [(st.state.value, st.exit_code) for st in ranks] == [("stopped", 1), ("failed", -9)]
    assert [e["rank"] for e in _events(run_dir) if e["kind"] == "failure"] == [1]


def test_a_rank_s_own_error_before_a_later_kill_is_the_cause(tmp_path: Path) -> None:
    """Both ways: rank 0 raised its own error, then rank 1 was killed (after it was last seen
    alive later than rank 0's end): rank 0 is the cause, decided at once."""
    run_dir, _journal, ranks, cause = _ended_ranks(tmp_path)
    first, later = ranks.get(0), ranks.get(1)
    assert first is not None and later is not None
    first.error, first.traceback = (
        "ValueError: bad batch",
        "Traceback (most recent call last):\nValueError: bad batch",
    )
    first.end(1, 100.0, stopped=False)
    cause.suspect(first)
    later.pid = os.getpid()  # running still (as this process is)
    failure = cause.decide(ranks, None, lambda rank: None)
    assert (
        failure is not None
        and failure.rank == 0
        and failure.message == "rank 0 failed first: ValueError: bad batch"
    )
    assert (
        failure.cause is not None
        and failure.cause.kind.value == "exception"
        and failure.cause.summary == "ValueError: bad batch"
    )
    later.pid, later.vanished, later.alive_at = 1001, True, 100.4
    later.end(-9, None, stopped=True)
    assert (
        cause.decide(ranks, 1, lambda rank: None, final=True) is None and cause.failure is failure
    )
    assert [e["rank"] for e in _events(run_dir) if e["kind"] == "failure"] == [0]


def test_a_survivor_aborted_by_its_watchdog_never_beats_the_rank_that_was_killed(
    tmp_path: Path,
) -> None:
    """NCCL's watchdog aborts the survivor (SIGABRT, its last words the timeout) after its peer
    was killed: both died of a signal, the survivor's says it lost its peer, the killed rank is
    the cause."""
    run_dir, _journal, ranks, cause = _ended_ranks(tmp_path)
    survivor, killed = ranks.get(0), ranks.get(1)
    assert survivor is not None and killed is not None
    (run_dir / "logs" / "rank-0.log").write_text(
        "step 120\n[rank0]:[E1128 01:02:03.456789 123 ProcessGroupNCCL.cpp:616] [Rank 0] "
        "Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=6, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=600000) ran for 600060 milliseconds "
        "before timing out.\nterminate called after throwing an instance of "
        "'c10::DistBackendError'\n"
    )
    # last seen before the killed rank was: time alone would blame it
    survivor.vanished, survivor.alive_at = True, 99.0
    survivor.end(None, None, stopped=False)
    cause.suspect(survivor)
    killed.vanished, killed.alive_at = True, 100.0
    killed.end(None, None, stopped=True)
    (run_dir / "logs" / "torchrun.log").write_text(
        "Failures:\n[1]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 1001)\n"
        "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode "
        " : -6 (pid: 1000)\n"
    )
    failure = cause.decide(ranks, 1, lambda rank: None)
    assert failure is not None and (failure.rank, failure.exit_code) == (1, -9)
    assert [(st.state.value, st.exit_code) for st in ranks] == [("stopped", -6), ("failed", -9)]
