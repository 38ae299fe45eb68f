"""The digits CNN with imbalanced channel ranges: the same function, hostile to 8-bit weights.

Built from ``digits_cnn`` (same training, same data, same labels): in each of the pairs conv1 → relu1 →
conv2 and conv2 → relu2 → conv3, the first ``CHANNELS`` output channels of the first layer (weights and
bias) are divided by ``SCALE`` and the matching input channels of the next layer multiplied by it. ReLU is
positively homogeneous, so the float model's outputs are unchanged (to float rounding), but each row of
conv2's and conv3's weights now holds a few values ``SCALE`` times larger than the rest: per-tensor and
per-channel 8-bit weight grids alike round the rest to a few levels, and 16-bit activations do not help.
It is the imbalance Cross-Layer Equalization was made for (Nagel et al. 2019, seen after BatchNorm folding
in MobileNets), so PTQ, the sweep and mixed precision miss the KPI and AIMET's CLE recovers it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from harness.files import write_atomically
from harness.zoo import digits_cnn
from harness.zoo.digits_cnn import INPUT_NAME, OUTPUT_NAME  # noqa: F401  (the zoo's input/output names)

NAME = "digits_imbalanced"
SCALE = 100.0
CHANNELS = 4
PAIRS = (("conv1", "conv2"), ("conv2", "conv3"))


def imbalance(model: onnx.ModelProto, scale: float = SCALE, channels: int = CHANNELS) -> onnx.ModelProto:
    """Return a copy of a digits CNN with the first `channels` of each pair in PAIRS moved by `scale`."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    arrays = {i.name: numpy_helper.to_array(i).copy() for i in out.graph.initializer}
    for first, second in PAIRS:
        arrays[f"{first}_w"][:channels] /= scale
        arrays[f"{first}_b"][:channels] /= scale
        arrays[f"{second}_w"][:, :channels] *= scale
    for init in out.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(arrays[init.name].astype(np.float32), init.name))
    out.graph.name = NAME
    out.doc_string += f"; {channels} channels per layer pair rescaled by {scale:g} (harness.zoo.{NAME})"
    return out


def build_model(out_path: Path, seed: int = 0) -> digits_cnn.TrainingSummary:
    """Train the digits CNN (deterministic) and write its imbalanced form to out_path."""
    out_path = Path(out_path)
    summary = digits_cnn.build_model(out_path, seed=seed)
    model = imbalance(onnx.load(str(out_path)))
    onnx.checker.check_model(model, full_check=True)
    write_atomically(out_path, model.SerializeToString())
    return summary
