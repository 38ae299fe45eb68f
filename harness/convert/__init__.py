"""The conversion step's transforms, one module each: shapes, freezing, folding, constants, opset,
rewrites, and the equivalence check every transform must pass (harness.steps.conversion runs them)."""

from __future__ import annotations

import onnx


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return a deep copy of model (transforms never change the model they are given)."""
    clone = onnx.ModelProto()
    clone.CopyFrom(model)
    return clone
