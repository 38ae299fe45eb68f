"""Interleaved A/B latency on one device in one session: the baseline's artifact (A) and this run's (B), one
block each in turn (A B, B A, A B, ...), so both see the same host load and thermal state (after Chromium's
Pinpoint). Each block is a separate runner invocation under the profile step's block rule; its median is one
sample. The comparison starts with AB_PAIRS pairs and, while undecided, measures AB_MORE more, up to
AB_MAX_PAIRS, then says `inconclusive`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harness.baseline import KpiVerdict
from harness.data import Feed
from harness.runner.base import CONTEXT_SIDECAR
from harness.runner.client import DeviceRunner
from harness.steps.context_binary import ContextBinary
from harness.steps.profile import context_sha256, measure_latency

AB_PAIRS = 5
AB_MORE = 5
AB_MAX_PAIRS = 15


@dataclass(frozen=True)
class Bench:
    """What an A/B on this run's device needs: its runner, one input (built when an A/B runs) and the root of
    the artifact cache the baseline's artifact must be in."""

    runner: DeviceRunner
    feed: Callable[[], Feed]
    cache_root: Path


def cached_artifact(kpis: dict[str, Any], cache_root: Path) -> tuple[Path | None, str]:
    """Return the context binary a profile step's KPIs name (artifact_path) when it is under cache_root with
    the recorded artifact_sha256, else None and why not."""
    path, sha = kpis.get("artifact_path"), kpis.get("artifact_sha256")
    if not isinstance(path, str) or not isinstance(sha, str):
        return None, "the baseline does not name the artifact it measured (a baseline from an older harness)"
    model = Path(path)
    try:
        model.resolve().relative_to(cache_root.resolve())
    except ValueError:
        return None, f"its artifact {model} is not in this run's cache ({cache_root})"
    sidecar = model.parent / CONTEXT_SIDECAR
    if not model.is_file() or not sidecar.is_file():
        return None, f"its artifact {model} is no longer in the cache"
    try:
        ctx = ContextBinary(model.parent, json.loads(sidecar.read_text()), True)
        actual = context_sha256(ctx)
    except (OSError, ValueError, KeyError) as e:
        return None, f"its artifact {model} cannot be read ({e})"
    if actual != sha:
        return None, f"its artifact {model} has changed since (sha256 {actual[:12]}, recorded {sha[:12]})"
    return model, ""


def interleaved(bench: Bench, baseline: Path, current: Path, block: Any,
                decide: Callable[[list[float], list[float], bool], KpiVerdict | None]) -> KpiVerdict:
    """Run interleaved blocks of baseline and current (block: a profile MeasureRule) and return decide's
    verdict: decide(baseline medians, current medians, final) returns None while undecided, and must decide
    when final (AB_MAX_PAIRS pairs measured)."""
    feed = bench.feed()
    a_ms: list[float] = []
    b_ms: list[float] = []
    pairs = AB_PAIRS
    while True:
        while len(a_ms) < pairs:
            order = [(baseline, a_ms), (current, b_ms)]
            for model, out in (order if len(a_ms) % 2 == 0 else order[::-1]):
                out.append(round(measure_latency(bench.runner, model, [feed], "htp", block).stats.p50, 4))
        verdict = decide(a_ms, b_ms, pairs >= AB_MAX_PAIRS)
        if verdict is not None:
            return verdict
        pairs = min(pairs + AB_MORE, AB_MAX_PAIRS)
