"""Node 0's verdict on the nodes' fingerprints (launcher/multinode/envcheck.py), the link's
fingerprint message as node 0 checks it (protocol.py), the env_diff line (rundir/events.py), and
torchrun's PET_* variables read as torchrun reads them (petenv.py)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

from xl import wire
from xl.doctor.fingerprint import Fingerprint, gather
from xl.errors import UsageError
from xl.launcher.cli.options import launch_parser
from xl.launcher.multinode import envcheck, petenv
from xl.launcher.multinode.protocol import FingerprintMessage, parse_message
from xl.launcher.rundir.events import event_line

FIELDS: dict[str, Any] = {"torch": "2.7.1+cu128", "torch_cuda": "12.8", "nccl": "2.26.2"}


def _fp(host: str, **fields: Any) -> Fingerprint:
    return Fingerprint(host=host, fields={**FIELDS, **fields}, python="/venv/bin/python")


def _sent(host: str, **fields: Any) -> Fingerprint:
    """A node's fingerprint as node 0 reads it off the link."""
    return Fingerprint.from_json(json.loads(json.dumps(_fp(host, **fields).to_json())))


def test_node_0_names_the_odd_node_and_the_ones_that_sent_nothing() -> None:
    sent = {1: _sent("b"), 2: _sent("c", nccl="2.21.5"), 3: None}
    verdict, prints = envcheck.judge(_fp("a"), sent, 5)
    assert sorted(prints) == [0, 1, 2] and verdict.compared == [0, 1, 2]
    assert verdict.missing == [3, 4]
    [stop] = verdict.stops
    assert (stop.node, stop.field, stop.value, stop.others) == (2, "nccl", "2.21.5", "2.26.2")
    # One line: the odd node and what differs there (its values and fixes are its own line's).
    assert verdict.failure_message() == (
        "the nodes' environments differ where a run cannot work: node 2 (c) in NCCL; "
        "fix them as node 0 says, or start anyway with --allow-env-diff"
    )
    assert verdict.to_json()["diffs"] == [stop.to_json()]


def test_alike_nodes_make_no_event() -> None:
    verdict, _ = envcheck.judge(_fp("a"), {1: _sent("b")}, 2)
    assert verdict.diffs == [] and verdict.events() == [] and verdict.missing == []


def test_the_env_diff_line_holds_the_contract_s_keys_in_order() -> None:
    sent = {1: _sent("b", torch="2.6.0+cu128")}
    [event] = envcheck.judge(_fp("a"), sent, 2)[0].events()
    obj = json.loads(event_line(event))
    assert list(obj) == [
        "kind",
        "node",
        "host",
        "field",
        "value",
        "others",
        "severity",
        "fix",
        "message",
        "t",
        "rank",
    ]
    assert (obj["kind"], obj["node"], obj["field"], obj["severity"]) == (
        "env_diff",
        1,
        "torch",
        "stop",
    )
    assert obj["message"].startswith("node 1 (b): torch 2.6.0+cu128 where the others have ")


def test_a_real_fingerprint_passes_node_0_s_check_and_a_made_up_one_does_not() -> None:
    real = envcheck.message(gather(sys.executable, dict(os.environ)))
    took = parse_message(json.loads(json.dumps(real.to_json())), 1)
    assert isinstance(took, FingerprintMessage) and took == real
    for bad in (
        {"fields": {"torch": ["2.7"]}},
        {"fields": "torch"},
        {"env": {"NCCL_ALGO": 1}},
        {"env": {f"NCCL_{i}": "x" for i in range(600)}},
        {"secret": "x"},
        {"host": "x" * 5000},
    ):
        with pytest.raises(wire.FrameError):
            parse_message({"type": "fingerprint", "fingerprint": bad}, 1)


def _ns(argv: list[str], env: dict[str, str]) -> Any:
    parser = launch_parser()
    ns, _ = parser.parse_known_args(argv)
    petenv.apply(ns, parser, env)
    return ns


POD = {
    "PET_NNODES": "2",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "train-master-0",
    "PET_MASTER_PORT": "23456",
    "PET_NPROC_PER_NODE": "8",
}


def test_a_pytorchjob_s_variables_fill_what_the_command_line_leaves_out() -> None:
    ns = _ns([], POD)
    assert (ns.nnodes, ns.node_rank, ns.nproc) == (2, 1, 8)
    assert (ns.master_addr, ns.master_port, ns.rdzv) == ("train-master-0", 23456, None)
    given = _ns(["--nproc", "2", "--node-rank", "0"], POD)
    assert (given.nproc, given.node_rank, given.nnodes) == (2, 0, 2)
    assert _ns([], {}).nnodes is None and _ns([], {"PET_NNODES": ""}).nnodes is None


def test_a_rendezvous_endpoint_wins_over_the_master_address() -> None:
    ns = _ns([], {**POD, "PET_RDZV_ENDPOINT": "10.0.0.1:29400"})
    assert (ns.rdzv, ns.master_addr, ns.master_port) == ("10.0.0.1:29400", None, None)
    flag = _ns(["--rdzv", "10.0.0.2:29400"], POD)
    assert (flag.rdzv, flag.master_addr) == ("10.0.0.2:29400", None)
    master = _ns(["--master-addr", "m"], {"PET_RDZV_ENDPOINT": "10.0.0.1:29400"})
    assert (master.rdzv, master.master_addr) == (None, "m")


def test_torchrun_s_words_and_ranges_and_bad_values() -> None:
    assert _ns([], {"PET_NPROC_PER_NODE": "gpu"}).nproc == "gpu"
    assert _ns([], {"PET_NNODES": "2:2"}).nnodes == 2
    assert _ns([], {"PET_STANDALONE": "1"}).standalone is True
    assert _ns([], {"PET_STANDALONE": "0"}).standalone is False
    with pytest.raises(UsageError, match=r"^PET_NNODES='1:4', torchrun's --nnodes: "):
        _ns([], {"PET_NNODES": "1:4"})
    with pytest.raises(UsageError, match="PET_MASTER_PORT='http', torchrun's --master-port: not"):
        _ns([], {"PET_MASTER_PORT": "http"})
