"""node_summary: what the Monitor of a big run names, checked against runs whose truth the test
sets: the slow node and its phase, ranks not running, and the healthy-but-unusual runs it must
leave alone (no timing yet, an uneven node, a run just under the slow ratio, a finished run)."""

from __future__ import annotations

from xl.launcher.view.runview import RankView, node_labels, node_order
from xl.tui.widgets.node_summary import SLOW_RATIO, is_big, phase_of, summarise
from xl.units import ranges


def rank(
    r: int, node: int, step_s: float | None = 0.5, *, state: str = "running", **kw
) -> RankView:
    split = (
        {}
        if step_s is None
        else {
            "data_s": 0.1 * step_s,
            "compute_s": 0.7 * step_s,
            "comm_s": 0.1 * step_s,
            "other_s": 0.1 * step_s,
        }
    )
    return RankView(
        rank=r,
        host=f"n{node}",
        node_rank=node,
        state=state,
        step_s=step_s,
        **{"step": 10.0, "total_steps": 100.0, **split, **kw},
    )


def summary(ranks: list[RankView], run_over: bool = False):
    by_rank = {rv.rank: rv for rv in ranks}
    labels = node_labels(by_rank)
    return summarise(by_rank, labels, node_order(labels), run_over=run_over)


def test_the_slow_node_and_its_phase():
    ranks = [rank(r, r // 4) for r in range(16)]
    ranks[8:12] = [
        rank(r, 2, 1.5, data_s=1.0, compute_s=0.35, comm_s=0.1, other_s=0.05) for r in range(8, 12)
    ]
    s = summary(ranks)
    assert s.median_s == 0.5
    assert [n.node for n in s.slow_nodes] == ["n2"]
    slow = s.slow_nodes[0]
    assert slow.slow == 3.0 and slow.phase == "data" and round(slow.phase_share or 0, 2) == 0.67
    assert (slow.time_min, slow.time_median, slow.time_max) == (1.5, 1.5, 1.5)
    assert [x.rank for x in s.slowest] == [8, 9, 10] and all(x.flagged for x in s.slowest)
    assert all(n.phase == "compute" and n.slow is None for n in s.nodes if n.node != "n2")


def test_just_under_the_ratio_and_no_timing_are_left_alone():
    ranks = [rank(r, r // 4) for r in range(12)]
    ranks[0] = rank(0, 0, 0.5 * SLOW_RATIO * 0.99)
    s = summary(ranks)
    assert s.slowest[0].rank == 0 and not s.slowest[0].flagged and not s.slow_nodes
    untimed = summary([rank(r, r // 4, None) for r in range(12)])
    assert untimed.slowest == [] and untimed.median_s is None and not untimed.slow_nodes
    assert all(n.phase is None and n.time_median is None and n.running == 4 for n in untimed.nodes)


def test_an_uneven_node_is_no_trouble():
    """A node of 2 ranks beside nodes of 8 (a run's last, partly filled node): its own row, as
    fast as the others."""
    ranks = [rank(r, r // 8) for r in range(18)]
    s = summary(ranks)
    assert [len(n.ranks) for n in s.nodes] == [8, 8, 2]
    assert not s.down and not s.slow_nodes


def test_ranks_not_running_while_the_run_goes_on_and_once_it_ended():
    ranks = [rank(r, r // 4) for r in range(12)]
    ranks[1] = rank(1, 0, state="failed", exit_code=3)
    ranks[5] = rank(5, 1, state="stalled", diagnosis="no step for 40 s")
    ranks[9] = rank(9, 2, state="exited", exit_code=0)  # step 10 of 100: early
    ranks[10] = rank(10, 2, state="exited", exit_code=0, step=100.0)  # done with its steps
    s = summary(ranks)
    assert [(d.rank, d.state) for d in s.down] == [(1, "failed"), (5, "stalled"), (9, "exited")]
    assert [dict(n.down) for n in s.nodes] == [{"failed": 1}, {"stalled": 1}, {"exited": 1}]
    assert [n.running for n in s.nodes] == [3, 3, 2]
    over = summary([rank(r, r // 4, state="exited") for r in range(12)], run_over=True)
    assert over.down == [] and all(not n.down for n in over.nodes)


def test_ranges_phase_and_size():
    # As every rank list reads (verdicts, events, xl logs): Slurm's way, a pair not joined.
    assert ranges([7, 0, 1, 2, 5, 3, 9, 10]) == "0-3,5,7,9,10"
    assert ranges([]) == ""
    assert phase_of({"data_s": 0.0, "compute_s": 0.0}) == (None, None)
    assert phase_of({"comm_s": 3.0, "compute_s": 1.0}) == ("comm", 0.75)
    assert not is_big(64) and is_big(65)
