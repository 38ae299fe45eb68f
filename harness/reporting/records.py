"""The record of one step test: its outcome and KPIs for one device × model, and its one serialiser (a line of
--kpi-json, a test report's property, a baseline's step, a sign-off input)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.errors import HarnessError
from harness.json_values import json_safe
from harness.kpi import INTERVALS_KEY, interval_of

OUTCOMES = ("passed", "inconclusive", "failed", "error", "skipped")


class RecordError(HarnessError):
    """A step record read back (a KPI JSON file's) lacks a key or holds an unknown outcome; the message names it."""


@dataclass(frozen=True)
class Chart:
    """A PNG chart a step attached to its Allure test (name as attached, e.g. 'profile latency_histogram')."""

    name: str
    png: bytes


@dataclass(frozen=True)
class StepRecord:
    """One device × model × step as --kpi-json, JUnit properties, Allure, baselines and the sign-off page show it.

    outcome is one of OUTCOMES: `inconclusive` when no limit failed but the evidence could not decide one (the
    message says which and how many more samples are needed). message's first line is its headline (under 200
    characters), the details below it. marginal: the verdicts of limits passed close to a bound. KPIs measured
    on samples carry their confidence intervals under kpis["intervals"] (harness.kpi). Read back (not
    serialised): where it came from, its Allure result's charts and stop time (orders retries; 0 from KPI JSON)."""

    device: str
    soc: str
    model: str
    step: str
    outcome: str
    kpis: dict[str, Any]
    message: str = ""
    marginal: tuple[str, ...] = ()
    source: str = field(default="", compare=False)
    charts: tuple[Chart, ...] = field(default=(), compare=False)
    finished_ms: int = field(default=0, compare=False)

    @property
    def key(self) -> tuple[str, str, str]:
        """Return (device, model, step)."""
        return self.device, self.model, self.step

    def to_json(self) -> dict[str, Any]:
        """Return the record as a KPI JSON record (KPIs as plain JSON)."""
        return {"device": self.device, "soc": self.soc, "model": self.model, "step": self.step,
                "outcome": self.outcome, "kpis": json_safe(self.kpis), "message": self.message,
                "marginal": list(self.marginal)}

    @classmethod
    def from_json(cls, obj: Any, where: str, source: str = "") -> StepRecord:
        """Return the record of a KPI JSON record (to_json's); RecordError naming where it is when it lacks a key
        or holds an unknown outcome."""
        missing = [k for k in ("device", "model", "step", "outcome") if not isinstance(obj, dict) or not obj.get(k)]
        if missing:
            raise RecordError(f"{where} lacks {', '.join(missing)}; re-run pytest with --kpi-json to rewrite it")
        outcome = str(obj["outcome"])
        if outcome not in OUTCOMES:
            raise RecordError(f"{where} has outcome {outcome!r}, not one of {', '.join(OUTCOMES)}")
        kpis = obj.get("kpis") if isinstance(obj.get("kpis"), dict) else {}
        return cls(str(obj["device"]), str(obj.get("soc") or ""), str(obj["model"]), str(obj["step"]), outcome, kpis,
                   str(obj.get("message") or ""), tuple(str(v) for v in obj.get("marginal") or [] if v), source)

    def properties(self) -> list[tuple[str, Any]]:
        """Return the scalar KPIs (and one level of nested ones, e.g. latency_ms.p50) as (step.kpi, value) pairs
        for --junitxml's <properties>; a KPI's confidence interval as (step.kpi.interval, '[low, high] (95%
        method, n=N)')."""
        pairs = []
        for key, value in self.kpis.items():
            if key == INTERVALS_KEY and isinstance(value, dict):
                pairs.extend((f"{self.step}.{k}.interval", str(interval_of(self.kpis, k))) for k in value
                             if interval_of(self.kpis, k))
            elif isinstance(value, (int, float, str, bool)) and not (isinstance(value, str) and len(value) > 200):
                pairs.append((f"{self.step}.{key}", value))
            elif isinstance(value, dict):
                pairs.extend((f"{self.step}.{key}.{k}", v) for k, v in value.items()
                             if isinstance(v, (int, float, bool)))
        return pairs
