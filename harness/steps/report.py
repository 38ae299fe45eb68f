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
    inconclusive: list[str] = field(default_factory=list)  # why the evidence cannot decide (not a failure)

    @property
    def verdicts(self) -> list[Verdict]:
        """One verdict per limit."""
        return check_all(self.kpis, self.limits)

    @property
    def passed(self) -> bool:
        """True when every limit is met (decidedly) and no failure or inconclusive reason was recorded."""
        return not self.failures and not self.inconclusive and all(v.passed for v in self.verdicts)

    def problems(self) -> list[str]:
        """Return human-readable reasons this step failed (inconclusive limits are not among them)."""
        return [*self.failures, *(str(v) for v in self.verdicts if not v.passed and not v.inconclusive)]

    def undecided(self) -> list[str]:
        """Return why the evidence cannot decide this step: inconclusive reasons and limits."""
        said = " ".join(self.inconclusive)  # a limit a reason already explains is not listed twice
        return [*self.inconclusive, *(str(v) for v in self.verdicts if v.inconclusive and f"{v.limit.kpi} " not in said)]

    @property
    def status(self) -> str:
        """Return 'failed' (a failure or a broken limit), 'inconclusive' (none, but the evidence cannot decide),
        'marginal' (passed, close to a limit) or 'passed'."""
        verdicts = self.verdicts
        if self.problems():
            return "failed"
        if self.undecided():
            return "inconclusive"
        return "marginal" if any(v.marginal for v in verdicts) else "passed"
