"""Task metrics over predictions and labels, and their ratio to the float model's (MLPerf's form).

Each built-in is a ratio of sums of per-sample parts (numerator, denominator), so a resample of the samples
(the bootstrap) is a sum of rows: top1, top5 and word_accuracy are shares of samples (a sample scores 1 or 0
of 1: their intervals are Wilson's); cer is edit operations over reference characters (Levenshtein distance by
rapidfuzz, the sum over samples divided by the reference characters, as PaddleOCR and jiwer count it); f1 is
2·TP / (2·TP + FP + FN) over samples (class 0 negative, any other class positive) or over frames,
detection_rate TP / (TP + FN) (a wake word's positives found) and false_accepts FP / (FP + TN) (its negatives
accepted; lower is better) alike; hmean the
same over text boxes matched at IoU 0.5 (harness.evaluation.detection). map50 (COCO's mAP at IoU 0.5 over layout
regions, harness.evaluation.regions) is no ratio of sums: each sample's detections are matched once (`match`) and a
resample's value pools its samples' matches (`pool`). A user's
`module.py:function` takes (predictions, labels as text) and returns the value, or one value per sample (their
mean).

The ratio to float: quantized / float for a metric where higher is better; for cer, that of its complement,
character accuracy (1 - cer); for a user's metric where lower is better, float / quantized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from harness.errors import EvaluationError
from harness.evaluation.detection import hmean_parts, parse_boxes
from harness.evaluation.regions import map50, match_regions, parse_regions
from harness.evaluation.spec import Evaluation
from harness.user_code import load_function


def _class_index(text: str) -> int:
    value = int(text.strip())
    if value < 0:
        raise ValueError(text)
    return value


def _frame_labels(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.replace(",", " ").split())
    if not values or any(v not in (0, 1) for v in values):
        raise ValueError(text)
    return values


def _ranked(prediction: Any) -> tuple[int, ...]:
    """The classes of a prediction, best first: argmax's tuple, or a user post-processing's single class."""
    return (int(prediction),) if np.ndim(prediction) == 0 else tuple(int(c) for c in prediction)


def _top(k: int) -> Callable[[Any, int], tuple[float, float]]:
    return lambda prediction, label: (float(label in _ranked(prediction)[:k]), 1.0)


def _edits(text: str, label: str) -> tuple[float, float]:
    from rapidfuzz.distance import Levenshtein

    text, label = str(text).strip(), label.strip()
    return float(Levenshtein.distance(text, label)), float(len(label))


def _exact(text: str, label: str) -> tuple[float, float]:
    return float(str(text).strip() == label.strip()), 1.0


def _f1_parts(predicted: Sequence[int], actual: Sequence[int]) -> tuple[float, float]:
    p, a = np.asarray(predicted) != 0, np.asarray(actual) != 0
    if p.shape != a.shape:
        raise EvaluationError(f"f1: the prediction has {p.size} frames, the label {a.size}")
    tp = float(np.sum(p & a))
    return 2 * tp, float(np.sum(p)) + float(np.sum(a))  # 2TP / (2TP + FP + FN): (TP+FP) + (TP+FN)


def _detection_parts(predicted: Sequence[int], actual: Sequence[int]) -> tuple[float, float]:
    p, a = np.asarray(predicted) != 0, np.asarray(actual) != 0
    if p.shape != a.shape:
        raise EvaluationError(f"detection_rate: the prediction has {p.size} frames, the label {a.size}")
    return float(np.sum(p & a)), float(np.sum(a))  # TP / (TP + FN): positives found


def _false_accept_parts(predicted: Sequence[int], actual: Sequence[int]) -> tuple[float, float]:
    p, a = np.asarray(predicted) != 0, np.asarray(actual) != 0
    if p.shape != a.shape:
        raise EvaluationError(f"false_accepts: the prediction has {p.size} frames, the label {a.size}")
    return float(np.sum(p & ~a)), float(np.sum(~a))  # FP / (FP + TN): negatives accepted


# Metrics of a binary decision (class 0 or frame 0 negative): name -> (parts, higher is better, empty value)
BINARY = {"f1": (_f1_parts, True, 1.0), "detection_rate": (_detection_parts, True, 1.0),
          "false_accepts": (_false_accept_parts, False, 0.0)}


@dataclass(frozen=True)
class Metric:
    """A task metric: its name and direction, how a label is read, and how predictions are scored."""

    name: str
    higher_is_better: bool
    parse: Callable[[str], Any]  # label text -> label; raises ValueError
    expects: str  # what a label must be, for errors
    parts: Callable[[Any, Any], tuple[float, float]] | None = None  # built-ins: one sample's (numerator, denominator)
    function: Callable[[list, list], Any] | None = None  # a user's metric over all samples
    match: Callable[[Any, Any], Any] | None = None  # pooled built-ins (map50): one sample's matches, computed once
    pool: Callable[[list], float] | None = None  # ... and the metric of a list of samples' matches
    share: bool = False  # each sample scores 1 or 0 of 1 (intervals: Wilson, Newcombe)
    empty: float = 0.0  # the value when the denominators sum to 0 (f1, hmean: 1 with nothing to find, none found)
    complement_ratio: bool = False  # ratio of 1 - value (cer: character accuracy)

    def table(self, predictions: list, labels: list) -> np.ndarray:
        """Return the (samples, 2) per-sample parts of a built-in metric."""
        return np.array([self.parts(p, y) for p, y in zip(predictions, labels)], dtype=np.float64).reshape(-1, 2)

    def matches(self, predictions: list, labels: list) -> list:
        """Return each sample's matches of a pooled built-in (map50)."""
        return [self.match(p, y) for p, y in zip(predictions, labels)]

    def of_parts(self, rows: np.ndarray) -> float:
        """Return the metric of samples whose parts are rows."""
        return self.of_totals(rows.sum(axis=0) if len(rows) else np.zeros(2))

    def of_totals(self, totals: np.ndarray) -> float:
        """Return the metric of samples whose parts add up to totals (numerator, denominator)."""
        numerator, denominator = totals
        return float(numerator / denominator) if denominator else self.empty

    def value(self, predictions: list, labels: list) -> float:
        """Return the metric over the samples."""
        if self.parts is not None:
            return self.of_parts(self.table(predictions, labels))
        if self.pool is not None:
            return self.pool(self.matches(predictions, labels))
        returned = self.function(list(predictions), list(labels))
        values = np.asarray(returned, dtype=np.float64)
        return float(values.mean()) if values.ndim else float(values)

    def ratio(self, quantized: float, reference: float) -> float | None:
        """Return the quantized metric as a share of the float one (None when float's is 0, where no share is)."""
        if self.complement_ratio:
            quantized, reference = 1.0 - quantized, 1.0 - reference
        elif not self.higher_is_better:
            quantized, reference = reference, quantized
        if reference == 0:
            return 1.0 if quantized == 0 else None
        return max(quantized, 0.0) / reference

    def drop(self, quantized: float, reference: float) -> float:
        """Return how much worse the quantized metric is than the float one (negative: better)."""
        return reference - quantized if self.higher_is_better else quantized - reference

    @property
    def best(self) -> float | None:
        """The best value the metric can take (None when unknown: a user's)."""
        if self.function is not None:
            return None
        return 1.0 if self.higher_is_better else 0.0


BUILTIN: dict[str, Metric] = {
    "top1": Metric("top1", True, _class_index, "a class index (an integer >= 0)", _top(1), share=True),
    "top5": Metric("top5", True, _class_index, "a class index (an integer >= 0)", _top(5), share=True),
    "cer": Metric("cer", False, str, "a text line", _edits, complement_ratio=True),
    "word_accuracy": Metric("word_accuracy", True, str, "a text line", _exact, share=True),
    "hmean": Metric("hmean", True, parse_boxes, "boxes of 8 numbers x1 y1 ... x4 y4, separated by ';'", hmean_parts,
                    empty=1.0),
    "map50": Metric("map50", True, parse_regions, "regions of 5 numbers class x0 y0 x1 y1, separated by ';'",
                    match=match_regions, pool=map50),
}


def metric_for(evaluation: Evaluation, name: str | None = None) -> Metric:
    """Return the metric an evaluation names, or the built-in `name` (f1 reads frames after `frames`, else
    classes)."""
    name = name or evaluation.metric
    if name in BUILTIN:
        return BUILTIN[name]
    if name in BINARY:
        parts, higher, empty = BINARY[name]
        if evaluation.postprocess == "frames":
            return Metric(name, higher, _frame_labels, "0/1 per frame, separated by spaces", parts, empty=empty)
        return Metric(name, higher, _class_index, "a class index (0 negative, any other positive)",
                      lambda prediction, label: parts(_ranked(prediction)[:1], [label]), empty=empty)
    function = load_function(evaluation.metric, "evaluation.metric")
    name = evaluation.metric.rpartition(":")[2]
    return Metric(name, evaluation.higher_is_better is not False, str, "text", function=function)
