"""xl.stats gives what the statistics module gives, without its imports."""

from __future__ import annotations

import random
import statistics

import pytest

from xl import stats


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 10, 201])
def test_median_median_low_and_fmean_are_the_statistics_module_s(n: int) -> None:
    rng = random.Random(n)
    for values in ([rng.uniform(-5, 5) for _ in range(n)], [rng.randint(0, 3) for _ in range(n)]):
        assert stats.median(values) == statistics.median(values)
        assert stats.median_low(values) == statistics.median_low(values)
        assert stats.fmean(values) == pytest.approx(statistics.fmean(values), rel=1e-12)
        assert stats.median(iter(values)) == statistics.median(values)  # any iterable, once
        assert stats.median_sorted(sorted(values)) == statistics.median(values)


def test_no_values_is_an_error_as_in_the_statistics_module() -> None:
    for fn in (stats.median, stats.median_low, stats.fmean):
        with pytest.raises(ValueError):
            fn([])
