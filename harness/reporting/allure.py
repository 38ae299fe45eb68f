"""Allure output for step reports: parameters, KPI attachments, tables as CSV, verdicts and confidence intervals
as steps, and the status of inconclusive steps and marginal passes.

allure-pytest's API is a no-op unless pytest runs with --alluredir, so this is always safe to call.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import allure

from harness.kpi import INTERVALS_KEY, interval_of, kpi_value
from harness.reporting import charts
from harness.reporting.names import (DEVICE, INCONCLUSIVE, MARGINAL, MODEL, SOC, kpi_attachment, soc_parameter,
                                     status_message, step_name)
from harness.reporting.records import StepRecord
from harness.steps.report import StepReport


def table_csv(rows: list[dict[str, Any]]) -> str:
    """Return rows as CSV text: a column per key of any row, in the order first seen (a row without one leaves it
    empty)."""
    if not rows:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def label_target(device: str, soc: str, soc_name: str, model: str) -> None:
    """Set the Allure parameters that identify a device × model test."""
    allure.dynamic.parameter(DEVICE, device)
    allure.dynamic.parameter(SOC, soc_parameter(soc, soc_name))
    allure.dynamic.parameter(MODEL, model)
    allure.dynamic.tag(soc)


_ATTACHABLE = {".png": allure.attachment_type.PNG, ".csv": allure.attachment_type.CSV,
               ".json": allure.attachment_type.JSON, ".html": allure.attachment_type.HTML}


def attach_report(report: StepReport, record: StepRecord) -> None:
    """Record a step report in Allure: the record's KPIs as JSON, tables as CSV, the PNG, CSV and JSON artifacts
    (charts, raw profiles, exported encodings; models stay in the cache), an Allure step per verdict, interval
    (what each KPI measured on samples rests on), failure, inconclusive reason and note."""
    with allure.step(step_name(report.step)):
        allure.attach(json.dumps(record.to_json()["kpis"], indent=2), name=kpi_attachment(report.step),
                      attachment_type=allure.attachment_type.JSON)
        for name, rows in report.tables.items():
            allure.attach(table_csv(rows), name=f"{report.step} {name}", attachment_type=allure.attachment_type.CSV)
        for name, path in report.artifacts.items():
            kind = _ATTACHABLE.get(path.suffix.lower())
            if kind is not None and charts.ready(path):
                allure.attach.file(str(path), name=f"{report.step} {name}", attachment_type=kind)
        kpis = report.kpis
        for title in [*task_metric_titles(kpis), *map(str, report.verdicts),
                      *(f"interval: {k} = {kpi_value(kpis, k)} {interval_of(kpis, k)}"
                        for k in kpis.get(INTERVALS_KEY) or {} if interval_of(kpis, k) is not None),
                      *(f"FAIL: {failure}" for failure in report.failures),
                      *(status_message(INCONCLUSIVE, reason) for reason in report.inconclusive),
                      *(f"note: {note}" for note in report.notes)]:
            with allure.step(title):
                pass


def task_metric_titles(kpis: dict[str, Any]) -> list[str]:
    """Return the Allure step title of a step's task metric beside float's, with the ratio, its interval and the
    sample count (none when the step measured no task metric)."""
    name, value = kpis.get("task_metric_name"), kpis.get("task_metric")
    if not name or value is None or "task_metric_ratio" not in kpis:
        return []
    ratio, interval = kpis.get("task_metric_ratio"), interval_of(kpis, "task_metric_ratio")
    floating = kpis.get("float_task_metric")
    return [f"task metric: {name} {value:.4g}" + (f" (float {floating:.4g})" if floating is not None else "")
            + (f", ratio to float {ratio:.4g}" if ratio is not None else ", no ratio (float's is 0)")
            + (f" {interval}" if interval is not None else "")]


def flag_allure_result(config, outcome: str, message: str, marginal: list[str]) -> None:  # type: ignore[no-untyped-def]
    """Mark the running test's Allure result: an inconclusive step gets Allure's status `unknown` (neither
    passed nor failed) with its reasons as the status message, a step the test bench stopped (outcome
    `error`: a device timeout, a lost device) gets `broken`, a marginal pass keeps `passed` with the
    marginal verdicts as its message; inconclusive and marginal are tagged, so the categories INCONCLUSIVE
    and MARGINAL find them.
    Call after allure-pytest has set the call phase's status; a no-op without --alluredir."""
    listener = config.pluginmanager.getplugin("allure_listener")
    result = listener.allure_logger.get_test(None) if listener is not None else None
    if result is None:
        return
    from allure_commons.model2 import Label, Status, StatusDetails

    if outcome == "inconclusive":
        result.status = Status.UNKNOWN
        result.statusDetails = StatusDetails(message=status_message(INCONCLUSIVE, message))
        result.labels.append(Label(name="tag", value=INCONCLUSIVE.lower()))
    elif outcome == "error":
        result.status = Status.BROKEN
    elif marginal and result.status == Status.PASSED:
        result.statusDetails = StatusDetails(message=status_message(MARGINAL, "\n".join(marginal)))
        result.labels.append(Label(name="tag", value=MARGINAL.lower()))
