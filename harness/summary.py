"""What a run prints at its end: the devices used and quarantined, and per device x model each step's
outcome with its headline KPI, so nobody has to open the KPI JSON to know what happened."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from harness.session import StepRecord


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _latency(k: dict) -> str:
    lat = k.get("latency_ms") or {}
    return f"p50 {_num(lat.get('p50'), '.3g')} ms, p90 {_num(lat.get('p90'), '.3g')} ms ({k.get('latency_source', '?')})"


def _accuracy(k: dict) -> str:
    return (f"{k.get('task_metric_name', 'metric')} {_num(k.get('task_metric'), '.4g')}, "
            f"cosine {_num(k.get('cosine_similarity'), '.4f')}")


HEADLINES: dict[str, Callable[[dict], str]] = {
    "feasibility": lambda k: f"HTP share {_num(k.get('htp_fraction'), '.0%')}"
                             + (f", unsupported {', '.join(k['unsupported_ops'])}" if k.get("unsupported_ops") else ""),
    "conversion": lambda k: f"{k.get('nodes_before', '?')} -> {k.get('nodes_after', '?')} nodes, "
                            f"equivalence cosine {_num(k.get('equivalence_cosine'), '.6f')}",
    "float_baseline": lambda k: f"max |diff| {_num(k.get('max_abs_diff'), '.3g')}",
    "ptq": lambda k: f"PTQ cosine {_num(k.get('cosine_similarity'), '.4f')}, SQNR {_num(k.get('sqnr_db'), '.1f')} dB",
    "error_isolation": lambda k: f"first divergent node {k.get('first_divergent_node') or 'none'}",
    "sweep": lambda k: f"best {k.get('best', '-')}",
    "mixed_precision": lambda k: f"{k.get('promoted_tensor_count', 0)} promoted, met KPI {k.get('met_threshold')}",
    "context_binary": lambda k: f"{_num((k.get('context_bytes') or 0) / 2**20, '.2f')} MiB, load {_num(k.get('load_s'), '.3g')} s",
    "profile": _latency,
    "runtime": lambda k: f"cosine {_num(k.get('cosine_similarity'), '.6f')}",
    "validation_accuracy": _accuracy,
    "sustained": lambda k: f"stability {_num(k.get('stability_pct'), '.0f')}%, onset {_num(k.get('throttling_onset_s'), 'g')} s, "
                           f"max {_num(k.get('max_temp_c'), '.1f')} °C {k.get('max_temp_zone') or ''} ({k.get('telemetry_source', '?')})",
    "energy": lambda k: f"{_num(k.get('energy_per_inference_mj'), '.3g')} mJ/inference ({k.get('power_source', '?')})",
    "concurrency": lambda k: f"{k.get('sessions', '?')} sessions, degradation x{_num(k.get('latency_degradation'), '.2f')}, "
                             f"errors {k.get('errors', '-')}",
    "regression": lambda k: f"regressed: {', '.join(k.get('regressed') or []) or 'none'}",
    "aimet": lambda k: f"met KPI {k.get('met_threshold')}",
    "llm_conversion": lambda k: f"prefill {k.get('prefill_nodes_after', '?')} / decode {k.get('decode_nodes_after', '?')} "
                                f"nodes, AR-{k.get('prefill_ar', '?')} CL-{k.get('context_length', '?')}",
    "llm_feasibility": lambda k: f"HTP share {_num(k.get('prefill_htp_fraction'), '.0%')} / "
                                 f"{_num(k.get('decode_htp_fraction'), '.0%')}, KV cache "
                                 f"{_num((k.get('kv_cache_bytes') or 0) / 2**20, '.2f')} MiB",
    "llm_accuracy": lambda k: f"{k.get('recipe', '?')} perplexity HTP {_num(k.get('perplexity_htp'), '.2f')} vs float "
                              f"{_num(k.get('perplexity_float_host'), '.2f')}, greedy {_num(k.get('greedy_agreement'), '.0%')}",
    "llm_context_binary": lambda k: f"{_num((k.get('context_bytes') or 0) / 2**20, '.2f')} MiB",
    "genie_runtime": lambda k: f"{_num(k.get('tokens_per_s'), '.1f')} tokens/s, first token "
                               f"{_num(k.get('time_to_first_token_ms_min'), '.0f')}-{_num(k.get('time_to_first_token_ms_max'), '.0f')}"
                               f" ms ({k.get('source', '?')})",
    "genie_stress": lambda k: f"{k.get('queries', '?')} queries, errors {k.get('errors', '-')}, RSS "
                              f"+{_num(k.get('rss_growth_mb'), '.0f')} MB",
}


def headline(record: StepRecord) -> str:
    """Return the step's headline KPI as a short text ('' when the step has none or did not run)."""
    if record.outcome not in ("passed", "failed") or not record.kpis:
        return ""
    try:
        return HEADLINES.get(record.step, lambda k: "")(record.kpis)
    except (TypeError, ValueError, KeyError):
        return ""


def step_table(records: Iterable[StepRecord]) -> list[str]:
    """Return the lines of one table per device x model: step, outcome, headline KPI (or the skip/failure reason)."""
    groups: dict[tuple[str, str], list[StepRecord]] = {}
    for r in records:
        groups.setdefault((r.device, r.model), []).append(r)
    lines = []
    for (device, model), rows in groups.items():
        lines.append(f"{device} ({rows[0].soc}) x {model}:")
        for r in rows:
            detail = headline(r) or ((r.message or "").splitlines() or [""])[0][:110]
            lines.append(f"  {r.step:20s} {r.outcome:8s} {detail}")
    return lines


def device_lines(devices: list[dict], released: list[str]) -> list[str]:
    """Return one line per device: used (healthy), quarantined and why, or unused; and the released ones."""
    lines = []
    for d in devices:
        line = f"device {d['id']} ({d['soc']}, {d['transport']}): {d['status']}"
        if d.get("reason"):
            line += f": {d['reason']}" + (f" (until {d['expires']})" if d.get("expires") else "")
        lines.append(line)
    if released:
        lines.append(f"taken out of quarantine by --unquarantine: {', '.join(released)}")
    return lines
