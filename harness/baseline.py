"""Baselines: one device × model's step outcomes and KPIs kept in a JSON file, and the rules that compare
one KPI's baseline value with this run's.

A baseline file is ``DIR/<device>/<model>.json`` (``--save-baseline DIR`` writes one per device × model at
the end of a run)::

    {"format": 2, "device": ..., "soc": ..., "model": ..., "model_sha256": ..., "harness_version": ...,
     "saved_at": ..., "toolchain": {"onnxruntime": ..., "onnxruntime-qnn": ..., "qnn-sdk": ..., ...},
     "steps": {step: {"outcome": ..., "kpis": {...}}}}

``toolchain`` (optional: older files have none) is what the run that saved it ran on; a later run on
another toolchain says so beside its verdicts, since a changed QNN SDK changes latency and accuracy as a
changed model does.

Format 2 (this harness) differs from format 1 (older harnesses, still read) in what the profile step's KPIs
hold: the latency measured in independent blocks with their spread (``latency_blocks_ms``,
``latency_noise_pct``; on emulated devices ``device_latency_ms`` and its blocks) and the artifact measured
(``artifact_path``, ``artifact_key``, ``artifact_sha256``), so a later run can find it in the cache for an A/B.

The comparison rules (``compare_*``) are pure: each returns a KpiVerdict, one of VERDICTS, with both values,
the delta (absolute and %), the p-value where a test was run, and the rule in words. A figure measured in
independent blocks (compare_blocks, compare_paired) regresses only when the change is statistically
significant on the blocks (not on the iterations inside them, which share one run's host load) AND larger
than max(threshold, k x the baseline's noise floor); beyond that bound but not significant it is
``inconclusive``, as is a figure that cannot be tested (no blocks on a side).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from harness.clock import now_iso
from harness.errors import ConfigError, HarnessError
from harness.files import sha256_file, write_text_atomically
from harness.json_values import json_default
from harness.reporting.records import StepRecord
from harness.repeats import min_unpaired_p, paired, unpaired_p
from harness.versions import harness_version, toolchain_versions

if TYPE_CHECKING:
    from harness.cache import ArtifactCache
    from harness.models import ModelSpec
    from harness.target import Target

FORMAT = 2
READ_FORMATS = (1, 2)  # format 1: an older harness's baseline, without latency blocks or artifact
REGRESSION_STEP = "regression"  # the step that compares: never part of a baseline
VERDICTS = ("improved", "unchanged", "regressed", "inconclusive", "new", "missing")
RAN = ("passed", "failed", "error", "inconclusive")  # outcomes of a step that ran (a skipped step did not)


class BaselineError(HarnessError):
    """A baseline file or directory cannot be read or written; the message names it and what is wrong."""


# ---------------------------------------------------------------------------------------------- files


@dataclass(frozen=True)
class Snapshot:
    """One device × model's step records (outcome and KPIs): a saved baseline, or this run's."""

    device: str
    soc: str
    model: str
    model_sha256: str
    steps: dict[str, StepRecord]
    harness_version: str | None = None
    saved_at: str | None = None
    format: int = FORMAT
    toolchain: dict[str, str | None] = field(default_factory=dict)  # harness.versions.toolchain_versions()

    def as_json(self) -> dict[str, Any]:
        """The snapshot as a baseline file's JSON object."""
        return {"format": self.format, "device": self.device, "soc": self.soc, "model": self.model,
                "model_sha256": self.model_sha256, "harness_version": self.harness_version,
                "saved_at": self.saved_at, "toolchain": self.toolchain,
                "steps": {name: {"outcome": s.outcome, "kpis": s.kpis} for name, s in self.steps.items()}}

    def ran(self) -> bool:
        """True when at least one step ran (passed, failed or errored) rather than being skipped."""
        return any(s.outcome in RAN for s in self.steps.values())


def snapshot(records: Iterable[StepRecord], device: str, soc: str, model: str, model_sha256: str,
             harness_version: str | None = None, saved_at: str | None = None,
             toolchain: dict[str, str | None] | None = None) -> Snapshot:
    """Return the Snapshot of device × model from step records (the regression step's own left out; a step
    recorded twice keeps its last record)."""
    steps: dict[str, StepRecord] = {}
    for r in records:
        if r.device == device and r.model == model and r.step != REGRESSION_STEP:
            steps.pop(r.step, None)  # re-recorded: moves to the end, in run order
            steps[r.step] = StepRecord(device, soc, model, r.step, r.outcome, dict(r.kpis))
    return Snapshot(device, soc, model, model_sha256, steps, harness_version, saved_at, toolchain=dict(toolchain or {}))


def baseline_path(root: Path, device: str, model: str) -> Path:
    """Return where the baseline of device × model lives under root: root/<device>/<model>.json."""
    return root / device / f"{model}.json"


def check_baseline_dir(root: Path) -> None:
    """Raise ConfigError unless root (--baseline) is an existing directory."""
    if not root.exists():
        raise ConfigError(f"--baseline {root}: no such directory (write one first with --save-baseline {root})")
    if not root.is_dir():
        raise ConfigError(f"--baseline {root}: not a directory (it holds <device>/<model>.json files)")


def check_save_dir(root: Path) -> None:
    """Raise ConfigError unless root (--save-baseline) is, or can be created as, a writable directory
    (nothing is created here: that happens when the baselines are saved)."""
    probe = root
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if probe != root and not probe.is_dir():
        raise ConfigError(f"--save-baseline {root}: cannot create it, {probe} is a file, not a directory")
    if probe == root and not root.is_dir():
        raise ConfigError(f"--save-baseline {root}: it is a file, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"--save-baseline {root}: {probe} is not writable by this user")


def save_baseline(root: Path, snap: Snapshot) -> Path:
    """Write snap to baseline_path(root, ...) atomically (a temporary file renamed into place); return the
    path. Raises BaselineError naming the file when it cannot be written."""
    path = baseline_path(root, snap.device, snap.model)
    try:  # an interrupted write leaves no temporary file
        write_text_atomically(path, json.dumps(snap.as_json(), indent=1, default=json_default))
    except OSError as e:
        raise BaselineError(f"cannot write the baseline {path}: {e.strerror or e}") from None
    return path


def load_baseline(path: Path) -> Snapshot:
    """Return the Snapshot saved in path. Raises BaselineError naming the file and what is wrong with it
    (unreadable, not JSON, another format, a missing or mistyped field)."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise BaselineError(f"cannot read the baseline {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BaselineError(f"the baseline {path} is not valid JSON ({e}); save it again with --save-baseline")\
            from None

    def bad(what: str) -> BaselineError:
        return BaselineError(f"the baseline {path} is not a harness baseline: {what}; save it again with "
                             "--save-baseline")

    if not isinstance(data, dict):
        raise bad(f"the file holds a JSON {type(data).__name__}, not an object")
    if data.get("format") not in READ_FORMATS:
        raise bad(f"format is {data.get('format')!r}, this harness reads formats "
                  f"{', '.join(map(str, READ_FORMATS))}")
    for key in ("device", "soc", "model", "model_sha256"):
        if not isinstance(data.get(key), str):
            raise bad(f"'{key}' is {'missing' if key not in data else repr(data[key])}, not a string")
    steps = data.get("steps")
    if not isinstance(steps, dict):
        raise bad(f"'steps' is {'missing' if 'steps' not in data else type(steps).__name__}, not an object")
    results: dict[str, StepRecord] = {}
    for name, step in steps.items():
        if not isinstance(step, dict) or not isinstance(step.get("outcome"), str) \
                or not isinstance(step.get("kpis"), dict):
            raise bad(f"steps.{name} is not an object with a string 'outcome' and an object 'kpis'")
        results[name] = StepRecord(data["device"], data["soc"], data["model"], name, step["outcome"], step["kpis"])
    toolchain = data.get("toolchain") or {}
    if not isinstance(toolchain, dict):
        raise bad(f"'toolchain' is {type(toolchain).__name__}, not an object of package versions")
    return Snapshot(data["device"], data["soc"], data["model"], data["model_sha256"], results,
                    _optional_str(data.get("harness_version")), _optional_str(data.get("saved_at")),
                    data["format"], {str(k): _optional_str(v) for k, v in toolchain.items()})


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def model_sha256(spec: "ModelSpec", cache: "ArtifactCache") -> str:
    """Return the sha256 of the model file under test: the user's file, or a zoo model's built file in the
    cache ("zoo:<name>" while the zoo model has not been built). Raises BaselineError when the file cannot
    be read."""
    if spec.is_zoo:
        if not (cache.root / "zoo" / spec.name).is_dir():
            return f"zoo:{spec.name}"
        from harness.model_sources import source_model

        path = source_model(spec, cache)
    else:
        path = spec.path
    try:
        return sha256_file(path)
    except OSError as e:
        raise BaselineError(f"cannot hash the model file {path}: {e.strerror or e}") from None


@dataclass(frozen=True)
class Saved:
    """What --save-baseline did for one device × model: the file written, or why none was."""

    device: str
    model: str
    path: Path | None
    steps: int = 0
    reason: str = ""


def save_baselines(root: Path, targets: Sequence["Target"], records: Sequence[StepRecord],
                   cache: "ArtifactCache") -> list[Saved]:
    """Write one baseline per target that ran at least one step (a target whose steps were all skipped or
    deselected keeps any earlier baseline); return what was done per target. Raises BaselineError when a
    file cannot be written."""
    saved_at, version, toolchain = now_iso(), harness_version(), toolchain_versions()
    done = []
    for t in targets:
        snap = snapshot(records, t.device.id, t.soc.id, t.model.name, "", version, saved_at, toolchain)
        if not snap.ran():
            done.append(Saved(t.device.id, t.model.name, None,
                              reason="no step ran on it in this run (all skipped or deselected)"))
            continue
        snap = replace(snap, model_sha256=model_sha256(t.model, cache))
        done.append(Saved(t.device.id, t.model.name, save_baseline(root, snap), len(snap.steps)))
    return done


# ---------------------------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class KpiVerdict:
    """One KPI of one step, baseline against this run: verdict is one of VERDICTS."""

    kpi: str
    step: str
    baseline: Any
    current: Any
    delta: float | None
    delta_pct: float | None
    verdict: str
    p_value: float | None
    rule: str
    unit: str = ""
    detail: str = field(default="", compare=False)  # the message's parenthesis, e.g. "+30.3%, Mann-Whitney p=0.0001"

    def as_dict(self) -> dict[str, Any]:
        """The verdict as a `verdicts` KPI row: kpi, step, baseline, current, delta, delta_pct, verdict,
        p_value, rule."""
        return {k: v for k, v in asdict(self).items() if k not in ("unit", "detail")}

    def message(self) -> str:
        """Return the verdict in one line, e.g. 'profile latency_ms.p50 regressed: 2.61 -> 3.4 ms (+30.3%,
        Mann-Whitney p=0.0001)'."""
        unit = f" {self.unit}" if self.unit else ""
        text = f"{self.step} {self.kpi} {self.verdict}: {_fmt(self.baseline)} -> {_fmt(self.current)}{unit}"
        return f"{text} ({self.detail})" if self.detail else text


def _fmt(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or (math.isfinite(value) and value == int(value) and abs(value) >= 1000):
        return f"{int(value)}"
    return f"{value:.4g}"


def _deltas(baseline: float, current: float) -> tuple[float | None, float | None]:
    """Return (current - baseline, that change in % of |baseline|); None where it is not finite."""
    delta = current - baseline
    if not math.isfinite(delta):
        return None, None
    pct = 100.0 * delta / abs(baseline) if baseline and math.isfinite(baseline) else None
    return round(delta, 6), (round(pct, 2) if pct is not None else None)


def one_side(step: str, kpi: str, baseline: Any, current: Any, rule: str, unit: str = "") -> KpiVerdict | None:
    """Return `new` when only this run has the KPI, `missing` when only the baseline has it, None when both
    (or neither) do."""
    if baseline is None and current is not None:
        return KpiVerdict(kpi, step, None, current, None, None, "new", None, rule, unit, "not in the baseline")
    if baseline is not None and current is None:
        return KpiVerdict(kpi, step, baseline, None, None, None, "missing", None, rule, unit, "not in this run")
    return None


def compare_absolute(step: str, kpi: str, baseline: float | None, current: float | None, tolerance: float,
                     unit: str = "", higher_is_better: bool = True, what: str = "") -> KpiVerdict | None:
    """Compare an accuracy KPI by an absolute tolerance in its direction (higher_is_better False: an error
    rate such as cer): `regressed` when worse than the baseline by more than tolerance, `improved` when better
    by more, else `unchanged` (new/missing when one side has none; None when neither has). what names the
    metric in the rule (e.g. 'cer')."""
    better = "higher" if higher_is_better else "lower"
    worse = "drop" if higher_is_better else "rise"
    rule = (f"absolute: a {worse} of more than {tolerance:g}{' ' + unit if unit else ''} regresses "
            f"({what + ': ' if what else ''}{better} is better)")
    side = one_side(step, kpi, baseline, current, rule, unit)
    if side is not None or baseline is None:
        return side
    delta, pct = _deltas(baseline, current)
    change = current - baseline
    gain = change if higher_is_better else -change
    verdict = "regressed" if gain < -tolerance else "improved" if gain > tolerance else "unchanged"
    detail = f"{_signed(change)}{' ' + unit if unit else ''}, tolerance {tolerance:g}"
    return KpiVerdict(kpi, step, baseline, current, delta, pct, verdict, None, rule, unit, detail)


def compare_lower(step: str, kpi: str, baseline: float | None, current: float | None, threshold: float,
                  unit: str = "", why: str = "") -> KpiVerdict | None:
    """Compare a lower-is-better KPI (context-binary size) by a relative
    threshold: `regressed` above baseline x (1 + threshold), `improved` below baseline x (1 - threshold),
    else `unchanged` (a baseline of 0: any growth regresses). why is added to the rule."""
    rule = f"relative: a change beyond ±{threshold:.0%} counts (lower is better)" + (f"; {why}" if why else "")
    side = one_side(step, kpi, baseline, current, rule, unit)
    if side is not None or baseline is None:
        return side
    delta, pct = _deltas(baseline, current)
    verdict = _relative_verdict(baseline, current, threshold)
    detail = f"{pct:+.1f}%, threshold {threshold:.0%}" if pct is not None else f"{_signed(current - baseline)}"
    return KpiVerdict(kpi, step, baseline, current, delta, pct, verdict, None, rule, unit, detail)


def _relative_verdict(baseline: float, current: float, threshold: float) -> str:
    rel = _relative(baseline, current)
    return "regressed" if rel > threshold else "improved" if rel < -threshold else "unchanged"


def _signed(value: float) -> str:
    return f"{value:+.4g}"


@dataclass(frozen=True)
class Evidence:
    """One side of a figure measured in independent blocks: its value, one value per block (None: no blocks
    were recorded, e.g. a format-1 baseline) and the blocks' relative spread in % (the noise floor)."""

    value: float
    blocks: list[float] | None = None
    noise_pct: float | None = None


def noise_bound(threshold: float, k: float, noise_pct: float | None) -> tuple[float, str]:
    """Return the relative change a figure must exceed to count, max(threshold, k x noise floor), and its words."""
    if noise_pct is None:
        return threshold, f"threshold {threshold:.0%}"
    bound = max(threshold, k * noise_pct / 100.0)
    return bound, f"max(threshold {threshold:.0%}, {k:g} x noise floor {noise_pct:.2g}%) = {bound:.1%}"


def _pct_text(pct: float | None, baseline: float, current: float) -> str:
    return f"{pct:+.1f}%" if pct is not None else _signed(current - baseline)


def _relative(baseline: float, current: float) -> float:
    if baseline == 0:
        return 0.0 if current == 0 else math.copysign(math.inf, current)
    return (current - baseline) / abs(baseline)


def compare_blocks(step: str, kpi: str, baseline: Evidence | None, current: Evidence | None, alpha: float,
                   threshold: float, k: float, unit: str = "", decides: bool = True, undecidable: str = "",
                   weaker: str = "") -> KpiVerdict | None:
    """Compare a lower-is-better figure measured in blocks in two sessions (the baseline's and this one):
    `unchanged` within max(threshold, k x the baseline's noise floor); beyond it, `regressed` (`improved`)
    when a two-sided Mann-Whitney U test of the block values is significant at alpha, else `inconclusive`
    (too few blocks to test, or not significant). When decides is False (simulator wall time of two sessions,
    which cannot separate host load from a regression), a significant change beyond the bound is
    `inconclusive` too, saying `undecidable`. `weaker` says why the evidence is weaker (e.g. an old baseline)."""
    bound, bound_text = noise_bound(threshold, k, baseline.noise_pct if baseline else None)
    rule = (f"independent blocks: a change beyond {bound_text} that a two-sided Mann-Whitney U test of the block "
            f"values finds significant at {alpha:g} (lower is better)" + (f"; {weaker}" if weaker else ""))
    side = one_side(step, kpi, baseline and baseline.value, current and current.value, rule, unit)
    if side is not None or baseline is None or current is None:
        return side
    b, c = baseline.value, current.value
    delta, pct = _deltas(b, c)
    change, rel = _pct_text(pct, b, c), _relative(b, c)

    def verdict(name: str, detail: str, p: float | None = None) -> KpiVerdict:
        return KpiVerdict(kpi, step, b, c, delta, pct, name, None if p is None else float(f"{p:.3g}"), rule, unit,
                          detail)

    if abs(rel) <= bound:
        return verdict("unchanged", f"{change}, within {bound_text}" + (f"; {weaker}" if weaker else ""))
    nb, nc = len(baseline.blocks or []), len(current.blocks or [])
    if min_unpaired_p(nb, nc) >= alpha:
        lacking = ("the baseline has no blocks" if nb == 0 else "this run has no blocks" if nc == 0 else
                   f"{nb} block(s) in the baseline and {nc} now cannot reach significance at {alpha:g}")
        return verdict("inconclusive", f"{change}, beyond {bound_text}, but {lacking}: the change cannot be told "
                                       "from run-to-run noise" + (f" ({weaker})" if weaker else ""))
    p = unpaired_p(baseline.blocks, current.blocks)
    test = f"{nb} vs {nc} blocks, Mann-Whitney p={p:.2g}"
    if p >= alpha:
        return verdict("inconclusive", f"{change}, beyond {bound_text}, not significant ({test})", p)
    if not decides:
        return verdict("inconclusive", f"{change}, beyond {bound_text}, {test}; {undecidable}", p)
    return verdict("regressed" if rel > 0 else "improved", f"{change}, beyond {bound_text}, {test}", p)


def compare_paired(step: str, kpi: str, baseline: Sequence[float], current: Sequence[float], alpha: float,
                   threshold: float, k: float, noise_pct: float | None, unit: str = "", final: bool = True,
                   recorded: str = "") -> KpiVerdict | None:
    """Compare interleaved A/B blocks of one session (baseline[i] and current[i] measured back to back):
    `unchanged` when the geometric-mean ratio is within max(threshold, k x noise floor), `regressed`
    (`improved`) beyond it when a t-test of the pairs' log ratios is significant at alpha, else undecided:
    None (measure more pairs), or `inconclusive` when final. The values are the blocks' medians; `recorded`
    (the two sessions' recorded figures) is added to the detail."""
    import numpy as np

    bound, bound_text = noise_bound(threshold, k, noise_pct)
    rule = (f"interleaved A/B on this device in this session (baseline's artifact, then this run's, alternating): "
            f"a change of the pairs' ratio beyond {bound_text} that a t-test of the log ratios finds "
            f"significant at {alpha:g} (lower is better)")
    pair = paired(baseline, current)
    b, c = round(float(np.median(baseline)), 6), round(float(np.median(current)), 6)
    pct = round(100.0 * (pair.ratio - 1.0), 2)
    test = f"A/B {pair.pairs} pairs, ratio x{pair.ratio:.3g} ({pct:+.1f}%), paired t-test p={pair.p_value:.2g}"
    if abs(pair.ratio - 1.0) <= bound:
        name, detail = "unchanged", f"{test}, within {bound_text}"
    elif pair.p_value < alpha:
        name, detail = ("regressed" if pair.ratio > 1 else "improved"), f"{test}, beyond {bound_text}"
    elif not final:
        return None
    else:
        name, detail = "inconclusive", f"{test}, beyond {bound_text} but not significant"
    detail += f"; recorded {recorded}" if recorded else ""
    return KpiVerdict(kpi, step, b, c, round(c - b, 6), pct, name, float(f"{pair.p_value:.3g}"), rule, unit, detail)


def compare_outcome(step: str, baseline: str | None, current: str | None) -> KpiVerdict | None:
    """Compare a step's outcome: `regressed` when it passed in the baseline and fails now, `improved` the
    other way round, `inconclusive` when the test bench stopped it on either side (`error`: a device command
    past its time limit, a lost device; it says nothing of the model), `new`/`missing` when it ran on one
    side only (skipped counts as not run), else `unchanged`; None when it ran on neither side."""
    rule = "a step that passed in the baseline and fails now regresses"
    base = baseline if baseline in RAN else None
    cur = current if current in RAN else None
    side = one_side(step, "outcome", base, cur, rule)
    if side is not None or base is None:
        return side
    if "error" in (base, cur) and base != cur:
        return KpiVerdict("outcome", step, base, cur, None, None, "inconclusive", None, rule, "",
                          "the test bench stopped the step (error), so its outcome says nothing of the model")
    verdict = ("inconclusive" if base == "passed" and cur == "inconclusive" else
               "regressed" if base == "passed" and cur != "passed" else
               "improved" if base != "passed" and cur == "passed" else "unchanged")
    return KpiVerdict("outcome", step, base, cur, None, None, verdict, None, rule)
