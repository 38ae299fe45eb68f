"""Statistics of independent repeats (measurement blocks): each block is one runner invocation and contributes
one sample, its median; the iterations inside a block share its process, host load and thermal state, so they
are not independent samples of the device's speed.

* ``summary(values)``: the blocks' median, their between-block spread (``noise_pct``: the relative median
  absolute deviation, scaled by 1.4826 to estimate a standard deviation for normal data) and the order-statistic
  interval of the median (median_interval: the k-th smallest to the k-th largest block, the narrowest such pair
  that covers the median with 95 % confidence; [min, max] on 5 blocks or fewer, with its lower confidence);
* ``unpaired_p(a, b)``: the two-sided Mann-Whitney U test of two sets of block medians (blocks of two sessions);
* ``paired(a, b)``: the ratio b/a of interleaved A/B pairs (geometric mean) and a one-sample t-test of the log
  ratios, so drift shared by the two blocks of a pair cancels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from harness.kpi import Interval

CONFIDENCE = 0.95  # harness.stats.CONFIDENCE (not imported: stats imports scipy's distributions at import)

MAD_SCALE = 1.4826  # MAD x this estimates the standard deviation of normal data


@dataclass(frozen=True)
class Repeats:
    """A figure measured in independent blocks: their median, spread and the interval of the median."""

    value: float
    noise_pct: float
    blocks: int
    interval: Interval


def summary(values: Sequence[float]) -> Repeats:
    """Return the median of the block values, their relative spread in % (1.4826 x MAD / median) and the
    distribution-free interval of the median (median_interval). Raises ValueError for none."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("no blocks to summarise")
    median = float(np.median(arr))
    mad = float(np.median(np.abs(arr - median)))
    noise = 100.0 * MAD_SCALE * mad / abs(median) if median else 0.0
    return Repeats(median, round(noise, 3), int(arr.size), median_interval(arr))


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Return the distribution-free interval of the median of independent values: from the k-th smallest to the
    k-th largest, with the largest k whose coverage 1 - 2 P(Binomial(n, 1/2) < k) is at least `confidence`
    (k = 1, [min, max], with its lower coverage 1 - 2 x 0.5^n when n is too small to reach it: n <= 5 at 95 %).
    So on 9 or more values one outlying value on each side does not move the interval."""
    from scipy.stats import binom

    arr = np.sort(np.asarray(values, dtype=np.float64))
    n = int(arr.size)
    k = 1
    while k < n / 2 and 1 - 2 * binom.cdf(k, n, 0.5) >= confidence:  # coverage of the (k+1)-th pair
        k += 1
    coverage = 1 - 2 * binom.cdf(k - 1, n, 0.5) if n > 1 else 0.0
    return Interval(float(arr[k - 1]), float(arr[n - k]), n, "repeats", round(float(coverage), 4))


def min_unpaired_p(n: int, m: int) -> float:
    """Return the smallest two-sided p-value a Mann-Whitney U test of n against m values can give (complete
    separation): 2 / C(n + m, n); 1.0 when a side is empty."""
    if n < 1 or m < 1:
        return 1.0
    return min(1.0, 2.0 / math.comb(n + m, n))


def unpaired_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Return the two-sided Mann-Whitney U test's p-value of two sets of block values (1.0 where undefined)."""
    from scipy.stats import mannwhitneyu

    if not a or not b:
        return 1.0
    p = float(mannwhitneyu(list(a), list(b), alternative="two-sided").pvalue)
    return 1.0 if math.isnan(p) else p


@dataclass(frozen=True)
class Paired:
    """Interleaved A/B pairs: the geometric-mean ratio b/a, its t-test p-value and the number of pairs."""

    ratio: float
    p_value: float
    pairs: int


def paired(a: Sequence[float], b: Sequence[float]) -> Paired:
    """Return the geometric-mean ratio of b to a over pairs (a[i], b[i]) and the two-sided one-sample t-test's
    p-value of the log ratios (0 when every pair moved by the same nonzero ratio, 1 when none moved)."""
    from scipy.stats import ttest_1samp

    logs = np.log(np.asarray(b, dtype=np.float64) / np.asarray(a, dtype=np.float64))
    if logs.size == 0:
        return Paired(1.0, 1.0, 0)
    ratio = float(np.exp(logs.mean()))
    if logs.size < 2 or float(np.ptp(logs)) == 0.0:
        p = 1.0 if logs.size < 2 or logs[0] == 0 else 0.0
    else:
        p = float(ttest_1samp(logs, 0.0).pvalue)
    return Paired(ratio, 1.0 if math.isnan(p) else p, int(logs.size))
