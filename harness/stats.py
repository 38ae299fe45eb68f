"""Confidence intervals for KPIs measured on samples: Wilson for proportions, a percentile bootstrap for
statistics of paired samples (cosine, SQNR, task metrics), and the sample count a limit needs.

These are the standard forms (scipy.stats.binomtest's Wilson interval; Efron's percentile bootstrap over
samples with a fixed seed, so a verdict is reproducible for the same outputs).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from harness.kpi import Interval

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0


def _z(confidence: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + confidence / 2))


def wilson(successes: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """Return the Wilson score interval of a proportion successes / n (n = 0: the whole [0, 1])."""
    if n <= 0:
        return Interval(0.0, 1.0, 0, "wilson", confidence)
    from scipy.stats import binomtest

    ci = binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(float(ci.low), float(ci.high), int(n), "wilson", confidence)


def bootstrap(statistic: Callable[[np.ndarray], float], n: int, confidence: float = CONFIDENCE,
              resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Interval:
    """Return the percentile-bootstrap interval of statistic(indices) over n samples: statistic gets an index
    array (a resample, with replacement, of range(n)) and returns the KPI computed on those samples."""
    if n <= 1:
        value = float(statistic(np.arange(n))) if n == 1 else math.nan
        return Interval(value, value, n, "bootstrap", confidence)
    rng = np.random.default_rng(seed)
    values = np.array([statistic(rng.integers(0, n, n)) for _ in range(resamples)], dtype=np.float64)
    values = values[np.isfinite(values)] if np.isfinite(values).any() else values
    alpha = (1 - confidence) / 2
    return Interval(float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha)), n, "bootstrap",
                    confidence)


def difference_of_proportions(a: Sequence[bool], b: Sequence[bool], confidence: float = CONFIDENCE) -> Interval:
    """Return the bootstrap interval of mean(a) - mean(b) for paired per-sample outcomes (a metric's drop)."""
    a_arr, b_arr = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return bootstrap(lambda idx: float(a_arr[idx].mean() - b_arr[idx].mean()), len(a_arr), confidence)


def samples_needed(interval: Interval, value: float, bound: float, cap: int = 100_000) -> int | None:
    """Return about how many samples would make an interval like this one (half-width shrinking as 1/sqrt(n))
    exclude bound when the KPI stays at value; None when value sits on the bound (no sample count resolves it)."""
    half = (interval.high - interval.low) / 2
    gap = abs(value - bound)
    if interval.samples <= 0 or half <= 0:
        return None
    if gap <= 1e-12:
        return None
    needed = math.ceil(interval.samples * (half / gap) ** 2)
    return min(max(needed, interval.samples + 1), cap)


def with_needed(interval: Interval, value: float, minimum: float | None, maximum: float | None) -> Interval:
    """Return interval with `needed` set for the bound it straddles (unchanged when it straddles none)."""
    for bound in (minimum, maximum):
        if bound is not None and interval.low < bound < interval.high:
            needed = samples_needed(interval, value, bound)
            return Interval(interval.low, interval.high, interval.samples, interval.method, interval.confidence,
                            needed)
    return interval
