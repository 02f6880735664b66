"""Multi-node for real, on one machine (tests/support/twonodes.py): when the link between the
nodes fails.

Node 0 declares a silent node lost after XL_NODE_TIMEOUT; node 1 trains on when node 0's
collector cannot be reached or its own supervisor alone is gone; a network link going down is
noticed on both sides (node 1 in a network namespace of its own, root only).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from procs import (
    first_run,
    only_run,
    rdzv_port,
    run_dirs,
    run_json,
    run_processes,
    wait_for,
    wait_no_processes,
    xl,
    xl_env,
)
from twonodes import (
    SCRIPT,
    TOKEN,
    cleanup,
    finish,
    logs_say,
    node_argv,
    own_ranks,
    run_events,
    start_nodes,
    train_records,
)

pytestmark = pytest.mark.e2e


def test_node_0_gives_up_on_a_late_node_only_when_its_heartbeat_is_lost(tmp_path: Path) -> None:
    """Node 0's ranks are done and node 1's work on; node 1 then goes silent without its
    connection closing (every process of it frozen, as on a hung machine): node 0 declares it
    lost after XL_NODE_TIMEOUT of silence, names it with its running rank, and ends."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    procs = start_nodes(tmp_path, homes, per_node=({"XL_NODE_TIMEOUT": "3"}, {"MN_TAIL": "120"}))
    frozen: list[int] = []
    try:
        run1 = wait_for(lambda: first_run(homes[1]), timeout=30, what="node 1's run")
        wait_for(
            lambda: logs_say(run1, 1, "tail 120s"),
            timeout=60,
            what="node 1's rank to work on after the last collective",
        )
        run0 = only_run(homes[0])
        wait_for(
            lambda: (
                (r := run_json(run0)).get("ranks")
                and any(x["state"] == "exited" for x in r["ranks"])
            ),
            timeout=30,
            what="node 0's rank to end",
        )
        frozen = [int(run_json(run1)["supervisor_pid"]), *(p.pid for p in run_processes(run1))]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        code0, out0 = finish(procs[:1], timeout=45)[0]
        assert code0 == 1, out0[-3000:]
        assert time.monotonic() - stopped_at < 20
        run = run_json(run0)
        [r1] = [r["rank"] for r in run["ranks"] if r["node_rank"] == 1]
        assert run["status"] == "failed" and run["failure"]["node_rank"] == 1, run["failure"]
        assert (
            f"was lost with rank {r1} running: nothing came from it for 3s"
            in run["failure"]["message"]
        ), run["failure"]
        assert not any(e["kind"] == "nodes_unfinished" for e in run_events(run0))
        # Node 1 thawed and stopped: nothing of either node is left (node 0's run.json lists
        # node 1's frozen rank too).
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        os.kill(frozen[0], signal.SIGTERM)
        frozen = []
        code1, out1 = finish(procs[1:], timeout=30)[0]
        assert code1 != 0, out1[-3000:]
        wait_no_processes(run1, timeout=10)
        wait_no_processes(run0, timeout=10)
    finally:
        for pid in frozen:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        cleanup(homes, procs)


def test_node_1_trains_on_when_node_0_cannot_be_reached(tmp_path: Path) -> None:
    """Node 1 dials the wrong collector port: the run still trains and succeeds, node 1 keeps its
    own full records (its rank spooled its metrics), and node 0 says it never heard from node 1
    (after the grace and XL_NODE_END_WAIT, 2 s here, not 10)."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    nowhere = str(rdzv_port())
    try:
        results = finish(
            start_nodes(
                tmp_path,
                homes,
                per_node=({"XL_NODE_END_WAIT": "2"}, {"XL_COLLECTOR_PORT": nowhere}),
            ),
            timeout=90,
        )
        for code, out in results:
            assert code == 0, out[-3000:]
        run0, run1 = only_run(homes[0]), only_run(homes[1])
        [r1] = own_ranks(run1)
        assert sorted(m["step"] for m in train_records(run1) if m["rank"] == r1) == [0, 1, 2]
        assert "done" in (run1 / "logs" / f"rank-{r1}.log").read_text()
        assert [r["rank"] for r in run_json(run0)["ranks"]] == [1 - r1]
        assert any(e["kind"] == "nodes_unfinished" for e in run_events(run0))
        assert "cannot connect yet" in (run1 / "supervisor.log").read_text()
        for home in homes:
            wait_no_processes(only_run(home), timeout=5)
    finally:
        cleanup(homes)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_node_1_trains_on_when_only_its_supervisor_is_killed_or_frozen(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Node 1's supervisor alone is SIGKILLed or frozen mid-run: its rank trains on and its
    frames still reach node 0, so node 0 says the supervisor is gone (no lost node, no failure),
    keeps taking rank 1's output and metrics to the last step, and the run succeeds."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    steps = 120
    procs = start_nodes(
        tmp_path, homes, MN_MODE="loop", MN_STEPS=str(steps), MN_PAUSE="0.1", XL_NODE_TIMEOUT="4"
    )
    frozen: int | None = None
    try:
        wait_for(lambda: all(run_dirs(h) for h in homes), timeout=60, what="both runs")
        run0, run1 = only_run(homes[0]), only_run(homes[1])
        wait_for(
            lambda: logs_say(run0, 1, "ready") and logs_say(run1, 1, "ready"),
            timeout=60,
            what="both nodes to train",
        )
        sup = int(run_json(run1)["supervisor_pid"])
        [r1] = own_ranks(run1)
        os.kill(sup, sig)
        frozen = sup if sig == signal.SIGSTOP else None
        code0, out0 = finish(procs[:1], timeout=90)[0]
        assert code0 == 0, out0[-3000:]
        run = run_json(run0)
        assert run["status"] == "succeeded" and run["failure"] is None, run
        events = run_events(run0)
        said = [e for e in events if e["kind"] == "node_supervisor_lost"]
        assert (
            len(said) == 1
            and said[0]["node_rank"] == 1
            and f"its rank {r1} still sends: training goes on" in said[0]["message"]
        ), said
        assert not any(e["kind"] in ("node_lost", "failure") for e in events), events
        # Rank 1's records kept coming after its supervisor was gone, to its last step.
        assert steps - 1 in {m["step"] for m in train_records(run0) if m["rank"] == r1}
        assert {r["rank"]: r["state"] for r in run["ranks"]}[r1] == "exited", run["ranks"]
        # No supervisor there sent rank 1's last lines: node 0's `xl logs` says where they are,
        # in one line.
        said = xl(["logs", run0.name, "--rank", str(r1)], xl_env(homes[0]))
        assert said.returncode == 2 and said.stdout == "", said
        assert f"rank {r1} ran on node 1" in said.stderr and said.stderr.count("\n") == 1, said
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
            frozen = None
        code1, out1 = finish(procs[1:], timeout=60)[0]
        assert code1 == 0 and wait_for(
            lambda: run_json(run1).get("status") == "succeeded", timeout=30, what="node 1's record"
        ), out1[-3000:]
        # its output stayed on its node
        assert "done" in (run1 / "logs" / f"rank-{r1}.log").read_text()
        for run_dir in (run0, run1):
            wait_no_processes(run_dir, timeout=10)
    finally:
        if frozen is not None:
            with contextlib.suppress(OSError):
                os.kill(frozen, signal.SIGCONT)
        cleanup(homes, procs)


@contextlib.contextmanager
def _netns_pair() -> Any:
    """A network namespace joined to this one by a veth pair: (namespace, host-side interface,
    node 0's address, node 1's address, node 1's interface); removed afterwards (root only)."""
    tag = f"{os.getpid() % 10000}{int(time.monotonic() * 1000) % 1000}"
    ns, here, there = f"xlns{tag}", f"xl{tag}a", f"xl{tag}b"
    net = 16 + os.getpid() % 200
    addr0, addr1 = f"10.77.{net}.1", f"10.77.{net}.2"
    setup = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
        ["ip", "link", "set", there, "netns", ns],
        ["ip", "addr", "add", f"{addr0}/24", "dev", here],
        ["ip", "link", "set", here, "up"],
        ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr1}/24", "dev", there],
        ["ip", "netns", "exec", ns, "ip", "link", "set", there, "up"],
        ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
    ]
    # torchrun hands its ranks the address of the node whose agent is group rank 0 as its FQDN,
    # "localhost" on this machine: inside the namespace that name is node 0 (`ip netns exec`
    # mounts /etc/netns/<ns>/hosts over /etc/hosts), as a real second machine would resolve it.
    etc = Path("/etc/netns")
    made_etc = not etc.exists()
    try:
        for cmd in setup:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
            if done.returncode != 0:
                pytest.skip(
                    f"cannot make a network namespace here ({' '.join(cmd)}: {done.stderr.strip()})"
                )
        (etc / ns).mkdir(parents=True)
        (etc / ns / "hosts").write_text(f"{addr0} localhost\n127.0.0.1 {socket.gethostname()}\n")
        yield ns, here, addr0, addr1, there
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)
        with contextlib.suppress(OSError):
            (etc / ns / "hosts").unlink()
            (etc / ns).rmdir()
            if made_etc:
                etc.rmdir()


@pytest.mark.parametrize("node_0_lost", ["8", "keep"])
def test_a_link_going_down_between_the_nodes_is_noticed_on_both(
    tmp_path: Path, node_0_lost: str
) -> None:
    """Node 1 in its own network namespace, joined by a veth pair; the link goes down mid-run:
    node 0 names node 1 lost, and node 1 says node 0 no longer answers (it used to stay
    "running" without a word). Past XL_NODE_0_LOST_S (8 s here) with node 0's rendezvous out of
    reach, node 1 ends its ranks and says why (they waited 150 s and more in their collectives,
    for torch's 30 min); told to keep waiting, they go on until `xl stop` on node 1 ends them."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    (tmp_path / "mn.py").write_text(SCRIPT)
    procs: list[subprocess.Popen[str]] = []
    with _netns_pair() as (ns, here, addr0, _addr1, there):
        try:
            rdzv = f"{addr0}:{rdzv_port(addr0)}"
            for node, (home, ifname) in enumerate(zip(homes, (here, there), strict=True)):
                argv = node_argv(node, rdzv)
                env = xl_env(
                    home,
                    XL_TOKEN=TOKEN,
                    MN_MODE="loop",
                    XL_NODE_TIMEOUT="5",
                    GLOO_SOCKET_IFNAME=ifname,
                    XL_NODE_0_LOST_S=node_0_lost,
                )
                prefix = ["ip", "netns", "exec", ns] if node else []
                procs.append(
                    subprocess.Popen(
                        [*prefix, *argv],
                        env=env,
                        cwd=tmp_path,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                )
                if not node:  # node 0 joins first: its agent is group rank 0 (see _netns_pair)
                    wait_for(lambda: run_dirs(homes[0]), timeout=60, what="node 0's run")
            wait_for(lambda: all(run_dirs(h) for h in homes), timeout=60, what="both runs")
            run0, run1 = only_run(homes[0]), only_run(homes[1])
            wait_for(
                lambda: logs_say(run0, 1, "ready") and logs_say(run1, 1, "ready"),
                timeout=90,
                what="both nodes to train",
            )
            subprocess.run(["ip", "link", "set", here, "down"], check=True, timeout=30)
            down_at = time.monotonic()
            code0, out0 = finish(procs[:1], timeout=60)[0]
            assert code0 == 1, out0[-3000:]
            failure = run_json(run0)["failure"]
            assert (
                failure["node_rank"] == 1 and "nothing came from it for 5s" in failure["message"]
            ), failure

            def node_1_noticed() -> dict[str, Any] | None:
                return next(
                    (
                        e
                        for e in run_events(run1)
                        if e["kind"] == "node_lost" and e.get("node_rank") == 0
                    ),
                    None,
                )

            said = wait_for(node_1_noticed, timeout=30, what="node 1 to notice that node 0 is gone")
            assert (
                f"node 0 ({rdzv.rsplit(':', 1)[0]}:" in said["message"]
                and "has not answered for 5s" in said["message"]
            ), said
            # within the timeout and a few seconds
            assert said["t"] - time.time() + (time.monotonic() - down_at) < 20
            if node_0_lost == "keep":
                assert (
                    "XL_NODE_0_LOST_S=keep" in said["message"]
                    and "until torch's own timeout" in said["message"]
                ), said
                time.sleep(10)  # past where it would have given up
                assert procs[1].poll() is None and run_json(run1)["status"] == "running"
                assert any(r.get("state") == "running" for r in run_json(run1)["ranks"])
                stop = xl(["stop", run1.name], xl_env(homes[1]))
                assert stop.returncode == 0 and stop.stdout.strip() == f"{run1.name} stopped", (
                    stop.stdout + stop.stderr
                )
                finish(procs[1:], timeout=30)
            else:
                assert "ends its ranks once node 0 has been silent 8s" in said["message"], said
                code1, out1 = finish(procs[1:], timeout=90)[0]  # on its own: nobody stops it
                assert code1 == 1, out1[-3000:]
                rec1 = run_json(run1)
                assert rec1["status"] == "failed", rec1
                assert (
                    "rendezvous cannot be reached: this node's ranks were ended"
                    in rec1["failure"]["message"]
                ), rec1["failure"]
                assert "rendezvous cannot be reached" in out1, out1[-3000:]
            for run_dir in (run0, run1):
                wait_no_processes(run_dir, timeout=10)
        finally:
            cleanup(homes, procs)
