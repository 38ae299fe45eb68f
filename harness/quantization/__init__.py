"""Quantization: calibration feeds for onnxruntime, QAIRT/AIMET encodings (parsing, onnxruntime tensor overrides,
export)."""
