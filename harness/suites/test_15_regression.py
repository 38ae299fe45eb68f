"""Regression gate: this run's KPIs against a saved baseline (--baseline DIR): accuracy within its tolerance,
latency, memory and energy on independent blocks (significant and beyond the noise floor; simulator wall time by
an interleaved A/B where the baseline's artifact is cached), context-binary size by a relative threshold, and no
step that passed in the baseline failing now. Undecided comparisons are inconclusive, not failed. Runs after
every other step."""

import pytest


@pytest.mark.step("regression")
def test_regression(regression, check):
    report = check(regression)
    assert report.kpis["regressed"] == [] and report.kpis["verdicts"]
