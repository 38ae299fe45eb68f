"""PNG charts: the profile step's latency histogram and per-op cycles bar chart, error isolation's SQNR along the
graph, mixed precision's accuracy-vs-promotions (Pareto) curve, Step 7's soak, power and concurrency charts and the
LLM stress run's token rate.

Uses matplotlib's object API on an Agg canvas, so no display and no global backend switch. Every chart is drawn on
one background thread (rendering a chart takes 0.1-0.5 s, which would otherwise add to the step: this way it
overlaps the device's next run): a chart function returns its path at once, and `ready(path)` waits for that file
(the Allure attachment and the suites' checks call it; `wait_all()` at the end of a session). A chart is written
through a temporary file and a rename, so an interrupted run leaves no half-written PNG; its arguments must not
change after the call.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

from harness.cache import ArtifactCache
from harness.files import replacing

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_renderer: ThreadPoolExecutor | None = None
_pending: dict[Path, Future] = {}


def in_background(path: Path, write: Callable[[], object]) -> Path:
    """Queue write() (which must write path atomically) on the chart thread; return path, complete once
    ready(path) returns."""
    global _renderer
    path = Path(path)
    with _lock:
        if _renderer is None:
            _renderer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harness-charts")
        _pending[path] = _renderer.submit(write)
    return path


def ready(path: Path) -> bool:
    """Wait for the chart queued for path, if any; return whether path is a file (a chart that failed to draw is
    logged with its traceback, and its file is absent)."""
    path = Path(path)
    with _lock:
        future = _pending.pop(path, None)
    if future is not None:
        try:
            future.result()
        except Exception:
            logger.warning("the chart %s could not be drawn", path, exc_info=True)
    return path.is_file()


def wait_all() -> None:
    """Wait until every queued chart is written (or has failed); return None."""
    with _lock:
        paths = list(_pending)
    for path in paths:
        ready(path)


def _drawn_in_background(draw: Callable[..., None]) -> Callable[..., Path]:
    """Make draw(..., path, ...) queue itself on the chart thread, writing path through a temporary file."""
    signature = inspect.signature(draw)

    @functools.wraps(draw)
    def queue(*args, **kwargs) -> Path:
        bound = signature.bind(*args, **kwargs)
        path = Path(bound.arguments["path"])

        def write() -> None:
            with replacing(path) as tmp:
                bound.arguments["path"] = tmp
                draw(*bound.args, **bound.kwargs)
        return in_background(path, write)
    return queue


def in_cache(cache: ArtifactCache, kind: str, key: str, name: str, chart: Callable[..., Path], *args,
             **kwargs) -> Path:
    """Queue chart(*args, <entry>/name, **kwargs), one of this module's charts, drawn into the artifact cache's entry
    (kind, key) on the chart thread (so drawn once per content); return the chart's final path."""
    draw = getattr(chart, "__wrapped__", chart)
    path = cache.path(kind, key) / name
    return in_background(path, lambda: cache.entry(kind, key, lambda out: draw(*args, out / name, **kwargs)))


# Room around the plotting area, in inches: numeric tick labels and an axis label on the left and below, a title
# above. Fixed margins, not a layout engine: constrained layout measures every text in a first pass and drew each
# chart in 1.5-2x the time (0.19 against 0.12 s for the latency histogram); a chart whose labels are text sizes its
# margin from their measured width (_text_width_in).
_MARGINS_IN = {"left": 0.85, "right": 0.25, "bottom": 0.6, "top": 0.4}
_TWIN_AXIS_IN = 0.85  # a right-hand axis's tick labels and label


def _figure(width_in: float, height_in: float, gap_in: float = 0.0, **margins_in: float):
    """Return an Agg-backed Figure of that size whose subplots leave _MARGINS_IN (updated with margins_in) around
    them and gap_in between them."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=100)
    FigureCanvasAgg(fig)
    m = {**_MARGINS_IN, **margins_in}
    inner_w = width_in - m["left"] - m["right"]
    inner_h = height_in - m["bottom"] - m["top"]
    fig.subplots_adjust(left=m["left"] / width_in, right=1 - m["right"] / width_in, bottom=m["bottom"] / height_in,
                        top=1 - m["top"] / height_in, wspace=gap_in / max(0.1, (inner_w - gap_in) / 2),
                        hspace=gap_in / max(0.1, (inner_h - gap_in) / 2))
    return fig


def _text_width_in(texts: Sequence[str], fontsize: float) -> float:
    """Return the width in inches of the widest of texts set in matplotlib's default font at fontsize."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    prop = FontProperties(size=fontsize)
    return max((TextToPath().get_text_width_height_descent(t, prop, ismath=False)[0] for t in texts),
               default=0.0) / 72.0


@_drawn_in_background
def latency_histogram(times_ms: Sequence[float], stats: dict[str, float], title: str, path: Path) -> Path:
    """Write a histogram of per-iteration latencies with p50/p90/p99 marked; return path."""
    fig = _figure(7, 4)
    ax = fig.add_subplot()
    values = list(times_ms)
    lo, hi = min(values), max(values)
    if stats.get("p50") is not None and stats.get("p99") is not None:  # keep rare outliers from flattening it
        hi = min(hi, stats["p99"] + 3 * (stats["p99"] - lo) + 1e-9)
    beyond = sum(v > hi for v in values)
    ax.hist(values, bins=min(50, max(10, len(values) // 5)), range=(lo, hi), color="#3572a5", alpha=0.85,
            label=f"{beyond} iteration(s) above {hi:.3g} ms not shown" if beyond else None)
    for key, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
        if stats.get(key) is not None:
            ax.axvline(stats[key], color="#c0392b", linestyle=style, label=f"{key} {stats[key]:.3g} ms")
    ax.set_xlabel("latency per inference (ms)")
    ax.set_ylabel("iterations")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.savefig(path, format="png")


@_drawn_in_background
def per_op_bars(rows: Sequence[dict], title: str, path: Path, top: int = 15) -> Path:
    """Write a horizontal bar chart of the top ops by cycles (label: node and op type); return path."""
    shown = list(rows[:top])
    labels = [f"{r['node']} ({r['op_type'] or '?'})" for r in shown][::-1]
    left_in = _text_width_in(labels, 8) + 0.2
    fig = _figure(left_in + 5.5, max(2.5, 0.35 * len(shown) + 1.2), left=left_in)
    ax = fig.add_subplot()
    cycles = [r["cycles"] for r in shown][::-1]
    bars = ax.barh(labels, cycles, color="#2e8b57")
    for bar, r in zip(bars, shown[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {r['share']:.1%}", va="center", fontsize=8)
    ax.set_xlabel("cycles per execution (median)")
    ax.set_title(title, fontsize=10)
    ax.tick_params(axis="y", labelsize=8)
    ax.margins(x=0.15)
    fig.savefig(path, format="png")


@_drawn_in_background
def pareto_curve(rows: Sequence[dict], title: str, path: Path, min_sqnr_db: float | None = None,
                 min_cosine: float | None = None) -> Path:
    """Write mixed precision's trade-off: output SQNR and cosine similarity against the number of
    promoted activations, and SQNR against model size (points labelled with units and simulated ms),
    the KPI limits dashed, configurations meeting the KPI filled; return path."""
    from matplotlib.ticker import MaxNLocator

    shown = [r for r in rows if r.get("sqnr_db") is not None]
    fig = _figure(11, 4.2, gap_in=_TWIN_AXIS_IN + _MARGINS_IN["left"], top=0.5, right=0.9)  # right: point labels
    left, right = fig.subplots(1, 2)
    cap = 100.0
    x = [r["promoted_tensors"] for r in shown]
    sqnr = [min(r["sqnr_db"], cap) for r in shown]
    met = [bool(r.get("meets_kpi")) for r in shown]
    left.plot(x, sqnr, "-", color="#3572a5", lw=1.2)
    left.scatter(x, sqnr, c=["#2e8b57" if m else "white" for m in met], edgecolors="#3572a5", zorder=3,
                 label="SQNR (filled: KPI met)")
    if min_sqnr_db is not None:
        left.axhline(min_sqnr_db, color="#c0392b", ls="--", lw=1, label=f"min SQNR {min_sqnr_db:g} dB")
    left.set_xlabel("promoted activations (16-bit)")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_ylabel("output SQNR vs float (dB)")
    twin = left.twinx()
    twin.plot(x, [r["cosine_similarity"] for r in shown], "s:", ms=4, color="#e67e22", label="cosine similarity")
    if min_cosine is not None:
        twin.axhline(min_cosine, color="#e67e22", ls="--", lw=0.8, alpha=0.6)
    twin.set_ylabel("cosine similarity")
    lines = left.get_legend_handles_labels()
    extra = twin.get_legend_handles_labels()
    left.legend(lines[0] + extra[0], lines[1] + extra[1], fontsize=8, loc="lower right")
    left.grid(alpha=0.3)
    size_kb = [r["model_bytes"] / 1024 for r in shown]
    right.plot(size_kb, sqnr, "-", color="#888888", lw=0.8)
    right.scatter(size_kb, sqnr, c=["#2e8b57" if m else "white" for m in met], edgecolors="#3572a5", zorder=3)
    for r, xs, ys in zip(shown, size_kb, sqnr):
        ms = f", {r['simulated_ms']:.3g} ms" if r.get("simulated_ms") is not None else ""
        right.annotate(f"{r['promoted_units']} unit(s){ms}", (xs, ys), textcoords="offset points",
                       xytext=(5, -10), fontsize=7)
    if min_sqnr_db is not None:
        right.axhline(min_sqnr_db, color="#c0392b", ls="--", lw=1)
    right.set_xlabel("model size (KiB)")
    right.margins(x=0.2, y=0.1)
    right.set_ylabel("output SQNR vs float (dB)")
    right.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, format="png")


@_drawn_in_background
def sqnr_along_graph(rows: Sequence[tuple], first: tuple | None, min_cosine: float, path: Path) -> Path:
    """Write error isolation's SQNR (and cosine similarity) along the graph, host QDQ and HTP; return path. rows:
    (index, node, sqnr_host_db, sqnr_htp_db, cosine_host, cosine_htp) in topological order; first: (index, node,
    sqnr_htp_db) of the first divergent tensor, or None."""
    cap = 100.0
    x = [r[0] for r in rows]
    names = [r[1] for r in rows] if len(rows) <= 40 else []  # the tensors' names as x tick labels, when they fit
    bottom_in = _MARGINS_IN["bottom"] + 0.94 * _text_width_in(names, 7)  # rotated 70 degrees: sin 70 = 0.94
    fig = _figure(max(6.0, min(18.0, 0.25 * len(rows) + 4)), 6.0 + bottom_in - _MARGINS_IN["bottom"], gap_in=0.15,
                  bottom=bottom_in)
    ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    ax.plot(x, [min(r[2], cap) for r in rows], "o-", ms=3, label="host QDQ emulation")
    ax.plot(x, [min(r[3], cap) for r in rows], "s-", ms=3, label="device htp")
    ax.set_ylabel("SQNR vs float (dB)")
    ax.set_title("Layer-by-layer error isolation (topological order)")
    ax2.plot(x, [r[4] for r in rows], "o-", ms=3)
    ax2.plot(x, [r[5] for r in rows], "s-", ms=3)
    ax2.axhline(min_cosine, color="red", ls="--", lw=1, label=f"cosine {min_cosine}")
    ax2.set_ylabel("cosine similarity")
    ax2.set_xlabel("compared tensor")
    if first is not None:
        for a in (ax, ax2):
            a.axvline(first[0], color="red", lw=1, alpha=0.6)
        ax.annotate(f"first divergent: {first[1]}", (first[0], min(first[2], cap)),
                    textcoords="offset points", xytext=(8, 8), color="red", fontsize=8)
    if names:
        ax2.set_xticks(x, names, rotation=70, ha="right", fontsize=7)
    ax.legend(fontsize=8)
    ax2.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax2.grid(alpha=0.3)
    fig.savefig(path, format="png")


def _shade_idle(ax, samples) -> None:
    idle = [s.t_s for s in samples if s.phase == "idle"]
    if idle:
        ax.axvspan(min(idle), 0.0, color="#dddddd", alpha=0.6, label="idle (model loaded)")


@_drawn_in_background
def soak_chart(windows: Sequence, samples: Sequence, trips: Sequence, title: str, path: Path,
               onset_s: float | None = None, zones: int = 3) -> Path:
    """Write latency per window (p50 and p90, left axis) with the hottest zones' temperatures against time
    (right axis, trip points dashed, throttling onset marked); return path."""
    fig = _figure(9, 4.5, right=_TWIN_AXIS_IN)
    ax = fig.add_subplot()
    timed = [w for w in windows if w.p50_ms is not None]
    if timed:
        edges = [w.t_start_s for w in timed] + [timed[-1].t_end_s]
        ax.stairs([w.p50_ms for w in timed], edges, baseline=None, color="#3572a5", linewidth=2, label="p50 per window")
        ax.stairs([w.p90_ms for w in timed], edges, baseline=None, color="#3572a5", linestyle=":",
                  label="p90 per window")
        ax.set_ylim(bottom=0)
    ax.set_xlabel("time since the soak started (s)")
    ax.set_ylabel("latency per inference (ms)")
    if onset_s is not None:
        ax.axvline(onset_s, color="#c0392b", linewidth=1.5, label=f"throttling onset {onset_s:g} s")
    handles, labels = ax.get_legend_handles_labels()
    peaks: dict[str, float] = {}
    for s in samples:
        for z, t in s.temps_c.items():
            peaks[z] = max(peaks.get(z, t), t)
    shown = sorted(peaks, key=peaks.get, reverse=True)[:zones]
    if shown:
        tx = ax.twinx()
        colors = ["#e67e22", "#8e44ad", "#16a085", "#7f8c8d"]
        for color, zone in zip(colors, shown):
            points = [(s.t_s, s.temps_c[zone]) for s in samples if zone in s.temps_c]
            tx.plot([p[0] for p in points], [p[1] for p in points], color=color, linewidth=1, label=f"{zone} °C")
        levels: dict[tuple[float, str], list[str]] = {}
        for trip in trips:  # one line per trip temperature, naming the shown zones that have it
            if trip.zone in shown:
                levels.setdefault((trip.temp_c, trip.type), []).append(trip.zone)
        for (temp_c, kind), names in sorted(levels.items()):
            tx.axhline(temp_c, color="#c0392b" if kind == "critical" else "#7f8c8d", linestyle="--", linewidth=0.8,
                       label=f"trip {temp_c:g} °C ({kind}): {', '.join(names)}")
        tx.set_ylabel("temperature (°C)")
        more_h, more_l = tx.get_legend_handles_labels()
        handles, labels = handles + more_h, labels + more_l
    ax.set_title(title, fontsize=10)
    ax.legend(handles, labels, fontsize=7, loc="upper left")
    fig.savefig(path, format="png")


@_drawn_in_background
def power_chart(samples: Sequence, idle_power_w: float | None, title: str, path: Path) -> Path:
    """Write the device's power against time (idle phase shaded, its mean drawn); return path."""
    fig = _figure(9, 3.5)
    ax = fig.add_subplot()
    points = [(s.t_s, s.power_w) for s in samples if s.power_w is not None]
    _shade_idle(ax, samples)
    ax.plot([p[0] for p in points], [p[1] for p in points], color="#2e8b57", marker=".", linewidth=1,
            label="power (|current_now| x voltage_now)")
    if idle_power_w is not None:
        ax.axhline(idle_power_w, color="#7f8c8d", linestyle="--", label=f"idle mean {idle_power_w:.3g} W")
    ax.set_xlabel("time since the measured run started (s)")
    ax.set_ylabel("power (W)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.savefig(path, format="png")


@_drawn_in_background
def concurrency_bars(rows: Sequence[dict], title: str, path: Path) -> Path:
    """Write solo against concurrent p50 latency per session as grouped bars; return path."""
    fig = _figure(max(7.5, 1.2 * len(rows) + 2), 3.8)
    ax = fig.add_subplot()
    xs = list(range(len(rows)))
    solo = [r["solo_p50_ms"] or 0 for r in rows]
    conc = [r["concurrent_p50_ms"] or 0 for r in rows]
    ax.bar([x - 0.2 for x in xs], solo, width=0.4, color="#3572a5", label="solo p50")
    bars = ax.bar([x + 0.2 for x in xs], conc, width=0.4, color="#e67e22", label="concurrent p50")
    for bar, r in zip(bars, rows):
        if r.get("latency_degradation"):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"x{r['latency_degradation']:.2f}",
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(xs, [f"#{r['session']} {r['model']}" for r in rows], fontsize=8)
    ax.set_ylabel("latency per inference (ms)")
    ax.margins(y=0.12)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.savefig(path, format="png")


@_drawn_in_background
def token_rate_chart(rates: Sequence[dict], rss: Sequence[dict], title: str, path: Path) -> Path:
    """Write each query's generation rate (tokens/s, one series per worker) against time, with the runner's
    resident memory on the right axis; return path. rates: {t_s, tokens_per_s, worker}; rss: {t_s, rss_mb}."""
    fig = _figure(9, 4.5, right=_TWIN_AXIS_IN)
    ax = fig.add_subplot()
    for worker in sorted({r["worker"] for r in rates}):
        points = [(r["t_s"], r["tokens_per_s"]) for r in rates if r["worker"] == worker and r["tokens_per_s"]]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", linewidth=1.2,
                label=f"worker {worker} tokens/s")
    ax.set_xlabel("time since the stress run started (s)")
    ax.set_ylabel("token generation rate (tokens/s)")
    ax.set_ylim(bottom=0)
    handles, labels = ax.get_legend_handles_labels()
    if rss:
        tx = ax.twinx()
        tx.plot([s["t_s"] for s in rss], [s["rss_mb"] for s in rss], color="#7f8c8d", linewidth=1, label="RSS (MB)")
        tx.set_ylabel("runner resident memory (MB)")
        more_h, more_l = tx.get_legend_handles_labels()
        handles, labels = handles + more_h, labels + more_l
    ax.set_title(title, fontsize=10)
    ax.legend(handles, labels, fontsize=7, loc="lower left")
    fig.savefig(path, format="png")
