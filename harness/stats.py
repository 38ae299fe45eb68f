"""Confidence intervals for KPIs measured on samples: Wilson for proportions, Newcombe's hybrid score for the
difference of two paired proportions, a percentile bootstrap for statistics of paired samples (cosine, SQNR,
task metrics), and the sample count a limit needs.

These are the standard forms (Wilson's score interval, the closed form scipy.stats.binomtest's also computes; Newcombe 1998, Statistics in Medicine
17:2635, method 10, as Fagerland, Lydersen and Laake's contingencytables computes it; Efron's percentile
bootstrap over samples with a fixed seed, so a verdict is reproducible for the same outputs).
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import numpy as np

from harness.kpi import INTERVALS_KEY, Interval, Limit, check_all

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
FLOORED = "bootstrap, floored"  # widened to the least interval n samples allow (harness.evaluation.task._floor)
MIN_BOOTSTRAP_SAMPLES = 5  # fewer: a bootstrap interval's coverage is far below its nominal level


@functools.lru_cache(maxsize=16)
def _z(confidence: float) -> float:
    """Return the two-sided normal quantile of confidence (memoised: scipy's norm.ppf takes a millisecond, and
    samples_needed's and floored_needed's bisections ask for it at every step)."""
    from scipy.stats import norm

    return float(norm.ppf(0.5 + confidence / 2))


def wilson(successes: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """Return the Wilson score interval of a proportion successes / n (n = 0: the whole [0, 1])."""
    if n <= 0:
        return Interval(0.0, 1.0, 0, "wilson", confidence)
    low, high = _wilson_bounds(successes / n, n, _z(confidence))
    return Interval(low, high, int(n), "wilson", confidence)


def bootstrap(statistic: Callable[[np.ndarray], float], n: int, confidence: float = CONFIDENCE,
              resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
              bounds: tuple[float, float] | None = None) -> Interval:
    """Return the expanded percentile-bootstrap interval of statistic(indices) over n samples: statistic gets an
    index array (a resample, with replacement, of range(n)) and returns the KPI computed on those samples.

    The plain percentile interval is too narrow on few samples (on 2 it covers the mean far less often than
    95 %); Hesterberg's expansion (2015, "What teachers should know about the bootstrap", The American
    Statistician 69:371) takes the quantiles at Phi(-sqrt(n/(n-1)) t_(1-alpha/2, n-1)) instead of alpha/2, which
    is the plain interval for large n and the resamples' whole range for n = 2. One sample has no spread to
    resample and below MIN_BOOTSTRAP_SAMPLES even the expanded interval covers far less than it claims (about
    half the time on 2 samples), so on 1 to MIN_BOOTSTRAP_SAMPLES - 1 samples the interval is the statistic's
    whole range: its bounds (cosine: [-1, 1]) or, unbounded (SQNR in dB, perplexity), the whole real line: no
    limit is resolved yet, and unresolved() says how many samples would. No sample: [nan, nan] (not evaluated)."""
    if n <= 0:
        return Interval(math.nan, math.nan, 0, "bootstrap", confidence)
    if n < MIN_BOOTSTRAP_SAMPLES:
        low, high = bounds if bounds is not None else (-math.inf, math.inf)
        return Interval(float(low), float(high), n, "bootstrap", confidence)
    values = np.array([statistic(idx) for idx in _resamples(n, resamples, seed)], dtype=np.float64)
    return _percentile_interval(values, n, confidence)


def bootstrap_of_sums(rows: np.ndarray, statistic: Callable[[np.ndarray], float], confidence: float = CONFIDENCE,
                      resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                      bounds: tuple[float, float] | None = None) -> Interval:
    """Return bootstrap()'s interval of a statistic of the column totals of rows (one row of sums per sample, such
    as metrics.sample_sums): the same resamples, each resample's totals taken in one matrix product instead of a
    gather and a sum per resample (a sweep or a mixed-precision search takes dozens of these intervals)."""
    n = len(rows)
    if n < MIN_BOOTSTRAP_SAMPLES:
        return bootstrap(lambda idx: statistic(rows[idx].sum(axis=0)), n, confidence, resamples, seed, bounds)
    indices = _resamples(n, resamples, seed)
    counts = np.bincount((indices + n * np.arange(resamples)[:, None]).ravel(), minlength=resamples * n)
    totals = counts.reshape(resamples, n).astype(np.float64) @ np.asarray(rows, dtype=np.float64)
    return _percentile_interval(np.array([statistic(t) for t in totals], dtype=np.float64), n, confidence)


def _resamples(n: int, resamples: int, seed: int) -> np.ndarray:
    """Return the bootstrap's resamples of range(n), one per row: indices drawn with replacement from a seeded
    generator in one call (the same draws as one call per resample)."""
    return np.random.default_rng(seed).integers(0, n, (resamples, n))


def _percentile_interval(values: np.ndarray, n: int, confidence: float) -> Interval:
    """Return the expanded percentile interval of resampled statistic values (non-finite ones left out)."""
    if not np.isfinite(values).any():  # every resample infinite (SQNR of outputs equal to the reference): that value
        return Interval(float(np.min(values)), float(np.max(values)), n, "bootstrap", confidence)
    values = values[np.isfinite(values)]
    alpha = _expanded_alpha(n, confidence)
    return Interval(float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha)), n, "bootstrap",
                    confidence)


@functools.lru_cache(maxsize=256)
def _expanded_alpha(n: int, confidence: float) -> float:
    """Return the lower quantile of Hesterberg's expanded percentile bootstrap for n samples (memoised: scipy's
    t.ppf takes a millisecond, and a sweep asks for the same n dozens of times)."""
    from scipy.stats import norm, t

    return float(norm.cdf(-math.sqrt(n / (n - 1)) * t.ppf(0.5 + confidence / 2, n - 1)))


def complement(interval: Interval) -> Interval:
    """Return the interval of 1 - x for an interval of x (a drop of an agreement is 1 - agreement)."""
    return Interval(1.0 - interval.high, 1.0 - interval.low, interval.samples, interval.method, interval.confidence,
                    interval.needed)


def _wilson_bounds(p: float, n: float, z: float) -> tuple[float, float]:
    """Return the Wilson score bounds of an observed proportion p of n samples (closed form; n may be fractional)."""
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def difference_of_proportions(a: Sequence[bool], b: Sequence[bool], confidence: float = CONFIDENCE) -> Interval:
    """Return the interval of mean(a) - mean(b) for paired per-sample outcomes (a metric's drop: a = the float
    model right, b = the quantized model right), by Newcombe's hybrid score method for paired proportions: unlike
    a bootstrap it does not collapse to [0, 0] when no sample changed (0 of 8 changed is not proof)."""
    a_arr, b_arr = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    n = len(a_arr)
    if n == 0:
        return Interval(-1.0, 1.0, 0, "newcombe", confidence)
    both, only_a = int(np.sum(a_arr & b_arr)), int(np.sum(a_arr & ~b_arr))
    only_b, neither = int(np.sum(~a_arr & b_arr)), int(np.sum(~a_arr & ~b_arr))
    p1, p2 = (both + only_a) / n, (both + only_b) / n
    z = _z(confidence)
    l1, u1 = _wilson_bounds(p1, n, z)
    l2, u2 = _wilson_bounds(p2, n, z)
    margins = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    phi = 0.0
    if margins > 0:  # the correlation of the two proportions, continuity-corrected as Newcombe's method 10
        cross = both * neither - only_a * only_b
        phi = (cross - n / 2) / math.sqrt(margins) if cross > n / 2 else min(cross, 0) / math.sqrt(margins)
    estimate = p1 - p2
    low = estimate - math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    high = estimate + math.sqrt(max((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2, 0.0))
    return Interval(max(-1.0, low), min(1.0, high), n, "newcombe", confidence)


def proportion_needed(value: float, bound: float, confidence: float = CONFIDENCE,
                      cap: int = 100_000) -> int | None:
    """Return the fewest samples whose Wilson interval around the observed proportion `value` excludes bound
    (None when value sits on the bound, or more than cap would be needed). The Wilson interval of 1 - p mirrors
    that of p, so this serves a drop of an agreement (1 - agreement) as well."""
    if abs(value - bound) <= 1e-12 or not 0.0 <= value <= 1.0:
        return None
    z = _z(confidence)

    def resolved(n: int) -> bool:
        low, high = _wilson_bounds(value, n, z)
        return high <= bound if value < bound else low > bound

    if not resolved(cap):
        return None
    lo, hi = 1, cap
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if resolved(mid) else (mid + 1, hi)
    return lo


def resolvable_drop(n: int, confidence: float = CONFIDENCE) -> float:
    """Return the smallest drop of an agreement that n samples can resolve: the Wilson upper bound of the
    disagreement when none of the n samples disagrees (z²/(n + z²); 0.02 needs n >= 189 at 95 %)."""
    return 1.0 if n <= 0 else _wilson_bounds(0.0, n, _z(confidence))[1]


def samples_needed(interval: Interval, value: float, bound: float, cap: int = 100_000) -> int | None:
    """Return about how many samples would make an interval like this one (half-width shrinking as 1/sqrt(n))
    exclude bound when the KPI stays at value; None when value sits on the bound (no sample count resolves it)."""
    half = (interval.high - interval.low) / 2
    gap = abs(value - bound)
    if interval.samples <= 0 or half <= 0 or gap <= 1e-12:
        return None
    if not math.isfinite(half):  # too few samples to have a spread yet (bootstrap): the least that have one
        return max(MIN_BOOTSTRAP_SAMPLES, interval.samples + 1)
    if not math.isfinite(value):
        return None
    needed = math.ceil(interval.samples * (half / gap) ** 2)
    return min(max(needed, interval.samples + 1), cap)


def floored_needed(interval: Interval, value: float, bound: float, cap: int = 100_000) -> int | None:
    """Return the fewest samples whose FLOORED interval (its distance from value scaling as resolvable_drop(n))
    would exclude bound; None when value sits on the bound or more than cap are needed."""
    reach = interval.low if bound < value else interval.high  # the side of the interval facing the bound
    gap, spread = abs(value - bound), abs(value - reach)
    if gap <= 1e-12 or spread <= 0 or interval.samples <= 0:
        return None
    scale = spread / resolvable_drop(interval.samples, interval.confidence)  # value - reach = scale x share(n)
    if scale * resolvable_drop(cap, interval.confidence) >= gap:
        return None
    lo, hi = interval.samples + 1, cap
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if scale * resolvable_drop(mid, interval.confidence) < gap else (mid + 1, hi)
    return lo


def hull(a: Interval, b: Interval) -> Interval:
    """Return the least interval holding a and b (a's samples and confidence; b's method when b widened it)."""
    low, high = min(a.low, b.low), max(a.high, b.high)
    method = b.method if (low, high) != (a.low, a.high) else a.method
    return Interval(low, high, a.samples, method, a.confidence)


def floored(interval: Interval, value: float, worst: float, best: float) -> Interval:
    """Return the hull of interval (a bootstrap of a mean of per-sample values in [worst, best]) and the least
    interval its n samples allow around the observed mean `value`: up to resolvable_drop(n) of the samples (Wilson's
    bound for 0 of n) moved to worst, or to best. A bootstrap collapses to a point when every sample agrees (8
    prompts all at 1.0: [1, 1]), which n samples cannot show; method FLOORED when the floor widened it."""
    low, high = sorted(floor_ends(value, interval.samples, worst, best, interval.confidence))
    return hull(interval, Interval(low, high, interval.samples, FLOORED, interval.confidence))


def floor_ends(value: float, n: int, worst: float, best: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Return the values a mean of n per-sample values in [worst, best], observed at value, reaches when up to
    resolvable_drop(n) of the samples move to worst, and to best: (towards worst, towards best)."""
    share = resolvable_drop(n, confidence)
    return value + share * (worst - value), value + share * (best - value)


def with_needed(interval: Interval, value: float, minimum: float | None, maximum: float | None) -> Interval:
    """Return interval with `needed` set for the bound it straddles (unchanged when it straddles none): exact
    for a Wilson interval (proportion_needed), else from its half-width shrinking as 1/sqrt(n)."""
    for bound in (minimum, maximum):
        if bound is not None and interval.low <= bound <= interval.high and interval.low < interval.high:
            if interval.method == "wilson":
                needed = proportion_needed(value, bound, interval.confidence)
            elif interval.method == FLOORED:  # its bounds shrink as resolvable_drop(n), about 1/n
                needed = floored_needed(interval, value, bound)
            else:
                needed = samples_needed(interval, value, bound)
            if needed is not None:  # a bootstrap resolves nothing below MIN_BOOTSTRAP_SAMPLES (see bootstrap)
                needed = max(needed, interval.samples + 1,
                             MIN_BOOTSTRAP_SAMPLES if interval.method == "bootstrap" else 0)
            return Interval(interval.low, interval.high, interval.samples, interval.method, interval.confidence,
                            needed)
    return interval


def unresolved(kpis: dict, limits: "list[Limit]") -> list[str]:
    """Return one sentence per limit its KPI's interval straddles, saying how many samples could not resolve it
    and about how many would (kpis["intervals"] gets `needed` set for those KPIs)."""
    sentences = []
    for verdict in check_all(kpis, limits):
        if not verdict.inconclusive or verdict.interval is None:
            continue
        lim = verdict.limit
        interval = with_needed(verdict.interval, verdict.value, lim.minimum, lim.maximum)
        kpis[INTERVALS_KEY][lim.kpi] = interval.as_dict()
        if lim.kpi.endswith("_drop") and lim.maximum is not None:
            what = f"a drop of {lim.maximum:g}"
        else:
            what = str(lim)
        more = (f"about {interval.needed} are needed" if interval.needed is not None else
                "no sample count resolves it (the value sits on the limit)")
        sentences.append(f"inconclusive: {interval.samples} samples cannot resolve {what} ({lim.kpi} "
                         f"{verdict.value:.4g}, {interval.confidence:.0%} interval [{interval.low:.4g}, "
                         f"{interval.high:.4g}]); {more}")
    return sentences
