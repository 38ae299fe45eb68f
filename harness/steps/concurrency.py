"""Step 7, concurrency: N sessions on the device's HTP at once, as qnn-throughput-net-run runs them.

Several instances of one model, or the models of the run together when there are several, in one runner
process (a thread per session; `processes` mode: a copy of the runner per session). Each model first runs
alone for the solo duration, then all sessions run together for the concurrent duration. KPIs: aggregate
throughput, each session's concurrent p50 against its solo p50 (latency_degradation; the KPI is the worst
session's), and errors, which must be 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness import charts
from harness.data import Feed
from harness.kpi import Limit
from harness.models import Thresholds
from harness.runner.client import DeviceRunner, remote_model_path
from harness.steps.report import StepReport

DEGRADATION_PER_SESSION = 1.5  # default limit: 1.5 x the session count (sessions sharing one HTP take turns)


@dataclass(frozen=True)
class ConcurrencyOptions:
    """How many sessions, for how long, and how long each model runs alone first."""

    sessions: int
    duration_s: float
    solo_duration_s: float
    mode: str = "threads"


def concurrency(plans: list[tuple[str, Path, list[Feed]]], runner: DeviceRunner, thresholds: Thresholds,
                options: ConcurrencyOptions, out_dir: Path, label: str) -> StepReport:
    """Return the concurrency report for plans' (model name, context binary, feeds), the first being the model
    under test: per-session table, aggregate throughput, worst latency degradation, errors, bar chart."""
    run = runner.concurrent([(model, feeds[:2]) for _, model, feeds in plans], options.sessions,
                            options.duration_s, options.solo_duration_s, options.mode)
    result = run.report["concurrency"]
    names = {remote_model_path(model): name for name, model, _ in plans}
    rows = []
    for entry in result["sessions"]:
        solo, conc = entry["solo"], entry["concurrent"]
        name = names.get(entry["model"], entry["model"])
        degradation = (conc["p50_ms"] / solo["p50_ms"]) if conc.get("p50_ms") and solo.get("p50_ms") else None
        rows.append({"session": entry["index"], "model": name, "solo_p50_ms": solo.get("p50_ms"),
                     "concurrent_p50_ms": conc.get("p50_ms"), "concurrent_p90_ms": conc.get("p90_ms"),
                     "latency_degradation": degradation, "solo_throughput_ips": solo.get("throughput_ips"),
                     "concurrent_throughput_ips": conc.get("throughput_ips"), "iterations": conc.get("iterations"),
                     "errors": entry["errors"], "first_error": entry.get("first_error")})
    degradations = [r["latency_degradation"] for r in rows if r["latency_degradation"] is not None]
    solo_total = sum(r["solo_throughput_ips"] or 0 for r in rows) / max(1, len(rows))
    report = StepReport("concurrency")
    report.kpis = {
        "sessions": options.sessions, "mode": result["mode"], "models": sorted({r["model"] for r in rows}),
        "duration_s": result["duration_s"], "solo_duration_s": options.solo_duration_s,
        "latency_source": run.latency_source,
        "aggregate_throughput_ips": result["aggregate_throughput_ips"],
        "mean_solo_throughput_ips": solo_total,
        "latency_degradation": max(degradations) if degradations else None,
        "errors": sum(r["errors"] for r in rows),
        "starved_sessions": [r["session"] for r in rows if not r["iterations"]],
    }
    report.tables["sessions"] = rows
    limit = thresholds.max_latency_degradation or DEGRADATION_PER_SESSION * options.sessions
    report.limits = [Limit("latency_degradation", maximum=limit), Limit("errors", maximum=0, marginal=0.0)]
    for r in rows:
        if r["errors"]:
            report.failures.append(f"session {r['session']} ({r['model']}): {r['errors']} failed inference(s), "
                                   f"first: {r['first_error']}")
        elif not r["iterations"]:
            report.failures.append(f"session {r['session']} ({r['model']}) completed no inference in "
                                   f"{options.duration_s:g} s beside the others")
    out_dir.mkdir(parents=True, exist_ok=True)
    report.artifacts["latency_chart"] = charts.concurrency_bars(
        rows, f"{label}: {options.sessions} sessions at once, p50 solo vs concurrent ({run.latency_source})",
        out_dir / "concurrency.png")
    return report
