"""The report's uncertainty: cell intervals, averages over tasks, paired differences and their verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta, norm

from dapq.bench import stats


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval from the beta quantiles (independent of scipy's binomtest)."""
    a = (1 - level) / 2
    low = 0.0 if k == 0 else beta.ppf(a, k, n - k + 1)
    high = 1.0 if k == n else beta.ppf(1 - a, k + 1, n - k)
    return low, high


@pytest.mark.parametrize("k,n", [(0, 5), (3, 10), (10, 10), (27, 50)])
def test_zero_one_cells_get_the_exact_binomial_interval(k, n):
    ci = stats.interval([1.0] * k + [0.0] * (n - k))
    assert ci.how == "exact binomial" and ci.n == n and ci.mean == pytest.approx(k / n)
    assert (ci.low, ci.high) == pytest.approx(clopper_pearson(k, n), abs=1e-9)


def test_a_bootstrap_interval_is_reproducible_and_shrinks_like_one_over_root_n():
    rng = np.random.default_rng(1)
    small, large = rng.uniform(0, 1, 25), rng.uniform(0, 1, 400)
    a, b = stats.interval(small), stats.interval(small)
    assert a == b and a.how == "bootstrap" and a.low < small.mean() < a.high
    wide, narrow = a.high - a.low, stats.interval(large).high - stats.interval(large).low
    # The normal approximation's width for a uniform score: 2 * 1.96 * sqrt(1/12 / n).
    assert narrow == pytest.approx(2 * norm.ppf(0.975) * math.sqrt(1 / 12 / 400), rel=0.15)
    assert wide / narrow == pytest.approx(4.0, rel=0.3)


def test_the_average_over_tasks_is_the_mean_of_task_means():
    by_task = {"a": [1.0] * 20, "b": [0.0] * 10 + [1.0] * 10, "c": [0.25] * 20}
    ci = stats.average_interval(by_task)
    assert ci.mean == pytest.approx((1 + 0.5 + 0.25) / 3) and ci.n == 60
    assert ci.how == "bootstrap, stratified by task" and ci.low < ci.mean < ci.high
    # Only task b varies: the stratified interval is b's own (its half-width over 3), not a pooled one.
    b_only = stats.interval(by_task["b"])
    assert (ci.high - ci.low) == pytest.approx((b_only.high - b_only.low) / 3, rel=0.35)
    small = stats.average_interval({"a": [1.0, 0.0], "b": [0.0, 0.0]})
    assert "pooled" in small.how and small.mean == pytest.approx(0.25)


def test_a_row_of_zeros_still_has_an_interval():
    # 11 tasks x 3 prompts, every score 0: a bootstrap has nothing to resample; the exact interval does.
    ci = stats.average_interval({f"t{i}": [0.0] * 3 for i in range(11)})
    assert ci.mean == 0.0 and ci.low == 0.0 and ci.high == pytest.approx(clopper_pearson(0, 33)[1])
    partial = stats.average_interval({f"t{i}": [0.0, 0.5, 0.0] for i in range(11)})  # not 0/1: bootstrap
    assert 0.0 <= partial.low < partial.mean < partial.high <= 0.5 and "pooled" in partial.how


def test_identical_methods_differ_by_nothing():
    scores = {("t", i): float(i % 3 == 0) for i in range(30)}
    result = stats.paired(scores, dict(scores))
    assert (result.n, result.diff, result.low, result.high) == (30, 0.0, 0.0, 0.0)
    assert (result.won, result.lost, result.tied, result.verdict) == (0, 0, 30, "no difference shown")
    assert stats.paired(scores, {("t", 99): 1.0}) is None  # no shared prompt


def test_a_consistent_win_is_better_and_a_loss_worse():
    ref = {("t", i): 0.0 for i in range(20)}
    ours = {("t", i): 1.0 if i < 15 else 0.0 for i in range(20)}
    result = stats.paired(ours, ref)
    assert result.verdict == "better" and result.won == 15 and result.tied == 5 and result.low > 0
    assert result.sign_p == pytest.approx(2 * 0.5**15)
    assert stats.paired(ref, ours).verdict == "worse"


def test_four_wins_among_eighteen_ties_are_not_called_better():
    # The early tables' case: 2 prompts a task, 4 won, 0 lost. A bootstrap stratified by such tiny
    # tasks halves the variance and excluded zero; the sign test (p = 0.125) does not agree.
    ref = {(f"t{t}", i): 0.0 for t in range(11) for i in range(2)}
    ours = dict(ref)
    for key in list(ref)[:8:2]:
        ours[key] = 1.0
    result = stats.paired(ours, ref)
    assert (result.won, result.lost, result.tied) == (4, 0, 18) and result.sign_p == pytest.approx(0.125)
    assert result.verdict == "no difference shown" and "pooled" in result.how


def test_equal_methods_are_rarely_called_different():
    # Two methods with the same score distribution on 40 prompts: verdicts other than "no difference"
    # should come at about the 5% level, not more.
    rng = np.random.default_rng(7)
    calls = 0
    for _ in range(200):
        a = {("t", i): float(v) for i, v in enumerate(rng.random(40) < 0.5)}
        b = {("t", i): float(v) for i, v in enumerate(rng.random(40) < 0.5)}
        calls += stats.paired(a, b).verdict != "no difference shown"
    assert calls / 200 <= 0.08
