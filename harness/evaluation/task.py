"""A model's task evaluation at run time: outputs -> predictions -> the task metric, on float and quantized
outputs of the same labelled samples, with the ratio to float (the KPI) and the intervals of all three.

Intervals (harness.stats): for a metric that is a share of samples (top1, top5, word_accuracy) the metric's is
Wilson's, the drop's Newcombe's paired difference (it does not collapse to [0, 0] when no sample changed) and
the ratio's follows from the drop's (ratio = 1 - drop / float's value); for the others (cer, f1, map50, a user's) a
percentile bootstrap over samples (map50's matched once, each resample pooling their matches), paired (float and
quantized resampled together), given the metric's whole range below stats.MIN_BOOTSTRAP_SAMPLES samples. A
bootstrap collapses to a point when no sample's score changed (12 unchanged samples would "prove" a ratio of exactly
1) or all changed alike, so a built-in's intervals are at
least its floor (TaskEvaluation._floor): a share of up to stats.resolvable_drop(n) of the samples (Wilson's bound
for 0 of n) moved further to the metric's worst or best value, method stats.FLOORED where the floor widened it;
Newcombe's interval gives a share metric the same at least.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from harness import stats
from harness.errors import EvaluationError, HarnessError
from harness.evaluation.metrics import Metric, metric_for
from harness.evaluation.postprocess import Postprocess, postprocessor
from harness.evaluation.spec import Evaluation
from harness.kpi import Interval

Outputs = list[dict[str, np.ndarray]]


@dataclass(frozen=True)
class TaskEvaluation:
    """The evaluation of one model: its post-processing and metric, and the sample files (for errors)."""

    evaluation: Evaluation
    metric: Metric
    postprocess: Postprocess
    samples: tuple[str, ...] = ()  # the file of each evaluation sample, in order
    reported: tuple[Metric, ...] = ()  # the section's `report:` metrics, shown beside the KPI's

    @classmethod
    def of(cls, evaluation: Evaluation, samples: tuple[str, ...] = (),
           input_shape: tuple[int, ...] | None = None) -> "TaskEvaluation":
        """Return the evaluation with its post-processing (for the model's first input's shape) and metric loaded."""
        return cls(evaluation, metric_for(evaluation), postprocessor(evaluation, input_shape), samples,
                   tuple(metric_for(evaluation, name) for name in evaluation.report))

    @property
    def identity(self) -> dict[str, Any]:
        """What the metric's values depend on besides outputs and labels (for cache keys)."""
        charset = self.evaluation.charset
        return {"metric": self.evaluation.metric, "postprocess": self.evaluation.postprocess,
                "output": self.evaluation.output, "report": list(self.evaluation.report),
                "charset": charset.read_bytes().hex() if charset is not None and charset.stat().st_size < 2**20
                else str(charset)}

    def _sample(self, k: int) -> str:
        return self.samples[k] if k < len(self.samples) else f"#{k}"

    def predictions(self, outputs: Outputs) -> list:
        """Return each sample's prediction; raises EvaluationError naming the post-processing and the sample."""
        found = []
        for k, output in enumerate(outputs):
            try:
                found.append(self.postprocess(output))
            except HarnessError as e:
                raise EvaluationError(f"{e} (sample {self._sample(k)})") from None
            except Exception as e:  # a user's post-processing raises what it raises
                raise EvaluationError(f"{self.evaluation.where}: evaluation.postprocess {self.evaluation.postprocess} "
                                      f"raised on sample {self._sample(k)}: {type(e).__name__}: {e}") from None
        return found

    def parsed(self, labels) -> list:
        """Return the labels (text, as the CSV holds them) read as the metric reads them."""
        return self.parsed_by(self.metric, labels)

    @staticmethod
    def parsed_by(metric: Metric, labels) -> list:
        """Return the labels read as `metric` reads them."""
        return [metric.parse(str(y)) for y in labels]

    def _score(self, predictions: list, labels: list) -> float:
        return self._guarded(self.metric.value, predictions, labels)

    def _table(self, predictions: list, labels: list) -> np.ndarray:
        """A built-in metric's per-sample parts (Metric.table), its errors as _score's."""
        return self._guarded(self.metric.table, predictions, labels)

    def _guarded(self, function: Callable, predictions: list, labels: list):
        try:
            return function(predictions, labels)
        except HarnessError:
            raise
        except Exception as e:
            raise EvaluationError(f"{self.evaluation.where}: evaluation.metric {self.evaluation.metric} raised: "
                                  f"{type(e).__name__}: {e}") from None

    def value(self, outputs: Outputs, labels) -> float:
        """Return the task metric of outputs against labels."""
        return self._score(self.predictions(outputs), self.parsed(labels))

    def compare(self, outputs: Outputs, reference: Outputs, labels) -> dict[str, Any]:
        """Return the KPIs of quantized outputs against the float reference on the same labelled samples: the
        metric on both, its drop and its ratio to float, and their intervals under "intervals"."""
        truth = self.parsed(labels)
        quantized, floating = self.predictions(outputs), self.predictions(reference)
        metric = self.metric
        if metric.parts is not None:  # a built-in's parts, once per side: the values and the intervals read them
            tables = (self._table(quantized, truth), self._table(floating, truth))
            q, f = metric.of_parts(tables[0]), metric.of_parts(tables[1])
        else:
            tables = None
            q, f = self._score(quantized, truth), self._score(floating, truth)
        ratio = metric.ratio(q, f)
        intervals = self._intervals(quantized, floating, truth, q, f, tables)
        reported = {m.name: {"value": m.value(quantized, self.parsed_by(m, labels)),
                             "float": m.value(floating, self.parsed_by(m, labels))} for m in self.reported}
        return {"task_metric_name": metric.name, "task_metric": q, "float_task_metric": f,
                "task_metric_drop": metric.drop(q, f), "task_metric_ratio": ratio,
                "task_metric_higher_is_better": metric.higher_is_better,
                **({"reported_task_metrics": reported} if reported else {}),
                "intervals": {k: v.as_dict() for k, v in intervals.items()}}

    def _floor(self, q: float, f: float, n: int) -> dict[str, Interval]:
        """Return the least intervals n samples allow a built-in metric observed at q (float's f): a share of up to
        stats.resolvable_drop(n) of the samples (Wilson's bound for 0 of n) further moved to the metric's worst, or
        its best, value; with no sample changed (q = f) this is all the evidence there is."""
        metric = self.metric
        values = stats.floor_ends(q, n, 0.0 if metric.higher_is_better else 1.0, metric.best)
        drops = [metric.drop(v, f) for v in values]
        ratios = [metric.ratio(v, f) for v in values]

        def interval(a: float | None, b: float | None) -> Interval:
            low, high = sorted((0.0 if a is None else a, 0.0 if b is None else b))
            return Interval(low, high, n, stats.FLOORED)

        return {"task_metric": interval(*values), "task_metric_drop": interval(*drops),
                "task_metric_ratio": interval(*ratios)}

    def _intervals(self, quantized: list, floating: list, truth: list, q: float, f: float,
                   tables: tuple[np.ndarray, np.ndarray] | None) -> dict[str, Interval]:
        """Return the intervals of the metric, its drop and its ratio (see the module); q and f are the metric's
        values, tables a built-in's per-sample parts of the quantized and float predictions (Metric.table)."""
        metric, n = self.metric, len(truth)
        if metric.share:
            q_ok, f_ok = tables[0][:, 0] > 0, tables[1][:, 0] > 0
            drop = stats.difference_of_proportions(f_ok, q_ok)
            ratio = (Interval(1 - drop.high / f, 1 - drop.low / f, n, drop.method) if f > 0 else None)
            return {"task_metric": stats.wilson(int(q_ok.sum()), n), "task_metric_drop": drop,
                    **({"task_metric_ratio": ratio} if ratio is not None else {})}
        if metric.parts is not None:  # a built-in: each resample's metric from its parts' totals (one matrix product)
            rows = np.hstack(tables)

            def interval(of: Callable[[float, float], float], bounds: tuple[float, float] | None) -> Interval:
                return stats.bootstrap_of_sums(rows, lambda t: of(metric.of_totals(t[:2]), metric.of_totals(t[2:])),
                                               bounds=bounds)
        else:  # a pooled built-in (map50) pools its samples' matches, made once; a user's metric recomputes
            pooled = metric.pool is not None
            q_in, f_in = ((metric.matches(quantized, truth), metric.matches(floating, truth)) if pooled
                          else (quantized, floating))
            seen: dict[bytes, tuple[float, float]] = {}  # the three intervals draw the same resamples

            def values(idx: np.ndarray) -> tuple[float, float]:
                key = idx.tobytes()
                if key not in seen:
                    pick = [int(i) for i in idx]
                    seen[key] = ((metric.pool([q_in[i] for i in pick]), metric.pool([f_in[i] for i in pick]))
                                 if pooled else
                                 (metric.value([q_in[i] for i in pick], [truth[i] for i in pick]),
                                  metric.value([f_in[i] for i in pick], [truth[i] for i in pick])))
                return seen[key]

            def interval(of: Callable[[float, float], float], bounds: tuple[float, float] | None) -> Interval:
                return stats.bootstrap(lambda idx: of(*values(idx)), n, bounds=bounds)

        def ratio_of(q: float, f: float) -> float:
            r = metric.ratio(q, f)
            return math.nan if r is None else r

        builtin = metric.best is not None  # a built-in's range is known: [0, 1] (cer beyond 1 only on garbage)
        worst = 0.0 if metric.higher_is_better else 1.0
        top = metric.ratio(metric.best, f) if builtin else None
        booted = {"task_metric": interval(lambda q, _: q, (0.0, 1.0) if builtin else None),
                  "task_metric_drop": interval(metric.drop, (metric.drop(metric.best, f), metric.drop(worst, f))
                                               if builtin else None),
                  "task_metric_ratio": interval(ratio_of, (0.0, top) if top is not None and math.isfinite(top)
                                                else None)}
        if not builtin or n < stats.MIN_BOOTSTRAP_SAMPLES:  # a user's range is unknown; too few: the whole range
            return booted
        floor = self._floor(q, f, n)
        return {kpi: stats.hull(booted[kpi], floor[kpi]) for kpi in booted}
