"""PNG charts for the profile step: a latency histogram and a per-op cycles bar chart.

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
