"""KPIs with limits that state their rule and flag marginal passes (after OpenHTF's measurements).

A KPI measured on N samples may carry its confidence interval in the step's KPIs, under
``kpis["intervals"][<kpi>]`` (see Interval). A limit is then judged on the interval, not the point
value: it fails only when the whole interval lies beyond the bound, passes when the whole interval
lies within it, and is *inconclusive* when the interval straddles the bound (the evidence cannot tell).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

INTERVALS_KEY = "intervals"
"""The key of a step's KPIs that holds {kpi name: Interval.as_dict()} for the KPIs measured on samples."""


@dataclass(frozen=True)
class Interval:
    """A KPI's confidence interval: [low, high] at `confidence`, from `samples` samples by `method`
    ('wilson' for proportions, 'bootstrap' for cosine/SQNR/task metrics, 'repeats' for latency blocks).
    `needed` is an estimate of the samples that would resolve the nearest limit, where one was made."""

    low: float
    high: float
    samples: int
    method: str
    confidence: float = 0.95
    needed: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """Return the interval as JSON-friendly values (None fields left out)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Interval":
        """Return the interval stored by as_dict."""
        return cls(**{k: data[k] for k in ("low", "high", "samples", "method", "confidence", "needed") if k in data})

    def __str__(self) -> str:
        return f"[{self.low:.4g}, {self.high:.4g}] ({self.confidence:.0%} {self.method}, n={self.samples})"


def kpi_value(kpis: dict, kpi: str) -> Any:
    """Return kpis[kpi], or the nested value a dotted name points to ('latency_ms.p50'), or None."""
    if not isinstance(kpis, dict):
        return None
    if kpi in kpis or "." not in kpi:
        return kpis.get(kpi)
    head, _, rest = kpi.partition(".")
    return kpi_value(kpis.get(head), rest)


def interval_of(kpis: dict, kpi: str) -> Interval | None:
    """Return the interval kpis carry for kpi (see INTERVALS_KEY), or None."""
    data = (kpis.get(INTERVALS_KEY) or {}).get(kpi) if isinstance(kpis, dict) else None
    return Interval.from_dict(data) if isinstance(data, dict) else None


@dataclass(frozen=True)
class Limit:
    """A rule on one KPI: value >= minimum and/or value <= maximum.

    A pass within `marginal` (as a fraction of the limit's magnitude, or absolute when the limit
    is 0) of a bound is flagged marginal; `marginal` 0 (or less) flags none, e.g. for a bound that is
    the best possible value (htp_fraction >= 1, errors <= 0).
    """

    kpi: str
    minimum: float | None = None
    maximum: float | None = None
    marginal: float = 0.01
    # False: a missing value (the device has no such reading) leaves the limit *not evaluated*, which
    # neither passes nor fails the step; True: a missing value fails.
    required: bool = True
    detail: str = ""  # what the value refers to (e.g. the zone of a temperature), shown in the verdict

    def __str__(self) -> str:
        parts = []
        if self.minimum is not None:
            parts.append(f"{self.kpi} >= {self.minimum:g}")
        if self.maximum is not None:
            parts.append(f"{self.kpi} <= {self.maximum:g}")
        return " and ".join(parts) or f"{self.kpi} (recorded)"

    def _band(self, bound: float) -> float:
        return abs(bound) * self.marginal if bound else self.marginal

    def _within(self, value: float) -> bool:
        return (self.minimum is None or value >= self.minimum) and (self.maximum is None or value <= self.maximum)

    def check(self, value: float, interval: Interval | None = None) -> "Verdict":
        """Return whether value meets this limit, and whether it is marginal; with an interval, the limit fails
        only when the whole interval is beyond a bound and is inconclusive when the interval straddles one."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return Verdict(self, value, not self.required, False, evaluated=False)
        if interval is not None and not (math.isnan(interval.low) or math.isnan(interval.high)):
            low_ok, high_ok = self._within(interval.low), self._within(interval.high)
            if low_ok and high_ok:
                return Verdict(self, value, True, False, interval=interval)
            if not low_ok and not high_ok and not self._within(value):
                return Verdict(self, value, False, False, interval=interval)
            return Verdict(self, value, False, False, interval=interval, inconclusive=True)
        ok = self._within(value)
        marginal = ok and self.marginal > 0 and any(b is not None and abs(value - b) <= self._band(b)
                              for b in (self.minimum, self.maximum))
        return Verdict(self, value, ok, marginal)


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking one KPI against its limit."""

    limit: Limit
    value: float
    passed: bool
    marginal: bool
    evaluated: bool = True
    interval: Interval | None = None
    inconclusive: bool = False  # the interval straddles the limit: neither passed nor failed

    @property
    def state(self) -> str:
        """Return 'passed', 'marginal', 'failed', 'inconclusive' or 'not evaluated'."""
        if not self.evaluated and not self.limit.required:
            return "not evaluated"
        if self.inconclusive:
            return "inconclusive"
        if not self.passed:
            return "failed"
        return "marginal" if self.marginal else "passed"

    def __str__(self) -> str:
        detail = f" ({self.limit.detail})" if self.limit.detail else ""
        if not self.evaluated and not self.limit.required:
            return f"NOT EVALUATED: {self.limit.kpi} has no value{detail}, rule {self.limit}"
        state = "INCONCLUSIVE" if self.inconclusive else "PASS" if self.passed else "FAIL"
        if self.marginal:
            state += " (marginal)"
        value = f"{self.value:.6g}" if isinstance(self.value, (int, float)) else str(self.value)
        interval = f" {self.interval}" if self.interval is not None else ""
        needed = (f"; about {self.interval.needed} samples are needed to resolve it"
                  if self.inconclusive and self.interval is not None and self.interval.needed else "")
        return f"{state}: {self.limit.kpi} = {value}{interval}{detail}, rule {self.limit}{needed}"


def check_all(kpis: dict, limits: list[Limit]) -> list[Verdict]:
    """Return one verdict per limit, for the KPI values in kpis (a missing KPI fails), each judged on the KPI's
    interval where kpis carry one (see INTERVALS_KEY)."""
    return [lim.check(kpis.get(lim.kpi), interval_of(kpis, lim.kpi)) for lim in limits]
