"""Step 7, concurrency: N sessions on the device's HTP at once, as qnn-throughput-net-run runs them.

Several instances of one model, or the models of the run together when there are several, in one runner
process (a thread per session; `processes` mode: a copy of the runner per session). The run is options.rounds
rounds (9 by default): in each, every model runs alone for its share of the solo duration, then all sessions
run together for their share of the concurrent duration, so the solo and the shared phases alternate and a
drift of the device's speed (or, on the HTP simulator, of the host's load) reaches both (after Chromium's
Pinpoint, as harness.latency_ab interleaves A/B blocks). A session's degradation in a round is its concurrent
p50 over its solo p50 of that round; a round's is its worst session's. KPIs: aggregate throughput,
latency_degradation (the median of the rounds', with the distribution-free interval of that median,
harness.repeats.median_interval: the limit fails only when the interval lies above it, and is inconclusive when
it straddles it), and errors, which must be 0.

On an emulated device the sessions share the modelled HTP (harness.emulator.device_time): they take turns, so
each sees one round (the sum of the sessions' modelled latencies plus a context switch per session) per
inference, whatever the host's speed; latency_degradation is that round over the session's solo latency, both
unthrottled (a device that heats between the solo and the shared phase slows both alike), labelled
`emulated`. The simulator's own figures (simulator_latency_degradation: two simulator processes or threads
sharing the host's cores) and host contention are labelled notes, not verdicts.
"""

from __future__ import annotations

from pathlib import Path

from harness.reporting import charts
from harness.data import Feed
from harness.kpi import INTERVALS_KEY, Limit
from harness.models import Thresholds
from harness.options import ConcurrencyOptions
from harness.repeats import summary
from harness.runner.base import remote_model_path
from harness.runner.client import DeviceRunner
from harness.soak import note_host_contention
from harness.steps.report import StepReport

DEGRADATION_PER_SESSION = 1.5  # default limit: 1.5 x the session count (sessions sharing one HTP take turns)


def concurrency(plans: list[tuple[str, Path, list[Feed]]], runner: DeviceRunner, thresholds: Thresholds,
                options: ConcurrencyOptions, out_dir: Path, label: str) -> StepReport:
    """Return the concurrency report for plans' (model name, context binary, feeds), the first being the model
    under test: per-session table, aggregate throughput, worst latency degradation, errors, bar chart."""
    run = runner.concurrent([(model, feeds[:2]) for _, model, feeds in plans], options.sessions,
                            options.duration_s, options.solo_duration_s, options.mode, options.rounds)
    result = run.report["concurrency"]
    names = {remote_model_path(model): name for name, model, _ in plans}
    emulated = result.get("latency_source") == "emulated"
    source = "emulated" if emulated else run.latency_source
    rows = []
    for entry in result["sessions"]:
        solo, conc = entry["solo"], entry["concurrent"]
        name = names.get(entry["model"], entry["model"])
        by_round = _round_degradations(entry)
        row = {"session": entry["index"], "model": name, "solo_p50_ms": solo.get("p50_ms"),
               "concurrent_p50_ms": conc.get("p50_ms"), "concurrent_p90_ms": conc.get("p90_ms"),
               "latency_degradation": summary([d for d in by_round if d is not None]).value
               if any(d is not None for d in by_round) else None,
               "round_degradations": by_round, "solo_throughput_ips": solo.get("throughput_ips"),
               "concurrent_throughput_ips": conc.get("throughput_ips"), "iterations": conc.get("iterations"),
               "errors": entry["errors"], "first_error": entry.get("first_error")}
        if emulated:
            sim_solo, sim_conc = entry.get("simulator_solo") or {}, entry.get("simulator_concurrent") or {}
            row.update(simulator_solo_p50_ms=sim_solo.get("p50_ms"), simulator_concurrent_p50_ms=sim_conc.get("p50_ms"),
                       simulator_latency_degradation=_ratio(sim_conc.get("p50_ms"), sim_solo.get("p50_ms")),
                       simulator_iterations=sim_conc.get("iterations"))
        rows.append(row)
    worst = [max(ds) for ds in zip(*(r["round_degradations"] for r in rows))
             if all(d is not None for d in ds)]  # each round's worst session (rounds every session timed)
    degradation = summary(worst) if worst else None
    solo_total = sum(r["solo_throughput_ips"] or 0 for r in rows) / max(1, len(rows))
    report = StepReport("concurrency")
    report.kpis = {
        "sessions": options.sessions, "mode": result["mode"], "models": sorted({r["model"] for r in rows}),
        "duration_s": result["duration_s"], "solo_duration_s": options.solo_duration_s,
        "latency_source": source,
        "aggregate_throughput_ips": result["aggregate_throughput_ips"],
        "mean_solo_throughput_ips": solo_total,
        "rounds": len(worst), "round_degradations": [round(d, 4) for d in worst],
        "latency_degradation": round(degradation.value, 6) if degradation else None,
        "errors": sum(r["errors"] for r in rows),
        "starved_sessions": [r["session"] for r in rows if not r.get("simulator_iterations", r["iterations"])],
    }
    if degradation is not None:
        report.kpis[INTERVALS_KEY] = {"latency_degradation": degradation.interval.as_dict()}
    if emulated:
        sim = [r["simulator_latency_degradation"] for r in rows if r["simulator_latency_degradation"] is not None]
        report.kpis.update(emulated=result.get("emulated"), simulator_latency_degradation=max(sim) if sim else None)
    if emulated or source == "simulator":
        note_host_contention(report, run.report.get("host") or {}, emulated)
    report.tables["sessions"] = rows
    limit = thresholds.max_latency_degradation or DEGRADATION_PER_SESSION * options.sessions
    # errors: a count that must be 0, never marginal
    report.limits = [Limit("latency_degradation", maximum=limit), Limit("errors", maximum=0, marginal=-1.0)]
    for r in rows:
        if r["errors"]:
            report.failures.append(f"session {r['session']} ({r['model']}): {r['errors']} failed inference(s), "
                                   f"first: {r['first_error']}")
        elif not r.get("simulator_iterations", r["iterations"]):
            report.failures.append(f"session {r['session']} ({r['model']}) completed no inference in "
                                   f"{options.duration_s:g} s beside the others")
    out_dir.mkdir(parents=True, exist_ok=True)
    report.artifacts["latency_chart"] = charts.concurrency_bars(
        rows, f"{label}: {options.sessions} sessions at once, p50 solo vs concurrent ({source})",
        out_dir / "concurrency.png")
    return report


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _round_degradations(entry: dict) -> list[float | None]:
    """Return a session's concurrent over solo latency in each round: the unthrottled modelled latencies (base_ms)
    on an emulated device, else the p50s (None for a round in which a phase timed no inference)."""
    out = []
    for r in entry.get("rounds") or [{f"{phase}_{key}": entry[phase].get(key) for phase in ("solo", "concurrent")
                                      for key in ("p50_ms", "base_ms")}]:
        if r.get("solo_base_ms") and r.get("concurrent_base_ms"):
            out.append(r["concurrent_base_ms"] / r["solo_base_ms"])
        else:
            out.append(_ratio(r.get("concurrent_p50_ms"), r.get("solo_p50_ms")))
    return out
