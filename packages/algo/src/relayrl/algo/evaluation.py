"""Evaluation metrics: pass@k with the unbiased estimator, and its mean over tasks.

pass@k is the probability that at least one of ``k`` samples solves a task. Estimating it as "did
any of the first ``k`` samples pass" wastes samples and has high variance; with ``n >= k`` samples
of which ``c`` passed, the unbiased estimator (Chen et al. 2021, "Evaluating Large Language Models
Trained on Code") is the probability that a random ``k``-subset of them holds a passing one::

    pass@k = 1 - C(n - c, k) / C(n, k)

Python's integers are exact and ``int / int`` is correctly rounded, so this is computed exactly
and rounded once, for any ``n``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["mean_pass_at_k", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of a task with ``c`` passing samples out of ``n``.

    Raises ``ValueError`` when ``k`` exceeds ``n`` (there is no ``k``-subset to draw: sample more,
    or ask for a smaller ``k``) or the counts are impossible.
    """
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= passed <= samples, got {c} passed of {n}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """The mean over tasks of :func:`pass_at_k`, each task given as ``(samples, passed)``."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    if not values:
        raise ValueError("pass@k of no task")
    return sum(values) / len(values)
