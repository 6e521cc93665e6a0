"""Uncertainty of a report's scores: 95% intervals per cell and paired differences between methods.

The records are per prompt, so every figure of a report comes with the prompts it rests on:

- **a cell** (one method, budget and task): the exact Clopper-Pearson binomial interval when every
  score is 0 or 1 (NIAH, most RULER tasks), else a BCa bootstrap over the prompts (``scipy.stats``);
- **a row's average over tasks** (the tables' ``avg``, the mean of task means): a bootstrap that
  resamples each task's prompts on its own (tasks of at least :data:`MIN_STRATUM` prompts), else
  all prompts pooled; for 0/1 scores with as many prompts in every task, the exact binomial of the
  pooled prompts;
- **a paired difference** (``dapq report --against METHOD``): the same prompts under two methods,
  their per-prompt score differences averaged like the table (per task, then over tasks),
  bootstrapped in pairs, with the prompts won, lost and tied and an exact sign test of won
  against lost. A difference is called better or worse only where its interval excludes zero
  and the sign test agrees at 5%.

Every bootstrap uses a fixed seed, so a report is the same each time it is rendered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 4000
SEED = 0
#: Fewest prompts a task needs for a bootstrap stratified by task (see :func:`_strata`).
MIN_STRATUM = 10


@dataclass(frozen=True)
class Interval:
    """A mean with its 95% interval, over ``n`` prompts; ``how`` names the method."""

    n: int
    mean: float
    low: float
    high: float
    how: str

    def points(self, digits: int = 1) -> str:
        """``mean [low, high]`` in points (scores x 100)."""
        return f"{100 * self.mean:.{digits}f} [{100 * self.low:.{digits}f}, {100 * self.high:.{digits}f}]"


@dataclass(frozen=True)
class Paired:
    """A paired difference (this method minus the reference) over ``n`` shared prompts.

    ``sign_p`` is the exact two-sided sign test of the prompts won against those lost (ties
    dropped): the check on a bootstrap interval that, with few decided prompts, is too narrow.
    """

    n: int
    diff: float
    low: float
    high: float
    won: int
    lost: int
    tied: int
    sign_p: float
    how: str

    @property
    def verdict(self) -> str:
        """"better"/"worse" where the interval excludes zero and the sign test agrees at 5%."""
        if self.sign_p < 1 - CONFIDENCE and self.low > 0:
            return "better"
        if self.sign_p < 1 - CONFIDENCE and self.high < 0:
            return "worse"
        return "no difference shown"


def _bootstrap(samples: Sequence[np.ndarray], statistic) -> tuple[float, float]:
    """BCa interval of ``statistic`` (percentile where BCa is undefined: a constant resample)."""
    if all(np.all(s == s.flat[0]) for s in samples):  # no spread: every resample gives the estimate
        value = float(statistic(*samples, axis=-1))
        return value, value
    rng = np.random.default_rng(SEED)
    for method in ("BCa", "percentile"):
        res = stats.bootstrap(tuple(samples), statistic, vectorized=True, confidence_level=CONFIDENCE,
                              n_resamples=RESAMPLES, method=method, random_state=rng)
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if np.isfinite(low) and np.isfinite(high):
            return low, high
    return float("nan"), float("nan")


def interval(scores: Sequence[float]) -> Interval:
    """The mean of one cell's scores with its 95% interval (exact binomial for 0/1 scores)."""
    x = np.asarray(scores, dtype=float)
    n, mean = len(x), float(x.mean())
    if np.all((x == 0) | (x == 1)):
        ci = stats.binomtest(int(x.sum()), n).proportion_ci(confidence_level=CONFIDENCE, method="exact")
        return Interval(n, mean, float(ci.low), float(ci.high), "exact binomial")
    if n < 2:
        return Interval(n, mean, float("nan"), float("nan"), "bootstrap (n < 2)")
    low, high = _bootstrap([x], lambda a, axis: a.mean(axis=axis))
    return Interval(n, mean, low, high, "bootstrap")


def _mean_of_means(*groups, axis):
    return np.mean([g.mean(axis=axis) for g in groups], axis=0)


def _strata(groups: list[np.ndarray]) -> tuple[list[np.ndarray], str]:
    """The samples a bootstrap resamples: each task apart, or (small tasks) all prompts together.

    A bootstrap within a task of n prompts has a variance (n - 1) / n of the true one: with the
    2-5 prompts a task of an early table holds, that halves it and calls noise a difference.
    Below :data:`MIN_STRATUM` prompts a task, the prompts are pooled into one sample instead.
    """
    if min(len(g) for g in groups) >= MIN_STRATUM:
        return groups, "bootstrap, stratified by task"
    return [np.concatenate(groups)], f"bootstrap over pooled prompts (tasks under {MIN_STRATUM} prompts)"


def _pooled_mean(x, axis):
    return x.mean(axis=axis)


def average_interval(by_task: Mapping[str, Sequence[float]]) -> Interval:
    """The mean of task means with a bootstrap over prompts (per task where tasks are large enough)."""
    groups = [np.asarray(v, dtype=float) for v in by_task.values() if len(v)]
    n = sum(len(g) for g in groups)
    mean = float(np.mean([g.mean() for g in groups]))
    if len(groups) == 1:
        single = interval(groups[0])
        return Interval(n, mean, single.low, single.high, single.how)
    pooled = np.concatenate(groups)
    if np.all((pooled == 0) | (pooled == 1)) and len({len(g) for g in groups}) == 1:
        # 0/1 scores, as many prompts in every task: the average is the pooled proportion, and its
        # exact interval stays honest where a bootstrap has no spread to resample (all 0 or all 1).
        exact = interval(pooled)
        return Interval(n, mean, exact.low, exact.high, "exact binomial (pooled; equal prompts per task)")
    samples, how = _strata(groups)
    if len(samples) == 1 and len(samples[0]) < 2:
        return Interval(n, mean, float("nan"), float("nan"), "bootstrap (n < 2)")
    low, high = _bootstrap(samples, _mean_of_means if len(samples) > 1 else _pooled_mean)
    # The pooled resample estimates the pooled mean; centre its interval on the table's average,
    # inside the range the scores can average to.
    shift = mean - float(samples[0].mean()) if len(samples) == 1 else 0.0
    low, high = _clip(low + shift, pooled), _clip(high + shift, pooled)
    return Interval(n, mean, low, high, how + (" (no spread)" if low == high else ""))


def _clip(value: float, data: np.ndarray) -> float:
    """``value`` inside [min, max] of ``data`` (+0.0 turns a -0.0 into 0.0 for printing)."""
    return float(np.clip(value, data.min(), data.max())) + 0.0


def paired(scores: Mapping[tuple, float], reference: Mapping[tuple, float]) -> Paired | None:
    """Paired difference over the prompts both have; keys are ``(task, sample_id)``.

    The difference is averaged per task, then over tasks (as the tables average), and its interval
    resamples the prompts of each task in pairs. None when no prompt is shared.
    """
    shared = sorted(set(scores) & set(reference), key=str)
    if not shared:
        return None
    d = np.array([scores[k] - reference[k] for k in shared], dtype=float)
    won, lost = int((d > 0).sum()), int((d < 0).sum())
    tasks: dict = {}
    for k, value in zip(shared, d, strict=True):
        tasks.setdefault(k[0], []).append(value)
    groups = [np.asarray(v) for v in tasks.values()]
    diff = float(np.mean([g.mean() for g in groups]))
    samples, how = _strata(groups)
    if len(samples) == 1 and len(samples[0]) < 2:
        low = high = float("nan")
    else:
        low, high = _bootstrap(samples, _mean_of_means if len(samples) > 1 else _pooled_mean)
        if len(samples) == 1:
            shift = diff - float(samples[0].mean())
            low, high = _clip(low + shift, d), _clip(high + shift, d)
    sign_p = float(stats.binomtest(won, won + lost).pvalue) if won + lost else 1.0
    return Paired(len(shared), diff, low, high, won, lost, len(shared) - won - lost, sign_p, "paired " + how)
