"""What every onboarding step returns: KPIs, the limits they are held to, tables and notes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.kpi import Limit, Verdict, check_all


@dataclass
class StepReport:
    """KPIs of one step for one device × model, with the rules they must meet."""

    step: str
    kpis: dict[str, Any] = field(default_factory=dict)
    limits: list[Limit] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    artifacts: dict[str, Path] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def verdicts(self) -> list[Verdict]:
        """One verdict per limit."""
        return check_all(self.kpis, self.limits)

    @property
    def passed(self) -> bool:
        """True when every limit is met and no failure was recorded."""
        return not self.failures and all(v.passed for v in self.verdicts)

    def problems(self) -> list[str]:
        """Return human-readable reasons this step did not pass."""
        return [*self.failures, *(str(v) for v in self.verdicts if not v.passed)]
