"""The model's ONNX opset, raised for 16-bit quantization.

onnxruntime's QNN quantization (get_qnn_qdq_config) writes 16-bit QuantizeLinear/DequantizeLinear in
the com.microsoft domain when the model's opset is below 21 (and quantize_static alone converts the
model to opset 21 unchecked, with a warning). The sweep and mixed precision quantize activations to
16 bits, so the conversion raises the opset to 21 once, with onnx.version_converter, and checks it
like every other transform; opset 21 also lets qnn_preprocess_model fuse LayerNormalization (>= 17).
"""

from __future__ import annotations

import onnx

QDQ_16BIT_OPSET = 21


def opset_of(model: onnx.ModelProto) -> int:
    """Return the model's default-domain (ai.onnx) opset version."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def raise_opset(model: onnx.ModelProto, target: int = QDQ_16BIT_OPSET) -> onnx.ModelProto:
    """Return the model converted to opset `target` (the model itself when already there);
    raises onnx's error when its version converter cannot convert a node."""
    if opset_of(model) >= target:
        return model
    return onnx.version_converter.convert_version(model, target)
