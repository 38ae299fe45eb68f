"""The release verdict: GO only when no step failed, no KPI regressed against its baseline, no device is
quarantined and every expected step ran and was decided, on every device x model of the runs; NO-GO with each
reason when one of the first four is not so; RE-RUN when the only reasons are inconclusive steps (the evidence
could not decide a limit: each says which step and how many more samples it needs). Never a pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.baseline import REGRESSION_STEP
from harness.errors import HarnessError
from harness.reporting.records import StepRecord
from harness.signoff.format import COMPARE_DIGITS, details, headline, value_text, when
from harness.signoff.inputs import NOT_RUN, DeviceState, RunSet
from harness.steps.table import names

REASON_KINDS = ("failed", "regression", "quarantined", "not_run", "inconclusive")
GO, NO_GO, RE_RUN = "GO", "NO-GO", "RE-RUN"


class ExpectedStepsError(HarnessError):
    """--expect-steps names no step."""


@dataclass(frozen=True)
class KpiDelta:
    """A KPI of the regression step's verdicts: baseline and current values and what changed."""

    device: str
    model: str
    step: str
    kpi: str
    baseline: Any
    current: Any
    delta: Any
    delta_pct: Any
    verdict: str
    p_value: Any
    rule: str = ""

    def describe(self) -> str:
        """Return 'kpi: baseline -> current (+x%), p=...' for the reasons list (the step is said beside it)."""
        pct = f" ({self.delta_pct:+.1f}%)" if isinstance(self.delta_pct, (int, float)) else ""
        p = f", p={self.p_value:.3g}" if isinstance(self.p_value, (int, float)) else ""
        return f"{self.kpi}: baseline {_short(self.baseline)} -> {_short(self.current)}{pct}{p}"


@dataclass(frozen=True)
class Reason:
    """Why the release is not GO: a failed step, a regression, a quarantined device, a step not run, or an
    inconclusive step (a reason to re-run). message is a headline; details what the record says beyond it."""

    kind: str
    device: str
    model: str
    step: str
    message: str
    details: str = ""

    def describe(self) -> str:
        """Return the reason as one line: 'kind: device / model / step: message'."""
        where = " / ".join(x for x in (self.device, self.model, self.step) if x)
        return f"{self.kind.replace('_', ' ')}: {where}: {self.message}" if self.message else f"{self.kind}: {where}"


@dataclass(frozen=True)
class ReleaseVerdict:
    """GO or NO-GO, the reasons, the expected steps and the rule that chose them, and the baseline deltas."""

    reasons: list[Reason]
    expected_steps: list[str]
    expect_rule: str
    deltas: list[KpiDelta] = field(default_factory=list)
    skipped_everywhere: dict[str, str] = field(default_factory=dict)  # not expected: step -> a skip message
    not_recorded: list[str] = field(default_factory=list)  # steps of the suites no device x model recorded

    @property
    def go(self) -> bool:
        """Return True when there is no reason against the release."""
        return not self.reasons

    @property
    def rerun(self) -> bool:
        """Return True when the only reasons are inconclusive steps: nothing failed, the runs must be repeated
        with more samples before the release can be decided."""
        return bool(self.reasons) and all(r.kind == "inconclusive" for r in self.reasons)

    @property
    def label(self) -> str:
        """Return 'GO', 'RE-RUN' or 'NO-GO'."""
        return GO if self.go else RE_RUN if self.rerun else NO_GO

    def by_kind(self, kind: str) -> list[Reason]:
        """Return the reasons of one kind (failed, regression, quarantined, not_run, inconclusive)."""
        return [r for r in self.reasons if r.kind == kind]


def order_steps(steps: set[str] | list[str]) -> list[str]:
    """Return steps in the step table's order, steps the table does not have after them in name order."""
    rank = {s: i for i, s in enumerate(names())}
    return sorted(set(steps), key=lambda s: (rank.get(s, len(rank)), s))


def expected_steps(runs: RunSet, rule: str = "seen") -> tuple[list[str], str]:
    """Return the steps every device x model must have passed, and the rule in words.

    rule: 'seen' (every step that ran, not skipped, on at least one device x model of the runs: a step
    skipped everywhere, such as the regression step without --baseline or the sweep with --sweep off, was
    turned off for the run), 'all' (every step of the suites, plus any recorded), or a comma-separated list.
    Raises ExpectedStepsError for a list naming no step.
    """
    seen = {r.step for r in runs.results}
    if rule == "seen":
        ran = {r.step for r in runs.results if r.outcome != "skipped"}
        return order_steps(ran), "every step that ran on at least one device × model of these runs"
    if rule == "all":
        return order_steps(seen | set(names())), "every step of the onboarding suites"
    listed = [s.strip() for s in rule.split(",") if s.strip()]
    if not listed:
        raise ExpectedStepsError(f"--expect-steps {rule!r} names no step: give 'seen', 'all' or STEP,STEP,...")
    return order_steps(listed), "the steps given with --expect-steps"


def regression_deltas(record: StepRecord) -> list[KpiDelta]:
    """Return the KPI verdicts of a regression step's record (empty when it has none)."""
    return [KpiDelta(record.device, record.model, str(v.get("step") or ""), str(v["kpi"]), v.get("baseline"),
                     v.get("current"), v.get("delta"), v.get("delta_pct"), str(v.get("verdict") or ""),
                     v.get("p_value"), str(v.get("rule") or ""))
            for v in record.kpis.get("verdicts") or [] if isinstance(v, dict) and v.get("kpi")]


def decide(runs: RunSet, rule: str = "seen") -> ReleaseVerdict:
    """Return the release verdict of the merged runs under the expected-steps rule (see expected_steps)."""
    expected, rule_text = expected_steps(runs, rule)
    reasons: list[Reason] = []
    deltas: list[KpiDelta] = []
    for r in runs.results:
        if r.step == REGRESSION_STEP and r.outcome != "skipped":
            record_deltas = regression_deltas(r)
            deltas += record_deltas
            if r.outcome == "failed":
                reasons += _regression_reasons(r, record_deltas)
                continue
        if r.outcome in ("failed", "error"):
            reasons.append(Reason("failed", r.device, r.model, r.step, headline(r.message) or r.outcome,
                                  details(r.message)))
        elif r.outcome == "inconclusive":
            reasons.append(Reason("inconclusive", r.device, r.model, r.step,
                                  headline(r.message) or "the evidence could not decide a limit: re-run with more "
                                                         "samples", details(r.message)))
    reasons += [Reason("quarantined", d.id, "", "", _device_reason(d)) for d in runs.devices if d.out_of_service]
    reasons += _not_run(runs, expected)
    reasons.sort(key=lambda x: REASON_KINDS.index(x.kind))
    skipped = {r.step: headline(r.message) for r in runs.results if r.step not in expected and r.outcome == "skipped"}
    recorded = {r.step for r in runs.results}
    missing = [s for s in names() if s not in expected and s not in recorded]
    return ReleaseVerdict(reasons, expected, rule_text, deltas, dict(sorted(skipped.items())), missing)


def _regression_reasons(record: StepRecord, deltas: list[KpiDelta]) -> list[Reason]:
    regressed = [d for d in deltas if d.verdict == "regressed"]
    if not regressed:
        return [Reason("regression", record.device, record.model, record.step,
                       headline(record.message) or "the regression step failed")]
    return [Reason("regression", record.device, record.model, d.step or record.step, d.describe()) for d in regressed]


def _not_run(runs: RunSet, expected: list[str]) -> list[Reason]:
    out = []
    for device, _, model in runs.targets():
        for step in expected:
            r = runs.result(device, model, step)
            if r is None:
                out.append(Reason("not_run", device, model, step, f"{NOT_RUN}: no record of this step"))
            elif r.outcome == "skipped":
                out.append(Reason("not_run", device, model, step, f"skipped: {headline(r.message) or 'no reason'}"))
    return out


def _device_reason(d: DeviceState) -> str:
    text = f"{d.status}" + (f": {d.reason}" if d.reason else "")
    return text + (f" (since {when(d.since)})" if d.since else "")


def _short(value: Any) -> str:
    return value_text(value, digits=COMPARE_DIGITS)
