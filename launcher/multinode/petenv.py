"""torchrun's options from ``PET_*`` variables, as torchrun reads them (Kubernetes).

torchrun takes each option it is not given on its command line from ``PET_<DEST>``, its argparse
destination in capitals (``--nproc-per-node`` from ``PET_NPROC_PER_NODE``; for a flag,
``PET_STANDALONE=1``), the command line winning; Kubeflow's PyTorchJob sets ``PET_NNODES``,
``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT`` and ``PET_NPROC_PER_NODE`` in every
pod. ``xl launch`` does the same for the options it shares with torchrun, so a pod whose command
was ``torchrun ...`` can say ``xl launch ...`` (docs/multinode.md, "Kubernetes"). Unlike
torchrun an empty variable counts as unset (torchrun would take "" and fail on it).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from xl.errors import UsageError

# xl's destination -> torchrun's variable (PET_ + torchrun's own destination, in capitals).
PET_VARS = {
    "nnodes": "PET_NNODES",
    "node_rank": "PET_NODE_RANK",
    "nproc": "PET_NPROC_PER_NODE",
    "rdzv": "PET_RDZV_ENDPOINT",
    "master_addr": "PET_MASTER_ADDR",
    "master_port": "PET_MASTER_PORT",
    "max_restarts": "PET_MAX_RESTARTS",
}
_STANDALONE = "PET_STANDALONE"
# Node 0's address: the rendezvous endpoint, else --master-addr:--master-port (torchrun's rule);
# one named on the command line wins over the variables of the other.
_MASTER = ("master_addr", "master_port")


def _action(parser: argparse.ArgumentParser, dest: str) -> argparse.Action | None:
    return next((a for a in parser._actions if a.dest == dest and a.option_strings), None)


def apply(
    ns: argparse.Namespace, parser: argparse.ArgumentParser, env: Mapping[str, str]
) -> list[str]:
    """Fill in ``ns`` from the PET_* variables for the options its command line left out;
    returns the variables taken. A value the option would refuse is a UsageError naming the
    variable."""
    given = {dest for dest in PET_VARS if getattr(ns, dest, None) is not None}
    taken: list[str] = []
    for dest, var in PET_VARS.items():
        raw = env.get(var, "").strip()
        if not raw or dest in given:
            continue
        if dest == "rdzv" and given & set(_MASTER):
            continue  # the command line names node 0's address
        if dest in _MASTER and ("rdzv" in given or env.get(PET_VARS["rdzv"], "").strip()):
            continue  # --rdzv or PET_RDZV_ENDPOINT names it
        action = _action(parser, dest)
        convert = action.type if action is not None and callable(action.type) else str
        try:
            value = convert(raw)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            flag = action.option_strings[0] if action is not None else dest
            why = "not a whole number" if convert is int else str(exc)
            raise UsageError(f"{var}={raw!r}, torchrun's {flag}: {why}") from None
        setattr(ns, dest, value)
        taken.append(var)
    standalone = env.get(_STANDALONE, "").strip()
    if standalone and not getattr(ns, "standalone", False):
        try:
            ns.standalone = bool(int(standalone))
        except ValueError:
            raise UsageError(f"{_STANDALONE}={standalone!r}: give 1 or 0, as torchrun") from None
        if ns.standalone:
            taken.append(_STANDALONE)
    return taken
