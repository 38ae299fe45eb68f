"""Host-side reference inference and the task metric shared by the accuracy steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.cache import ArtifactCache, content_key
from harness.data import Dataset, Feed, feeds_digest
from harness.metrics import is_classifier_output, top1_accuracy, top1_agreement, cosine_similarity


def run_host(model: Path, feeds: list[Feed]) -> list[Feed]:
    """Return the outputs of model on the host's onnxruntime CPU EP, one dict per feed."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, feed))) for feed in feeds]


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


def task_metric(outputs: list[Feed], dataset: Dataset, reference: list[Feed]) -> tuple[str, float]:
    """Return (metric name, value) for outputs: top-1 accuracy with labels, else agreement with reference."""
    first = next(iter(outputs[0])) if outputs else None
    classifier = first is not None and is_classifier_output(tuple(np.shape(outputs[0][first])))
    if dataset.labelled and classifier:
        return "top1_accuracy", top1_accuracy([o[first] for o in outputs], dataset.labels)
    if classifier:
        return "top1_agreement", top1_agreement([r[first] for r in reference], [o[first] for o in outputs])
    return "cosine_similarity", cosine_similarity(stacked(reference), stacked(outputs))


def stacked(outputs: list[Feed]) -> list[np.ndarray]:
    """Return every output tensor of every sample, flattened into one list (for metrics)."""
    return [np.asarray(v) for o in outputs for v in o.values()]
