"""The order a bench's commands run in, round by round.

With two commands, reversing the order every other round puts each first half the time. With
three (a `--before` xl, or `--hooks`' xl-off), reversing alone keeps the middle one in the middle
in every round, so whatever the position costs (the previous run's teardown, the page cache)
always lands on it. Here the order turns by one each round and runs backwards every other cycle:
over 2 x N rounds each command runs in each position equally often, after each of the others.

And what torch draws at random for each run: the same for every command of a round
(``same_delays``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def in_round(items: Sequence[T], i: int) -> list[T]:
    """Round ``i``'s order of ``items``."""
    n = len(items)
    if n == 0:
        return []
    k = i % n
    turned = list(items[k:]) + list(items[:k])
    return turned[::-1] if (i // n) % 2 else turned


# torchrun's c10d rendezvous sleeps a random 0-0.3 s before its first join (``_delay`` in
# torch.distributed.elastic.rendezvous.dynamic_rendezvous), in every launcher alike: ~87 ms of
# standard deviation in every run, which no pair of runs shares. This sitecustomize seeds the
# ``random`` of each torchrun agent (and nothing else) from SEED_VARIABLE, so the commands of one
# round draw the same sleep and the next round another: the pair's ratio loses that noise, the
# rounds keep the delay's whole range. It shadows any sitecustomize of the interpreter's own.
SEED_VARIABLE = "XL_BENCH_RDZV_SEED"
_SITECUSTOMIZE = f"""\
import os
_seed = os.environ.get({SEED_VARIABLE!r})
if _seed:
    try:
        with open("/proc/self/cmdline", "rb") as _fh:
            _agent = b"torch.distributed.run" in _fh.read()
    except OSError:
        _agent = False
    if _agent:
        import random
        random.seed(int(_seed))
"""


def same_delays(folder: Path, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the seeding sitecustomize (written into ``folder``) last on PYTHONPATH; give
    each round its seed with ``round_env``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(env, PYTHONPATH=os.pathsep.join([*path, str(folder)]))


def round_env(env: Mapping[str, str], i: int) -> dict[str, str]:
    """``env`` for round ``i``: every command of the round draws the same rendezvous delay when
    ``env`` came from ``same_delays``; without its sitecustomize the variable does nothing."""
    return dict(env, **{SEED_VARIABLE: str(1000 + i)})


def bootstrap(values: Sequence[float], draws: int = 4000) -> tuple[float, float]:
    """A 95% interval for the median of ``values`` (the rounds resampled with replacement, a fixed
    seed): whether the goal lies inside it says whether these rounds settle it."""
    import random  # noqa: PLC0415 - the benches that report an interval only
    import statistics  # noqa: PLC0415 - the benches that report an interval only

    rng = random.Random(0)
    medians = sorted(
        statistics.median(rng.choices(list(values), k=len(values))) for _ in range(draws)
    )
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]
