"""The sign-off page: one self-contained HTML document (inline CSS, charts as base64 data URIs, no scripts,
nothing loaded from anywhere), every value escaped."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from html import escape
from typing import Any, Iterable

from harness.kpi import INTERVALS_KEY, Interval, interval_of, kpi_value
from harness.reporting.records import StepRecord
from harness.signoff import format as fmt
from harness.signoff.inputs import NOT_RUN, RunInfo, RunSet
from harness.signoff.task_table import task_rows
from harness.signoff.verdict import REGRESSION_STEP, KpiDelta, Reason, ReleaseVerdict, order_steps

BADGES = {"passed": ("pass", "PASS"), "marginal": ("marginal", "PASS · MARGINAL"),
          "inconclusive": ("inconclusive", "INCONCLUSIVE"), "failed": ("fail", "FAIL"), "error": ("error", "ERROR"),
          "skipped": ("skip", "SKIP"), NOT_RUN: ("notrun", "NOT RUN")}
REASON_TITLES = {"failed": "Failed steps", "regression": "Regressions against the baseline",
                 "quarantined": "Quarantined devices", "not_run": "Steps not run",
                 "inconclusive": "Inconclusive steps: re-run with more samples"}
REASON_NOUNS = {"failed": ("failed step", "failed steps"), "regression": ("regressed KPI", "regressed KPIs"),
                "quarantined": ("quarantined device", "quarantined devices"),
                "not_run": ("step not run", "steps not run"),
                "inconclusive": ("inconclusive step", "inconclusive steps")}
ENV_COLUMNS = (("harness_version", "harness"), ("onnxruntime", "onnxruntime"), ("onnxruntime_qnn", "onnxruntime-qnn"),
               ("qnn_sdk", "QNN SDK"), ("python", "Python"), ("platform", "platform"))


@dataclass(frozen=True)
class PageContext:
    """What the page says about itself: its title, when and with what it was generated."""

    title: str
    generated_at: str
    generator: dict[str, str | None]


@dataclass(frozen=True)
class Html:
    """Markup built here from escaped parts, put into a table cell as it is."""

    markup: str


def h(value: Any) -> str:
    """Return value as escaped HTML text."""
    return escape("" if value is None else str(value), quote=True)


def _cell(value: Any) -> str:
    return value.markup if isinstance(value, Html) else h(value)


def render_page(runs: RunSet, verdict: ReleaseVerdict, ctx: PageContext) -> str:
    """Return the whole sign-off page as an HTML document."""
    notes = _Footnotes()
    body = "".join([
        _header(runs, ctx),
        '<main class="wrap">',
        _verdict_banner(runs, verdict),
        _toc(runs),
        _reasons(verdict),
        _matrix(runs, verdict, notes),
        _task_section(runs),
        _devices(runs),
        _kpi_section(runs, verdict),
        _charts(runs),
        _environment(runs),
        _input_notes(runs),
        "</main>",
        _footer(ctx),
    ])
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta name="release-verdict" content="{h(verdict.label)}">'
            f"<title>{h(verdict.label)} · {h(ctx.title)}</title><style>{CSS}</style></head>"
            f"<body>{body}</body></html>\n")


def _header(runs: RunSet, ctx: PageContext) -> str:
    sources = ", ".join(r.source for r in runs.runs)
    return (f'<header class="top"><div class="wrap"><div class="eyebrow">Snapdragon onboarding · release sign-off</div>'
            f"<h1>{h(ctx.title)}</h1><div class=\"meta\">Generated {h(fmt.when(ctx.generated_at))} from "
            f"{len(runs.runs)} run{'s' if len(runs.runs) != 1 else ''}: <span class=\"mono\">{h(sources)}</span>"
            f"</div></div></header>")


def _counts(runs: RunSet, verdict: ReleaseVerdict) -> dict[str, int]:
    outcomes = [r.outcome for r in runs.results if r.step in verdict.expected_steps]
    return {"passed": outcomes.count("passed"), "inconclusive": outcomes.count("inconclusive"),
            "failed": outcomes.count("failed") + outcomes.count("error"),
            "skipped": outcomes.count("skipped"), NOT_RUN: len(verdict.by_kind("not_run")) - outcomes.count("skipped")}


def _badge(r: StepRecord | None) -> tuple[str, str]:
    """Return the (class, text) of a step result's badge: a marginal pass has its own."""
    if r is None:
        return BADGES[NOT_RUN]
    return BADGES["marginal" if r.outcome == "passed" and r.marginal else r.outcome]


def _verdict_banner(runs: RunSet, verdict: ReleaseVerdict) -> str:
    targets = runs.targets()
    devices = {d for d, _, _ in targets}
    models = {m for _, _, m in targets}
    counts = _counts(runs, verdict)
    kinds = [_plural(len(verdict.by_kind(k)), *REASON_NOUNS[k]) for k in REASON_NOUNS if verdict.by_kind(k)]
    if verdict.go:
        headline = "Release approved: every expected step passed on every device × model."
    elif verdict.rerun:
        headline = ("Re-run needed: nothing failed, but " + ", ".join(kinds) + ": the evidence could not decide "
                    "a limit, so the release cannot be signed off yet.")
    else:
        headline = "Release blocked: " + ", ".join(kinds) + "."
    tiles = [("devices", len(devices)), ("models", len(models)), ("steps expected", len(verdict.expected_steps)),
             ("passed", counts["passed"]), ("inconclusive", counts["inconclusive"]),
             ("failed / error", counts["failed"]), ("skipped", counts["skipped"]), ("not run", counts[NOT_RUN])]
    tile_html = "".join(f'<div class="tile"><div class="n">{n}</div><div class="l">{h(label)}</div></div>'
                        for label, n in tiles)
    cls = "go" if verdict.go else "rerun" if verdict.rerun else "nogo"
    return (f'<section class="verdict {cls}" id="verdict"><div class="verdict-label" data-verdict="{h(verdict.label)}">'
            f'{h(verdict.label)}</div><div class="verdict-body"><p class="headline">{h(headline)}</p>'
            f'<p class="rule">GO requires no failed or errored step, no KPI regressed against its baseline, no '
            f'quarantined device, and every expected step run ({h(verdict.expect_rule)}) and decided: an '
            f'inconclusive step is a reason to re-run, never a pass.</p>'
            f'<div class="tiles">{tile_html}</div></div></section>')


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _toc(runs: RunSet) -> str:
    links = [("reasons", "Reasons"), ("matrix", "Step matrix"), ("task", "Task accuracy"), ("devices", "Devices"),
             ("kpis", "KPIs"), ("charts", "Charts"), ("environment", "Environment")]
    if not any(r.charts for r in runs.results):
        links = [link for link in links if link[0] != "charts"]
    if not task_rows(runs):
        links = [link for link in links if link[0] != "task"]
    return '<nav class="toc">' + "".join(f'<a href="#{a}">{h(t)}</a>' for a, t in links) + "</nav>"


def _reasons(verdict: ReleaseVerdict) -> str:
    if verdict.go:
        return ('<section id="reasons" class="card"><h2>Reasons</h2><p class="ok-text">None: no failed steps, '
                'no regressions, no quarantined devices, no steps left out.</p></section>')
    parts = [f'<section id="reasons" class="card"><h2>Why {h(verdict.label)}</h2>']
    for kind in ("failed", "regression", "quarantined", "not_run", "inconclusive"):
        reasons = verdict.by_kind(kind)
        if reasons:
            parts.append(f'<h3 class="reason-kind {kind}">{h(REASON_TITLES[kind])} <span class="count">'
                         f'{len(reasons)}</span></h3>{_reason_table(kind, reasons)}')
    parts.append("</section>")
    return "".join(parts)


def _reason_table(kind: str, reasons: list[Reason]) -> str:
    if kind == "quarantined":
        head, rows = ("Device", "Status and reason"), [(r.device, r.message) for r in reasons]
    else:
        head = ("Device", "Model", "Step", "Regressed KPI" if kind == "regression" else
                "What more it needs" if kind == "inconclusive" else "Message")
        rows = [(r.device, r.model, r.step, _headline_details(r.message, r.details)) for r in reasons]
    return _table(head, rows, cls=f"reasons {kind}", mono_cols={0, 1, 2} if kind != "quarantined" else {0})


def _table(head: Iterable[str], rows: Iterable[Iterable[Any]], cls: str = "", mono_cols: set[int] = frozenset()) -> str:
    th = "".join(f"<th>{h(c)}</th>" for c in head)
    mono = ' class="mono"'
    body = "".join("<tr>" + "".join(f"<td{mono if i in mono_cols else ''}>{_cell(v)}</td>"
                                    for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f'<div class="scroll"><table class="{h(cls)}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>'


class _Footnotes:
    """Numbered messages of the matrix's cells, listed under it."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, where: str, message: str) -> int:
        self.items.append((where, message))
        return len(self.items)


def _matrix(runs: RunSet, verdict: ReleaseVerdict, notes: _Footnotes) -> str:
    steps = verdict.expected_steps + sorted({r.step for r in runs.results} - set(verdict.expected_steps))
    head = "".join(f'<th class="step" title="{h(s)}">{h(s.replace("_", " "))}</th>' for s in steps)
    rows = []
    for device, soc, model in runs.targets():
        cells = "".join(_matrix_cell(runs, device, model, s, notes) for s in steps)
        rows.append(f'<tr><th class="dev" scope="row"><span class="mono">{h(device)}</span>'
                    f'<span class="soc">{h(_soc_label(runs, soc))}</span></th>'
                    f'<td class="mono model">{h(model)}</td>{cells}</tr>')
    legend = "".join(f'<span class="badge {c}">{t}</span> {h(o)}' for o, (c, t) in BADGES.items())
    legend += _not_expected(verdict)
    foot = ""
    if notes.items:
        foot = '<ol class="footnotes">' + "".join(
            f'<li id="note-{i}"><span class="mono where">{h(w)}</span> '
            f'{_headline_details(fmt.headline(m), fmt.details(m)).markup}</li>'
            for i, (w, m) in enumerate(notes.items, start=1)) + "</ol>"
    return (f'<section id="matrix" class="card"><h2>Step matrix</h2><p class="sub">Each device × model × step '
            f'with its verdict; hover a cell for the step\'s message, numbered messages are listed below.</p>'
            f'<div class="scroll"><table class="matrix"><thead><tr><th>Device · SoC</th><th>Model</th>{head}'
            f'</tr></thead><tbody>{"".join(rows)}</tbody></table></div><div class="legend">{legend}</div>{foot}'
            f"</section>")


def _not_expected(verdict: ReleaseVerdict) -> str:
    """Say which steps this sign-off did not require: skipped everywhere, or in none of the runs."""
    parts = [f"skipped on every device × model: {s} ({m})" if m else f"skipped on every device × model: {s}"
             for s, m in verdict.skipped_everywhere.items()]
    if verdict.not_recorded:
        parts.append("not in these runs: " + ", ".join(verdict.not_recorded))
    if not parts:
        return ""
    return (f'<p class="not-expected">Not required by this sign-off (<span class="mono">--expect-steps all</span> '
            f'requires every step of the suites): {h("; ".join(parts))}.</p>')


def _matrix_cell(runs: RunSet, device: str, model: str, step: str, notes: _Footnotes) -> str:
    r = runs.result(device, model, step)
    outcome = r.outcome if r is not None else NOT_RUN
    message = fmt.message_text(r.message) if r is not None else "no record of this step in the runs"
    if r is not None and outcome == "passed" and r.marginal:
        message = "passed close to a limit: " + "\n".join(r.marginal)
    cls, text = _badge(r)
    ref = ""
    if (outcome != "passed" or r.marginal) and message:
        n = notes.add(f"{device} / {model} / {step}:", message)
        ref = f'<a class="ref" href="#note-{n}">{n}</a>'
    title = f"{step}: {outcome}" + (f" — {fmt.headline(message)}" if message else "")
    return (f'<td class="cell" data-outcome="{h(outcome)}" data-step="{h(step)}" title="{h(title)}">'
            f'<span class="badge {cls}">{text}</span>{ref}</td>')


def _soc_label(runs: RunSet, soc: str) -> str:
    name = runs.soc_names.get(soc)
    return f"{soc} ({name})" if name and soc else soc or "—"


def _task_section(runs: RunSet) -> str:
    """The task metric per device × model × precision beside float's, with the ratio, its interval and the
    sample count (nothing when no model has an evaluation section)."""
    rows = task_rows(runs)
    if not rows:
        return ""

    def num(value: Any) -> str:
        return fmt.number(value) if isinstance(value, (int, float)) else "—"

    def interval(r) -> str:
        i = r.interval
        return f"[{fmt.number(i.low)}, {fmt.number(i.high)}] {i.method}" if i is not None else "—"

    table = _table(("Device", "Model", "Precision", "Metric", "Quantized", "Float", "Ratio to float",
                    "95 % interval", "Samples", "Outcome"),
                   ((r.device, r.model, r.precision, r.metric, num(r.value), num(r.float_value), num(r.ratio),
                     interval(r), r.samples if r.samples is not None else "—", r.outcome) for r in rows),
                   cls="task", mono_cols={0, 1, 2})
    return ('<section id="task" class="card"><h2>Task accuracy</h2><p class="sub">The model\'s task metric on its '
            'labelled samples (its spec\'s <span class="mono">evaluation:</span> section) per device × model × '
            'precision, beside the float model\'s on the same samples: the ratio to float is the KPI (MLPerf\'s '
            'form), with its 95 % interval and the samples it rests on. The float row is the float model on the '
            'device\'s CPU against the host\'s. A language model\'s metric is its held-out perplexity per recipe on the '
            'HTP (lower is better: the ratio is float / quantized).</p>' + table + "</section>")


def _devices(runs: RunSet) -> str:
    socs = {d: soc for d, soc, _ in runs.targets()}
    states = {d.id: d for d in runs.devices}
    rows = []
    for device in dict.fromkeys([*socs, *states]):
        state = states.get(device)
        status = Html(f'<span class="status {h(state.status)}">{h(state.status)}</span>') if state else "—"
        rows.append((device, _soc_label(runs, (state.soc if state and state.soc else socs.get(device, ""))),
                     state.transport if state else "—", status, state.reason if state and state.reason else "",
                     fmt.when(state.since) if state and state.since else ""))
    table = _table(("Device", "SoC", "Transport", "Status", "Reason", "Since"), rows, cls="devices", mono_cols={0})
    note = "" if states else '<p class="sub">The KPI JSON recorded no device states (older runs, or Allure results only).</p>'
    return f'<section id="devices" class="card"><h2>Devices</h2>{table}{note}</section>'


def _kpi_section(runs: RunSet, verdict: ReleaseVerdict) -> str:
    parts = ['<section id="kpis" class="card"><h2>KPIs per device × model</h2><p class="sub">The headline KPIs of '
             'each step; where a regression step compared the run with its baseline, the baseline and the change '
             'are shown beside the value.</p>']
    for device, soc, model in runs.targets():
        deltas = [d for d in verdict.deltas if (d.device, d.model) == (device, model)]
        cards = [_step_card(r, deltas) for s in _steps_of(runs, device, model)
                 if (r := runs.result(device, model, s)) is not None and r.step != REGRESSION_STEP]
        parts.append(f'<div class="target"><h3><span class="mono">{h(device)}</span> · {h(_soc_label(runs, soc))} · '
                     f'<span class="mono">{h(model)}</span></h3>{_baseline_table(runs, device, model, deltas)}'
                     f'<div class="cards">{"".join(cards)}</div></div>')
    parts.append("</section>")
    return "".join(parts)


def _steps_of(runs: RunSet, device: str, model: str) -> list[str]:
    return order_steps([r.step for r in runs.results if (r.device, r.model) == (device, model)])


def _step_card(r: StepRecord, deltas: list[KpiDelta]) -> str:
    cls, text = _badge(r)
    step_deltas = [d for d in deltas if d.step == r.step and d.kpi != "outcome"]  # the badge shows the outcome
    rows = []
    shown = set()
    for name, value in fmt.main_kpis(r.step, r.kpis):
        shown.add(name)
        rows.append(_kpi_row(name, value, [d for d in step_deltas if _kpi_root(d.kpi) == name],
                             interval=interval_of(r.kpis, name)))
    for name in r.kpis.get(INTERVALS_KEY) or {}:  # every KPI measured on samples shows what it rests on
        if name not in shown and interval_of(r.kpis, name) is not None:
            shown.add(name)
            rows.append(_kpi_row(name, kpi_value(r.kpis, name), [], interval=interval_of(r.kpis, name)))
    for d in step_deltas:  # compared KPIs that are not headline KPIs
        if _kpi_root(d.kpi) not in shown:
            rows.append(_kpi_row(d.kpi, d.current, [d], exact=True))
    body = "".join(rows) or '<tr><td colspan="2" class="muted">no KPIs recorded</td></tr>'
    message = (f'<div class="card-msg">{_headline_details(fmt.headline(r.message), fmt.details(r.message)).markup}'
               f'</div>' if r.outcome != "passed" and r.message.strip() else "")
    if r.marginal:
        why = _headline_details(fmt.headline("passed close to a limit: " + r.marginal[0]),
                                "\n".join(r.marginal) if len(r.marginal) > 1 else "")
        message += f'<div class="card-msg marginal">{why.markup}</div>'
    return (f'<div class="kcard {cls}"><div class="kcard-head"><span class="step-name mono">{h(r.step)}</span>'
            f'<span class="badge {cls}">{text}</span></div>{message}<table class="kv">{body}</table></div>')


def _kpi_root(kpi: str) -> str:
    return kpi.split(".", 1)[0].split("[", 1)[0]


def _headline_details(headline: str, details: str) -> Html:
    """Return a headline with its details one click away (an HTML <details>), or the headline alone."""
    if not details or details.strip() == headline.strip():
        return Html(f'<span class="headline-text">{h(headline)}</span>')
    return Html(f'<details class="why"><summary>{h(headline)}</summary><pre>{h(details)}</pre></details>')


def _kpi_row(name: str, value: Any, deltas: list[KpiDelta], exact: bool = False,
             interval: Interval | None = None) -> str:
    full = fmt.value_text(value)
    if interval is not None:  # value [low, high], n=N
        full += f" [{fmt.number(interval.low)}, {fmt.number(interval.high)}], n={interval.samples}"
    chips = "".join(_delta_chip(d, show_kpi=not exact and d.kpi != name) for d in deltas)
    return (f'<tr><th class="mono">{_breakable(name)}</th><td><span class="v" title="{h(full)}">{h(full)}</span>{chips}</td></tr>')


def _breakable(name: str) -> str:
    """Return an escaped KPI name that may wrap after its underscores and dots."""
    return h(name).replace("_", "_<wbr>").replace(".", ".<wbr>")


def _delta_chip(d: KpiDelta, show_kpi: bool) -> str:
    label = f"{d.kpi}: " if show_kpi else ""
    text = (f"{label}baseline {fmt.value_text(d.baseline, digits=fmt.COMPARE_DIGITS)} → "
            f"{fmt.value_text(d.current, digits=fmt.COMPARE_DIGITS)}, "
            f"{fmt.signed(d.delta_pct, pct=True) if d.delta_pct is not None else fmt.signed(d.delta)} {d.verdict}")
    return f'<span class="delta {h(d.verdict)}">{h(text)}</span>'


def _baseline_table(runs: RunSet, device: str, model: str, deltas: list[KpiDelta]) -> str:
    r = runs.result(device, model, REGRESSION_STEP)
    if r is None:
        return ""
    cls, text = _badge(r)
    if not deltas:
        msg = r.message.strip() or "no KPI verdicts recorded"
        return (f'<div class="baseline"><h4>Baseline comparison <span class="badge {cls}">{text}</span></h4>'
                f'<p class="sub">{h(msg)}</p></div>')
    digits = fmt.COMPARE_DIGITS
    rows = [(d.step, d.kpi, fmt.value_text(d.baseline, digits=digits), fmt.value_text(d.current, digits=digits),
             fmt.signed(d.delta),
             fmt.signed(d.delta_pct, pct=True), fmt.value_text(d.p_value),
             Html(f'<span class="delta {h(d.verdict)}">{h(d.verdict)}</span>'), d.rule) for d in deltas]
    table = _table(("Step", "KPI", "Baseline", "Current", "Δ", "Δ %", "p", "Verdict", "Rule"), rows,
                   cls="baseline-table", mono_cols={0, 1})
    return f'<div class="baseline"><h4>Baseline comparison <span class="badge {cls}">{text}</span></h4>{table}</div>'


def _charts(runs: RunSet) -> str:
    parts = []
    for device, soc, model in runs.targets():
        figures = []
        for step in _steps_of(runs, device, model):
            r = runs.result(device, model, step)
            for chart in r.charts if r is not None else ():
                data = base64.b64encode(chart.png).decode("ascii")
                figures.append(f'<figure><img alt="{h(chart.name)}" src="data:image/png;base64,{data}">'
                               f'<figcaption><span class="mono">{h(chart.name)}</span></figcaption></figure>')
        if figures:
            parts.append(f'<div class="target"><h3><span class="mono">{h(device)}</span> · {h(_soc_label(runs, soc))} '
                         f'· <span class="mono">{h(model)}</span></h3><div class="figs">{"".join(figures)}</div></div>')
    if not parts:
        return ""
    return f'<section id="charts" class="card"><h2>Charts</h2>{"".join(parts)}</section>'


def _environment(runs: RunSet) -> str:
    head = ["Run", *[label for _, label in ENV_COLUMNS], "Devices (SoCs)", "Started", "Duration"]
    rows = [_env_row(runs, run) for run in runs.runs]
    return (f'<section id="environment" class="card"><h2>Environment</h2><p class="sub">As each run recorded it '
            f'(its KPI JSON\'s environment; for Allure results, the environment.properties beside them and the '
            f'tests\' times).</p>{_table(head, rows, cls="env", mono_cols={0})}</section>')


def _env_row(runs: RunSet, run: RunInfo) -> list[str]:
    env = run.environment
    socs = {d: soc for d, soc, _ in runs.targets()}
    devices = ", ".join(f"{d} ({socs[d]})" if socs.get(d) else d for d in run.devices)
    return [f"{run.source} [{' + '.join(run.kinds)}]", *[env.get(k) or "—" for k, _ in ENV_COLUMNS], devices or "—",
            fmt.when(env.get("started_at")), fmt.duration(env.get("duration_s"))]


def _input_notes(runs: RunSet) -> str:
    if not runs.notes:
        return ""
    items = "".join(f"<li>{h(n)}</li>" for n in runs.notes)
    return f'<section class="card"><h2>Merging notes</h2><ul class="notes">{items}</ul></section>'


def _footer(ctx: PageContext) -> str:
    g = ctx.generator
    parts = [f"harness {g.get('harness_version') or '?'}", f"onnxruntime {g.get('onnxruntime') or '—'}",
             f"onnxruntime-qnn {g.get('onnxruntime_qnn') or '—'}", f"QNN SDK {g.get('qnn_sdk') or '—'}",
             f"Python {g.get('python') or '?'}"]
    return (f'<footer class="wrap">Generated by <span class="mono">python -m harness signoff</span> with '
            f'{h(", ".join(parts))}. Self-contained: no scripts, no requests to other hosts.</footer>')


CSS = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--bg:#f6f8fa;--card:#fff;--accent:#3253dc;
--pass:#1a7f37;--pass-bg:#dafbe1;--fail:#cf222e;--fail-bg:#ffebe9;--error:#bc4c00;--error-bg:#fff1e5;
--skip:#9a6700;--skip-bg:#fff8c5;--notrun:#59636e;--notrun-bg:#eff2f5}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0;font:14px/1.5 -apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,"Noto Sans",sans-serif;
color:var(--fg);background:var(--bg)}
.wrap{max-width:1440px;margin:0 auto;padding:0 24px}
.mono{font-family:ui-monospace,SFMono-Regular,"SF Mono",Menlo,Consolas,"Liberation Mono",monospace;font-size:12.5px}
header.top{background:#0d1b2a;color:#e6edf3;padding:22px 0 20px;border-bottom:4px solid var(--accent)}
header.top h1{margin:2px 0 4px;font-size:24px;font-weight:600;letter-spacing:.2px}
header.top .eyebrow{text-transform:uppercase;font-size:11.5px;letter-spacing:1.4px;color:#9fb3c8;font-weight:600}
header.top .meta{color:#b6c2cf;font-size:13px}
header.top .meta .mono{color:#dbe4ee}
main{padding:20px 24px 8px}
section.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:18px 22px;margin:0 0 18px;
box-shadow:0 1px 2px rgba(31,35,40,.04)}
h2{font-size:17px;margin:0 0 6px;font-weight:600}
h3{font-size:14.5px;margin:16px 0 8px;font-weight:600}
h4{font-size:13.5px;margin:4px 0 8px;font-weight:600}
.sub{color:var(--muted);margin:0 0 12px;font-size:13px}
.muted{color:var(--muted)}
.verdict{display:flex;gap:26px;align-items:stretch;border-radius:12px;padding:22px 26px;margin:0 0 14px;color:#fff;
box-shadow:0 2px 6px rgba(31,35,40,.12)}
.verdict.go{background:linear-gradient(135deg,#1a7f37,#2da44e)}
.verdict.nogo{background:linear-gradient(135deg,#a40e26,#cf222e)}
.verdict.rerun{background:linear-gradient(135deg,#7d4e00,#bf8700)}
.verdict-label{font-size:46px;font-weight:800;letter-spacing:1px;min-width:190px;display:flex;align-items:center;
justify-content:center;border-right:1px solid rgba(255,255,255,.35);padding-right:26px;white-space:nowrap}
.verdict-body{flex:1}
.verdict .headline{font-size:17px;font-weight:600;margin:2px 0 4px}
.verdict .rule{margin:0 0 12px;opacity:.9;font-size:13px}
.tiles{display:flex;flex-wrap:wrap;gap:10px}
.tile{background:rgba(255,255,255,.16);border:1px solid rgba(255,255,255,.25);border-radius:8px;padding:6px 14px;
min-width:92px}
.tile .n{font-size:20px;font-weight:700;line-height:1.2}
.tile .l{font-size:11.5px;text-transform:uppercase;letter-spacing:.6px;opacity:.9}
nav.toc{display:flex;gap:6px;flex-wrap:wrap;margin:0 0 16px}
nav.toc a{color:var(--accent);text-decoration:none;background:var(--card);border:1px solid var(--line);border-radius:999px;
padding:3px 12px;font-size:13px}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:6px 10px;border-bottom:1px solid #e6eaef;vertical-align:top}
thead th{background:#f6f8fa;color:var(--muted);font-weight:600;font-size:12px;text-transform:uppercase;letter-spacing:.4px;
border-bottom:1px solid var(--line)}
tbody tr:hover{background:#f8fafc}
table.matrix{width:auto;min-width:100%}
table.matrix thead th.step{text-transform:none;letter-spacing:0;font-size:11.5px;text-align:center;min-width:58px;
max-width:84px;padding:6px 4px;line-height:1.25;vertical-align:bottom}
table.matrix td.cell{text-align:center;white-space:nowrap;padding:6px 4px}
table.matrix th.dev{font-weight:600;white-space:nowrap}
table.matrix th.dev .soc{display:block;font-weight:400;font-size:11.5px;color:var(--muted)}
table.matrix td.model{white-space:nowrap;padding-top:9px}
table.matrix td.cell{padding-top:9px}
.badge{display:inline-block;font-size:11px;font-weight:700;letter-spacing:.5px;border-radius:5px;padding:2px 7px;
border:1px solid transparent;white-space:nowrap}
.badge.pass{color:var(--pass);background:var(--pass-bg);border-color:#aceebb}
.badge.fail{color:#fff;background:var(--fail);border-color:var(--fail)}
.badge.error{color:#fff;background:var(--error);border-color:var(--error)}
.badge.skip{color:var(--skip);background:var(--skip-bg);border-color:#f5e0a0}
.badge.notrun{color:var(--notrun);background:var(--notrun-bg);border:1px dashed #afb8c1}
.badge.inconclusive{color:#fff;background:#bf8700;border-color:#bf8700}
.badge.marginal{color:var(--pass);background:var(--pass-bg);border:1px dashed #bf8700}
details.why summary{cursor:pointer;overflow-wrap:anywhere}
details.why pre{white-space:pre-wrap;word-break:break-word;margin:4px 0 0;font-size:12px;color:#31373d}
a.ref{font-size:10.5px;vertical-align:super;margin-left:3px;color:var(--accent);text-decoration:none;font-weight:600}
.legend{margin:10px 0 0;color:var(--muted);font-size:12.5px;display:flex;gap:6px 14px;flex-wrap:wrap;align-items:center}
.legend .badge{margin-right:2px}
.not-expected{flex-basis:100%;margin:4px 0 0;font-size:12.5px}
ol.footnotes{margin:12px 0 0;padding-left:26px;font-size:12.5px;color:#31373d}
ol.footnotes li{margin:3px 0;word-break:break-word;white-space:pre-line}
ol.footnotes .where{font-weight:600}
.reason-kind{display:flex;align-items:center;gap:8px;margin-top:14px}
.reason-kind .count{background:#eff2f5;color:var(--muted);border-radius:999px;padding:0 8px;font-size:12px}
.reason-kind.failed::before,.reason-kind.regression::before,.reason-kind.quarantined::before,.reason-kind.not_run::before
{content:"";width:10px;height:10px;border-radius:50%;display:inline-block}
.reason-kind.failed::before{background:var(--fail)}
.reason-kind.regression::before{background:#8250df}
.reason-kind.quarantined::before{background:var(--error)}
.reason-kind.not_run::before{background:#8c959f}
.reason-kind.inconclusive::before{content:"";width:10px;height:10px;border-radius:50%;display:inline-block;
background:#bf8700}
table.reasons td:last-child{word-break:break-word}
.ok-text{color:var(--pass);font-weight:600;margin:0}
.status{font-size:12px;font-weight:600;border-radius:5px;padding:1px 7px}
.status.healthy{color:var(--pass);background:var(--pass-bg)}
.status.quarantined,.status.unhealthy{color:#fff;background:var(--error)}
.status.unused{color:var(--notrun);background:var(--notrun-bg)}
.target{border-top:1px solid #eef1f4;margin-top:8px}
.target:first-of-type{border-top:0}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:12px}
.kcard{border:1px solid var(--line);border-radius:8px;background:#fff;overflow:hidden;border-top:3px solid var(--pass)}
.kcard.fail{border-top-color:var(--fail)}.kcard.error{border-top-color:var(--error)}
.kcard.skip{border-top-color:#d4a72c}.kcard.notrun{border-top-color:#8c959f}
.kcard.inconclusive{border-top-color:#bf8700}.kcard.marginal{border-top-color:#bf8700}
.kcard-head{display:flex;justify-content:space-between;align-items:center;padding:8px 12px;background:#fafbfc;
border-bottom:1px solid #eef1f4}
.kcard .step-name{font-weight:600;font-size:13px}
.card-msg{margin:0;padding:6px 12px;font-size:12px;color:#7d2a12;background:#fff8f5;border-bottom:1px solid #f3e1d8}
table.kv th,table.kv td{padding:4px 12px;font-size:12.5px;border-bottom:1px solid #f2f4f6}
table.kv th{width:46%;font-weight:500;color:#424a53;overflow-wrap:anywhere}
table.kv tr:last-child th,table.kv tr:last-child td{border-bottom:0}
table.kv td{word-break:break-word;font-variant-numeric:tabular-nums}
.delta{display:inline-block;margin:2px 0 0 6px;font-size:11.5px;border-radius:5px;padding:0 6px;font-weight:600}
.delta.regressed{color:#fff;background:#8250df}.delta.improved{color:var(--pass);background:var(--pass-bg)}
.delta.unchanged{color:var(--muted);background:#eff2f5}.delta.new{color:#0550ae;background:#ddf4ff}
.delta.missing{color:var(--skip);background:var(--skip-bg)}
.baseline{margin:6px 0 12px}
table.baseline-table td:last-child{color:var(--muted);font-size:12px}
.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(420px,1fr));gap:14px}
figure{margin:0;border:1px solid var(--line);border-radius:8px;padding:10px;background:#fff}
figure img{width:100%;height:auto;display:block}
figcaption{margin-top:6px;color:var(--muted);font-size:12px;text-align:center}
ul.notes{margin:0;padding-left:20px}
footer{color:var(--muted);font-size:12px;padding:6px 24px 28px}
@media print{body{background:#fff}section.card{break-inside:avoid-page;box-shadow:none}nav.toc{display:none}
.verdict{-webkit-print-color-adjust:exact;print-color-adjust:exact}}
"""
