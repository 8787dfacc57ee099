"""pass@k: the unbiased estimator against a direct enumeration of k-subsets, and its edge cases."""

from __future__ import annotations

import itertools
import math

import pytest

from relayrl.algo.evaluation import mean_pass_at_k, pass_at_k


def _enumerated(n: int, c: int, k: int) -> float:
    """The share of the k-subsets of n samples (the first c passing) that hold a passing one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(index < c for index in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_the_estimator_is_the_share_of_k_subsets_holding_a_pass(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_enumerated(n, c, k), abs=1e-12), (n, c, k)


def test_edge_cases():
    assert pass_at_k(10, 0, 5) == 0.0  # nothing passed
    assert pass_at_k(10, 10, 1) == 1.0  # everything passed
    assert pass_at_k(10, 3, 8) == 1.0  # fewer failures than k: every 8-subset holds a pass
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the pass rate
    assert pass_at_k(1, 1, 1) == 1.0
    with pytest.raises(ValueError, match="needs at least 11 samples"):
        pass_at_k(10, 3, 11)
    with pytest.raises(ValueError, match="k >= 1"):
        pass_at_k(10, 3, 0)
    with pytest.raises(ValueError, match="0 <= passed <= samples"):
        pass_at_k(10, 11, 1)
    with pytest.raises(ValueError, match="0 <= passed <= samples"):
        pass_at_k(10, -1, 1)


def test_large_sample_counts_stay_exact():
    """C(1000, 500) overflows a float; the integer ratio does not."""
    expected = 1 - math.prod((1000 - 1 - i) / (1000 - i) for i in range(500))  # C(999,500)/C(1000,500) = 1/2
    assert pass_at_k(1000, 1, 500) == pytest.approx(expected) == pytest.approx(0.5)
    assert 0.0 < pass_at_k(1000, 1, 1) < pass_at_k(1000, 1, 10) < pass_at_k(1000, 1, 100) < 1.0


def test_the_mean_over_tasks():
    assert mean_pass_at_k([(4, 0), (4, 4), (4, 2)], 1) == pytest.approx((0 + 1 + 0.5) / 3)
    assert mean_pass_at_k([(4, 2)], 2) == pytest.approx(1 - 1 / 6)  # C(2,2)/C(4,2)
    with pytest.raises(ValueError, match="no task"):
        mean_pass_at_k([], 1)
