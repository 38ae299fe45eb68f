"""KPIs with limits that state their rule and flag marginal passes (after OpenHTF's measurements)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    """A rule on one KPI: value >= minimum and/or value <= maximum.

    A pass within `marginal` (as a fraction of the limit's magnitude, or absolute when the limit
    is 0) of a bound is flagged marginal.
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

    def check(self, value: float) -> "Verdict":
        """Return whether value meets this limit, and whether it is marginal."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return Verdict(self, value, not self.required, False, evaluated=False)
        ok = ((self.minimum is None or value >= self.minimum)
              and (self.maximum is None or value <= self.maximum))
        marginal = ok and any(b is not None and abs(value - b) <= self._band(b)
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

    def __str__(self) -> str:
        detail = f" ({self.limit.detail})" if self.limit.detail else ""
        if not self.evaluated and not self.limit.required:
            return f"NOT EVALUATED: {self.limit.kpi} has no value{detail}, rule {self.limit}"
        state = "PASS" if self.passed else "FAIL"
        if self.marginal:
            state += " (marginal)"
        value = f"{self.value:.6g}" if isinstance(self.value, (int, float)) else str(self.value)
        return f"{state}: {self.limit.kpi} = {value}{detail}, rule {self.limit}"


def check_all(kpis: dict, limits: list[Limit]) -> list[Verdict]:
    """Return one verdict per limit, for the KPI values in kpis (a missing KPI fails)."""
    return [lim.check(kpis.get(lim.kpi)) for lim in limits]
