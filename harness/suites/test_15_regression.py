"""Regression gate: this run's KPIs against a saved baseline (--baseline DIR): accuracy within its tolerance,
latency by a Mann-Whitney U test and a relative threshold, memory, context-binary size and energy by relative
thresholds, and no step that passed in the baseline failing now. Runs after every other step."""

import pytest


@pytest.mark.step("regression")
def test_regression(regression, check):
    report = check(regression)
    assert report.kpis["counts"]["regressed"] == 0 and report.kpis["verdicts"]
