"""How node 0 judges another node: by its supervisor's link, and by its ranks' own frames.

A node's supervisor is a helper: training outlives it on two nodes as on one. Its ranks send
their ``xl.log`` frames to it (it sends node 0 their summary), and turn to node 0's collector
when it cannot be reached or stops acking (``XL_COLLECTOR_NODE_0``, xl.client.link), so when the
link falls silent or closes and those ranks' own frames then reach node 0, the node is up and
training: its supervisor alone is gone (killed) or frozen. Only a node whose link and ranks
both fall silent is lost (its machine, or the network to it, went down).

``judge`` says which, from the times node 0 last heard each (monotonic seconds):

- ``ALIVE``: the link is up, or silent for less than the node timeout with its ranks silent too;
- ``ORPHANED``: the link is down but its ranks sent well after it went down, and still do;
- ``QUIET``: orphaned, and then its ranks stopped sending too: they ended (or died) with no
  supervisor there to say how; that node's own run dir has it (its ranks settle it);
- ``LOST``: the link closed and no rank spoke for a few seconds after it, or everything was
  silent for the node timeout.
"""

from __future__ import annotations

from enum import Enum

from xl import envnames, settings
from xl.units import ranks_text

NODE_TIMEOUT_S = 30.0  # XL_NODE_TIMEOUT's default: silent this long, a node (or node 0) is gone
# A link that closed without the node's end: lost after this long unless its ranks speak on.
LINK_CLOSED_S = 2.0
# The link's heartbeat comes every second (nodelink.HEARTBEAT_S): silent this long, it is down.
LINK_SILENT_S = 3.0
# Rank frames must come this long after the link's last sign to show the node outlived it (a
# frame already under way when the machine went down must not count), and a rank's frames come
# every second while it lives: quiet this long, it has ended.
RANKS_AFTER_S = 2.5
RANKS_QUIET_S = 5.0


def node_timeout() -> float:
    return settings.number(envnames.NODE_TIMEOUT, NODE_TIMEOUT_S, floor=2.0)


class Verdict(str, Enum):
    ALIVE = "alive"
    ORPHANED = "orphaned"
    QUIET = "quiet"
    LOST = "lost"


def judge(
    now: float,
    link_seen: float,
    link_closed_at: float | None,
    ranks_heard: float | None,
    timeout: float,
) -> Verdict:
    """The node's verdict from when its link was last heard (``link_seen``), when it closed (None:
    open) and when any of its ranks last sent a frame (None: never)."""
    closed_for = None if link_closed_at is None else now - link_closed_at
    if (closed_for is None and now - link_seen <= LINK_SILENT_S) or (
        closed_for is not None and closed_for <= LINK_CLOSED_S
    ):
        return Verdict.ALIVE
    down_since = link_closed_at if link_closed_at is not None else link_seen
    if ranks_heard is not None and ranks_heard > down_since + RANKS_AFTER_S:
        return Verdict.ORPHANED if now - ranks_heard <= RANKS_QUIET_S else Verdict.QUIET
    # Closed: lost once its ranks had time to show they outlive it (a frame every second).
    if (
        closed_for is not None and closed_for > RANKS_AFTER_S + LINK_CLOSED_S
    ) or now - link_seen > timeout:
        return Verdict.LOST
    return Verdict.ALIVE


def supervisor_gone_message(node: int, host: str, closed: bool, ranks: list[int]) -> str:
    how = "is gone (its connection closed)" if closed else "does not answer (frozen?)"
    which = f"{ranks_text(ranks)} still send{'s' if len(set(ranks)) == 1 else ''}"
    return (
        f"node {node} ({host or '?'}): its supervisor {how}, but its "
        f"{which if ranks else 'ranks still send'}: "
        "training goes on (their metrics still come here; their output is in "
        f"node {node}'s own run dir, and its last lines no longer come here at the end)"
    )


def quiet_message(node: int, host: str) -> str:
    return (
        f"node {node} ({host or '?'}): its ranks stopped sending with no supervisor there to say "
        f"how they ended; node {node}'s own run dir has their outcome"
    )
