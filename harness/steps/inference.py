"""Host-side reference inference and the task metric shared by the accuracy steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.cache import ArtifactCache, content_key
from harness.data import Dataset, Feed, feeds_digest
from harness.errors import StepError
from harness.host_sessions import host_session_options
from harness.kpi import Limit
from harness.metrics import DECISION_THRESHOLD, cosine_similarity, is_classifier_output, is_probability_output, top1
from harness.models import Thresholds


def run_host(model: Path, feeds: list[Feed]) -> list[Feed]:
    """Return the outputs of model on the host's onnxruntime CPU EP, one dict per feed."""
    import onnxruntime as ort

    so = host_session_options()
    session = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, feed))) for feed in feeds]


def host_qdq_run(model: Path, feeds: list[Feed], names: list[str] | None = None, threads: int = 0) -> list[Feed]:
    """Return the named outputs (all by default) of a QDQ model on the host's QDQ emulation: onnxruntime's
    CPU EP with graph optimizations off, so every QuantizeLinear/DequantizeLinear pair runs as written.
    Raises StepError naming the model."""
    import onnxruntime as ort

    so = host_session_options()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = threads
    try:
        session = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
        names = names or [o.name for o in session.get_outputs()]
        return [dict(zip(names, session.run(names, feed))) for feed in feeds]
    except Exception as e:  # onnxruntime raises its own exception types
        raise StepError(f"host QDQ run of {model.name} failed: {type(e).__name__}: {e}") from None


def host_reference(model: Path, feeds: list[Feed], cache: ArtifactCache) -> list[Feed]:
    """Return the cached host CPU outputs of model on feeds."""
    key = content_key("host-ref-v1", model, feeds_digest(feeds))

    def build(out: Path) -> None:
        outputs = run_host(model, feeds)
        np.savez(out / "outputs.npz", **{f"{i}::{n}": v for i, o in enumerate(outputs) for n, v in o.items()})

    path = cache.entry("host_reference", key, build).path / "outputs.npz"
    with np.load(path) as data:
        result: list[Feed] = [{} for _ in feeds]
        for k in data.files:
            i, name = k.split("::", 1)
            result[int(i)][name] = data[k]
    return result


def accuracy_limits(thresholds: Thresholds, sqnr: bool = True) -> list[Limit]:
    """Return the model's accuracy KPI rules (PTQ's, the recovery candidates', Step 7's without SQNR): the task
    metric's ratio to float and drop, cosine similarity and SQNR, each where its threshold is set."""
    rules = [("task_metric_ratio", thresholds.min_task_metric_ratio, None),
             ("task_metric_drop", None, thresholds.max_task_metric_drop),
             ("cosine_similarity", thresholds.min_cosine_similarity, None),
             ("sqnr_db", thresholds.min_sqnr_db if sqnr else None, None)]
    return [Limit(kpi, minimum=low, maximum=high) for kpi, low, high in rules if low is not None or high is not None]


def task_outcomes(outputs: list[Feed], dataset: Dataset, reference: list[Feed]) -> tuple[str, np.ndarray | None]:
    """Return the task metric's name and its per-sample outcomes (True: correct / agreeing), which the metric is
    the share of: for a classifier top-1 correct with labels, else top-1 agreement with reference; for a detector
    (one probability per sample) the same side of 0.5 as the reference; else ('cosine_similarity', None). Judged on
    the floating-point outputs (see judged)."""
    outputs, reference = judged(outputs, reference), judged(reference)
    first = next(iter(outputs[0])) if outputs else None
    classifier = first is not None and is_classifier_output(tuple(np.shape(outputs[0][first])))
    if dataset.labelled and classifier:
        return "top1_accuracy", np.array([top1(o[first]) == int(y) for o, y in zip(outputs, dataset.labels)])
    if classifier:
        return "top1_agreement", np.array([top1(r[first]) == top1(o[first]) for r, o in zip(reference, outputs)])
    if first is not None and is_probability_output([r[first] for r in reference]):
        return "decision_agreement", np.array([(float(np.ravel(r[first])[0]) >= DECISION_THRESHOLD)
                                               == (float(np.ravel(o[first])[0]) >= DECISION_THRESHOLD)
                                               for r, o in zip(reference, outputs)])
    return "cosine_similarity", None


def task_metric(outputs: list[Feed], dataset: Dataset, reference: list[Feed]) -> tuple[str, float]:
    """Return (metric name, value) for outputs: the share of task_outcomes that hold (top-1 accuracy with
    labels, else top-1 or decision agreement with reference), else the cosine similarity to reference; with the
    model spec's evaluation section, its metric on its labels."""
    if dataset.task is not None:
        return dataset.task.metric.name, dataset.task.value(outputs, dataset.labels)
    name, outcomes = task_outcomes(outputs, dataset, reference)
    if outcomes is None:
        return name, cosine_similarity(stacked(reference), stacked(outputs, reference))
    return name, float(np.mean(outcomes)) if len(outcomes) else 0.0


def reference_warning(reference: list[Feed]) -> str | None:
    """Return a warning when the float reference of a detector (one probability per sample) never
    reaches the decision threshold: the data set holds no positive, so agreement and cosine say little."""
    first = next(iter(reference[0])) if reference else None
    if first is None or not is_probability_output([r[first] for r in reference]):
        return None
    highest = max(float(np.ravel(r[first])[0]) for r in reference)
    if highest >= DECISION_THRESHOLD:
        return None
    return (f"output '{first}' is a probability below {DECISION_THRESHOLD} on every sample (at most {highest:.3g}): "
            "the data set holds no positive, so decision agreement only shows that the quantized model stays "
            "negative, and the cosine/SQNR of near-zero probabilities measure rounding; calibrate with positives")


def judged(outputs: list[Feed], like: list[Feed] | None = None) -> list[Feed]:
    """Return outputs with only the tensors that are floating-point in like (default: outputs), the ones quantization
    changes: an integer or bool output (a BERT export's copy of its token ids or mask) is not quantized, and judging on
    it would hide what changed (a copied id sequence taken for a classifier's scores, ids of 30000 outweighing
    embeddings in the cosine); outputs as they are when none is floating-point. Pass the float reference as like, so
    the device's outputs (which may come back as float) keep the same tensors."""
    like = like or outputs
    if not outputs or not like:
        return outputs
    floats = [k for k, v in like[0].items() if np.issubdtype(np.asarray(v).dtype, np.floating)]
    if not floats or len(floats) == len(like[0]):
        return outputs
    return [{k: o[k] for k in floats if k in o} for o in outputs]


def stacked(outputs: list[Feed], like: list[Feed] | None = None) -> list[np.ndarray]:
    """Return every output tensor of every sample that is floating-point in like (see judged), flattened into one
    list (for metrics)."""
    return [np.asarray(v) for o in judged(outputs, like) for v in o.values()]
