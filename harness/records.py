"""The record of one step test: its outcome and KPIs for one device × model (a line of --kpi-json)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OUTCOMES = ("passed", "inconclusive", "failed", "error", "skipped")


@dataclass(frozen=True)
class StepRecord:
    """One line of --kpi-json: a step's outcome and KPIs for one device × model.

    outcome is one of OUTCOMES: `inconclusive` when no limit failed but the evidence could not decide one
    (the message says which and how many more samples are needed). message's first line is its headline
    (under 200 characters), the details below it. marginal: the verdicts of limits passed close to a bound.
    KPIs measured on samples carry their confidence intervals under kpis["intervals"] (harness.kpi)."""

    device: str
    soc: str
    model: str
    step: str
    outcome: str
    kpis: dict[str, Any]
    message: str = ""
    marginal: list[str] = field(default_factory=list)
