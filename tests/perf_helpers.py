"""Helpers for the compilation, profiling and runtime tests: a tiny quantized model and feeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.cache import ArtifactCache
from harness.data import Feed
from harness.steps.ptq import QuantRecipe, quantize
from model_builders import conv_classifier


def random_feeds(n: int, seed: int = 0) -> list[Feed]:
    """n deterministic feeds for conv_classifier's input [1, 3, 8, 8]."""
    rng = np.random.default_rng(seed)
    return [{"input": rng.random((1, 3, 8, 8), dtype=np.float32)} for _ in range(n)]


def tiny_qdq_model(directory: Path, cache: ArtifactCache) -> Path:
    """conv_classifier quantized to a QDQ model with the default recipe (cached by content)."""
    float_model = conv_classifier(directory / "clf.onnx")
    return quantize(float_model, random_feeds(8, seed=1), QuantRecipe(), cache)
