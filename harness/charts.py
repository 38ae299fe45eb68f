"""PNG charts: the profile step's latency histogram and per-op cycles bar chart, and mixed
precision's accuracy-vs-promotions (Pareto) curve.

Uses matplotlib's object API on an Agg canvas, so no display and no global backend switch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def _figure(width_in: float, height_in: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


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
    return Path(path)


def per_op_bars(rows: Sequence[dict], title: str, path: Path, top: int = 15) -> Path:
    """Write a horizontal bar chart of the top ops by cycles (label: node and op type); return path."""
    shown = list(rows[:top])
    fig = _figure(8, max(2.5, 0.35 * len(shown) + 1.2))
    ax = fig.add_subplot()
    labels = [f"{r['node']} ({r['op_type'] or '?'})" for r in shown][::-1]
    cycles = [r["cycles"] for r in shown][::-1]
    bars = ax.barh(labels, cycles, color="#2e8b57")
    for bar, r in zip(bars, shown[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {r['share']:.1%}", va="center", fontsize=8)
    ax.set_xlabel("cycles per execution (median)")
    ax.set_title(title, fontsize=10)
    ax.tick_params(axis="y", labelsize=8)
    ax.margins(x=0.15)
    fig.savefig(path, format="png")
    return Path(path)


def pareto_curve(rows: Sequence[dict], title: str, path: Path, min_sqnr_db: float | None = None,
                 min_cosine: float | None = None) -> Path:
    """Write mixed precision's trade-off: output SQNR and cosine similarity against the number of
    promoted activations, and SQNR against model size (points labelled with units and simulated ms),
    the KPI limits dashed, configurations meeting the KPI filled; return path."""
    from matplotlib.ticker import MaxNLocator

    shown = [r for r in rows if r.get("sqnr_db") is not None]
    fig = _figure(11, 4.2)
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
    return Path(path)
