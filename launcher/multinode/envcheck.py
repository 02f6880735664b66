"""One environment across nodes: each node's fingerprint, and node 0's verdict on them before any
rank starts (docs/multinode.md, "One environment across nodes").

Every node other than 0 sends its fingerprint as the first message of its link (``message``);
node 0 takes its own, waits for every node's (``Nodes.check_env``, up to XL_NODE_TIMEOUT; a node
that joins later is judged as it comes, ``Judge``), and ``judge`` compares them: one
``env_diff`` event per field in which a node differs, run.json's ``env``, the
fingerprints in the run dir (``fingerprints.json``), and when a difference breaks the run
(unless ``--allow-env-diff``) the failure that ends it before torchrun starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xl.atomic import write_json_atomic
from xl.launcher.multinode.protocol import FingerprintMessage
from xl.launcher.rundir.events import EnvDiff
from xl.launcher.rundir.runrecord import RunRecord

if TYPE_CHECKING:
    from xl.doctor.api import Diff, Fingerprint

FINGERPRINTS = "fingerprints.json"  # in the run dir: every node's, by node rank
RECORD_KEY = "env"  # run.json: {"diffs": [...], "fingerprints": FINGERPRINTS, ...}
ALLOW_OPTION = "--allow-env-diff"


def ranks_python(record: RunRecord) -> str:
    """The interpreter the ranks run under: the head of the torchrun command."""
    return record.argv[0] if record.argv else sys.executable


def gather_here(record: RunRecord) -> Fingerprint:
    """This node's fingerprint for its ranks: their interpreter and their whole environment."""
    from xl.doctor import api  # noqa: PLC0415 - several nodes only: a one-node run never loads the doctor

    env = {**os.environ, **record.rank_env}
    return api.gather_fingerprint(ranks_python(record), env, nproc=record.nproc_per_node or 0)


def message(fingerprint: Fingerprint) -> FingerprintMessage:
    """The link's message that carries it (xl.launcher.multinode.protocol checks it)."""
    return FingerprintMessage(fingerprint.to_json())


@dataclass(frozen=True)
class Verdict:
    """The comparison of every node's fingerprint that came."""

    diffs: list[Diff]
    compared: list[int]  # node ranks whose fingerprints were compared
    missing: list[int]  # node ranks that joined without one (or never joined in time)

    @property
    def stops(self) -> list[Diff]:
        return [d for d in self.diffs if d.severity == "stop"]

    def events(self) -> list[EnvDiff]:
        return [
            EnvDiff(d.node, d.host, d.field, d.value, d.others, d.severity, d.fix, d.line())
            for d in self.diffs
        ]

    def failure_message(self) -> str:
        """Why the launch stopped, in one line: the odd nodes and what differs on each. Each
        node's whole line (its values beside the others', its fixes) is its ``env_diff``
        events', said once in the view on node 0; run.json's ``env`` keeps them too."""
        by_node: dict[int, list[Diff]] = {}
        for diff in self.stops:
            by_node.setdefault(diff.node, []).append(diff)
        nodes = "; ".join(
            f"node {node} ({found[0].host or '?'}) in {', '.join(d.label for d in found)}"
            for node, found in sorted(by_node.items())
        )
        return (
            f"the nodes' environments differ where a run cannot work: {nodes}; fix them "
            f"as node 0 says, or start anyway with {ALLOW_OPTION}"
        )

    def to_json(self) -> dict[str, object]:
        """run.json's ``env``, as it is written."""
        return {
            "diffs": [d.to_json() for d in self.diffs],
            "fingerprints": FINGERPRINTS,
            "compared": self.compared,
            "missing": self.missing,
        }


def judge(
    own: Fingerprint, sent: Mapping[int, Fingerprint | None], nnodes: int
) -> tuple[Verdict, dict[int, Fingerprint]]:
    """Node 0's fingerprint beside those the other nodes sent (None: joined without one)."""
    from xl.doctor.api import compare_fingerprints  # noqa: PLC0415 - several nodes only

    prints: dict[int, Fingerprint] = {0: own}
    for node, theirs in sorted(sent.items()):
        if theirs is not None:
            prints[node] = theirs
    missing = [n for n in range(1, nnodes) if n not in prints]
    diffs = compare_fingerprints(sorted(prints.items()))
    return Verdict(diffs, sorted(prints), missing), prints


class Judge:
    """Node 0's verdicts as the nodes' fingerprints come: the first when every node joined (or
    the wait for them ended), then again whenever a late node's comes, each difference said
    once."""

    def __init__(self, own: Fingerprint) -> None:
        self.own = own
        self.judged: set[int] = set()  # the nodes whose word (a fingerprint or none) was judged
        self.said: set[tuple[int, str]] = set()  # (node, field) already an event

    def waiting(self, sent: Mapping[int, Fingerprint | None]) -> bool:
        """A node joined since the last verdict."""
        return bool(set(sent) - self.judged)

    def run(
        self, sent: Mapping[int, Fingerprint | None], nnodes: int
    ) -> tuple[Verdict, dict[int, Fingerprint], list[EnvDiff]]:
        """The verdict on every fingerprint so far, and the events of the differences not said
        before."""
        verdict, prints = judge(self.own, sent, nnodes)
        self.judged = set(sent)
        new = [
            event
            for diff, event in zip(verdict.diffs, verdict.events(), strict=True)
            if (diff.node, diff.field) not in self.said
        ]
        self.said |= {(d.node, d.field) for d in verdict.diffs}
        return verdict, prints, new


def write(run_dir: Path, prints: Mapping[int, Fingerprint]) -> None:
    """Every node's fingerprint in the run dir (private and whole, as every file there)."""
    doc = {str(node): fp.to_json() for node, fp in sorted(prints.items())}
    write_json_atomic(run_dir / FINGERPRINTS, doc)
