"""A small convolutional digit classifier, trained in pure numpy and exported to ONNX.

The built-in model zoo needs at least one model whose accuracy means something:
this one is trained on real labelled data (scikit-learn's bundled ``digits``
set, 1797 grey-scale 8x8 images of the digits 0-9), so a quantised or
on-device run can be scored against ground truth and not only against the
float reference.

Network (NCHW, batch fixed at 1 in the exported graph)::

    image [1,1,8,8]
      conv1  Conv 1->16, 3x3, pad 1          -> [1,16,8,8]
      relu1
      conv2  Conv 16->32, 3x3, pad 1, stride 2 -> [1,32,4,4]
      relu2
      conv3  Conv 32->32, 3x3, pad 1         -> [1,32,4,4]
      relu3
      flatten Flatten(axis=1)                 -> [1,512]
      fc     Gemm 512->10 (transB=1)         -> logits [1,10]

Training: He-initialised weights, Adam with cosine learning-rate decay,
mini-batches of 32 with random one-pixel translations, softmax cross-entropy,
im2col-based convolutions (forward and backward) in numpy.

Training is deterministic: every array is float32, all randomness comes from
one ``np.random.default_rng(seed)``, BLAS is pinned to one thread while
training (when ``threadpoolctl`` is available), and nothing that varies from
run to run (wall time, paths, dates) is written into the ONNX file.  The same
seed and epoch count therefore produce a byte-identical model.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from harness.files import write_atomically

__all__ = [
    "DEFAULT_EPOCHS",
    "INPUT_NAME",
    "INPUT_SHAPE",
    "NUM_CLASSES",
    "OUTPUT_NAME",
    "OUTPUT_SHAPE",
    "CnnWeights",
    "LabelledSplit",
    "TrainingSummary",
    "accuracy",
    "build_model",
    "export_onnx",
    "forward",
    "load_splits",
    "train",
    "weights_from_onnx",
]

INPUT_NAME = "image"
OUTPUT_NAME = "logits"
INPUT_SHAPE: tuple[int, int, int, int] = (1, 1, 8, 8)
NUM_CLASSES = 10
OUTPUT_SHAPE: tuple[int, int] = (1, NUM_CLASSES)
OPSET = 17
IR_VERSION = 9
DEFAULT_EPOCHS = 60

EVAL_SIZE = 360
CALIBRATION_SIZE = 64
BATCH_SIZE = 32
LEARNING_RATE = 3e-3
WEIGHT_NAMES = ("conv1_w", "conv1_b", "conv2_w", "conv2_b", "conv3_w", "conv3_b", "fc_w", "fc_b")

_F32 = np.float32


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class LabelledSplit:
    """A labelled set of digit images.

    ``inputs`` is float32 of shape (N, 1, 8, 8) scaled to [0, 1] (pixel / 16);
    ``labels`` is int64 of shape (N,) with values 0..9.
    """

    inputs: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def load_splits(seed: int = 0) -> tuple[LabelledSplit, LabelledSplit, LabelledSplit]:
    """Split sklearn's digits into (train, calibration, evaluation).

    Returns three disjoint, class-stratified splits, deterministic for a given
    ``seed``: evaluation holds out 360 images (~20%), calibration is 64 images
    taken from the remaining training portion, and train is the rest (1373).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (np.asarray(digits.images, dtype=_F32) / _F32(16.0)).reshape(-1, 1, 8, 8)
    labels = np.asarray(digits.target, dtype=np.int64)
    index = np.arange(labels.shape[0])

    rest_idx, eval_idx = train_test_split(
        index, test_size=EVAL_SIZE, stratify=labels, random_state=seed
    )
    train_idx, calib_idx = train_test_split(
        rest_idx, test_size=CALIBRATION_SIZE, stratify=labels[rest_idx], random_state=seed
    )

    def split(idx: np.ndarray) -> LabelledSplit:
        idx = np.sort(idx)
        return LabelledSplit(
            inputs=np.ascontiguousarray(images[idx]), labels=np.ascontiguousarray(labels[idx])
        )

    return split(train_idx), split(calib_idx), split(eval_idx)


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class CnnWeights:
    """The network's parameters, float32, in ONNX layout.

    Conv weights are (out, in, 3, 3); ``fc_w`` is (10, 512), used with transB=1.
    """

    conv1_w: np.ndarray
    conv1_b: np.ndarray
    conv2_w: np.ndarray
    conv2_b: np.ndarray
    conv3_w: np.ndarray
    conv3_b: np.ndarray
    fc_w: np.ndarray
    fc_b: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        """Return the parameters keyed by their ONNX initializer names."""
        return {name: getattr(self, name) for name in WEIGHT_NAMES}

    @property
    def num_parameters(self) -> int:
        """Return the total number of scalar parameters."""
        return int(sum(a.size for a in self.as_dict().values()))


@dataclass(frozen=True)
class TrainingSummary:
    """What :func:`build_model` trained and wrote.

    Everything except ``wall_time_s`` is deterministic for a given seed and
    epoch count; only the deterministic fields are embedded in the ONNX file.
    """

    out_path: Path
    seed: int
    epochs: int
    train_accuracy: float
    calibration_accuracy: float
    eval_accuracy: float
    wall_time_s: float
    num_parameters: int
    final_loss: float


# (conv name, stride) in network order; every conv is 3x3 with pad 1.
_CONVS: tuple[tuple[str, int], ...] = (("conv1", 1), ("conv2", 2), ("conv3", 1))


def _init_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """He-normal initialisation for all weights, zero biases."""

    def he(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=_F32) * _F32(np.sqrt(2.0 / fan_in))

    return {
        "conv1_w": he((16, 1, 3, 3), 1 * 9),
        "conv1_b": np.zeros(16, _F32),
        "conv2_w": he((32, 16, 3, 3), 16 * 9),
        "conv2_b": np.zeros(32, _F32),
        "conv3_w": he((32, 32, 3, 3), 32 * 9),
        "conv3_b": np.zeros(32, _F32),
        "fc_w": he((NUM_CLASSES, 32 * 4 * 4), 32 * 4 * 4),
        "fc_b": np.zeros(NUM_CLASSES, _F32),
    }


def _im2col(x: np.ndarray, stride: int) -> tuple[np.ndarray, int, int]:
    """Unfold (B, C, H, W) into columns (B*OH*OW, C*9) for a 3x3, pad-1 conv.

    The column order (c, ki, kj) matches an (O, C, 3, 3) weight reshaped to (O, C*9).
    """
    b, c, h, w = x.shape
    oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.empty((b, oh, ow, c, 3, 3), dtype=x.dtype)
    for ki in range(3):
        for kj in range(3):
            patch = xp[:, :, ki : ki + stride * oh : stride, kj : kj + stride * ow : stride]
            cols[:, :, :, :, ki, kj] = patch.transpose(0, 2, 3, 1)
    return cols.reshape(b * oh * ow, c * 9), oh, ow


def _col2im(
    dcols: np.ndarray, x_shape: tuple[int, int, int, int], stride: int, oh: int, ow: int
) -> np.ndarray:
    """Fold column gradients (B*OH*OW, C*9) back onto the input (B, C, H, W)."""
    b, c, h, w = x_shape
    d = dcols.reshape(b, oh, ow, c, 3, 3)
    dxp = np.zeros((b, c, h + 2, w + 2), dtype=dcols.dtype)
    for ki in range(3):
        for kj in range(3):
            dxp[:, :, ki : ki + stride * oh : stride, kj : kj + stride * ow : stride] += d[
                :, :, :, :, ki, kj
            ].transpose(0, 3, 1, 2)
    return dxp[:, :, 1:-1, 1:-1]


def _conv_forward(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray, stride: int
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Return (output (B, O, OH, OW), columns, OH, OW) of a 3x3 pad-1 conv."""
    cols, oh, ow = _im2col(x, stride)
    out = cols @ w.reshape(w.shape[0], -1).T + bias
    out = out.reshape(x.shape[0], oh, ow, w.shape[0]).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(out), cols, oh, ow


def _forward_dict(params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    h = np.ascontiguousarray(x, dtype=_F32)
    for name, stride in _CONVS:
        h, _, _, _ = _conv_forward(h, params[f"{name}_w"], params[f"{name}_b"], stride)
        np.maximum(h, _F32(0.0), out=h)
    flat = h.reshape(h.shape[0], -1)
    return flat @ params["fc_w"].T + params["fc_b"]


def forward(weights: CnnWeights, inputs: np.ndarray) -> np.ndarray:
    """Run the network in numpy; return float32 logits of shape (N, 10) for inputs (N, 1, 8, 8)."""
    return _forward_dict(weights.as_dict(), inputs)


def accuracy(weights: CnnWeights, split: LabelledSplit) -> float:
    """Return top-1 accuracy (0..1) of the numpy forward pass on ``split``."""
    predicted = forward(weights, split.inputs).argmax(axis=1)
    return float(np.mean(predicted == split.labels))


def _loss_and_grads(
    params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray
) -> tuple[float, dict[str, np.ndarray]]:
    """Softmax cross-entropy loss (batch mean) and its gradients w.r.t. every parameter."""
    grads: dict[str, np.ndarray] = {}
    caches: list[tuple[np.ndarray, np.ndarray, tuple[int, int, int, int], int, int, int]] = []
    h = x
    for name, stride in _CONVS:
        w = params[f"{name}_w"]
        out, cols, oh, ow = _conv_forward(h, w, params[f"{name}_b"], stride)
        np.maximum(out, _F32(0.0), out=out)
        caches.append((cols, out, h.shape, stride, oh, ow))
        h = out
    flat = h.reshape(h.shape[0], -1)
    logits = flat @ params["fc_w"].T + params["fc_b"]

    batch = x.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    sum_exp = exp.sum(axis=1, keepdims=True)
    rows = np.arange(batch)
    loss = float(np.mean(np.log(sum_exp[:, 0]) - shifted[rows, y]))

    dlogits = exp / sum_exp
    dlogits[rows, y] -= _F32(1.0)
    dlogits *= _F32(1.0 / batch)

    grads["fc_w"] = dlogits.T @ flat
    grads["fc_b"] = dlogits.sum(axis=0)
    dh = (dlogits @ params["fc_w"]).reshape(h.shape)

    for (name, _), (cols, out, in_shape, stride, oh, ow) in zip(
        reversed(_CONVS), reversed(caches), strict=True
    ):
        w = params[f"{name}_w"]
        dh = dh * (out > 0)
        dout = dh.transpose(0, 2, 3, 1).reshape(-1, w.shape[0])  # (B*OH*OW, O)
        grads[f"{name}_w"] = (dout.T @ cols).reshape(w.shape)
        grads[f"{name}_b"] = dout.sum(axis=0)
        if name != _CONVS[0][0]:
            dcols = dout @ w.reshape(w.shape[0], -1)
            dh = _col2im(dcols, in_shape, stride, oh, ow)
    return loss, grads


@contextlib.contextmanager
def _single_blas_thread() -> Iterator[None]:
    """Pin BLAS to one thread so float reductions do not depend on the core count."""
    from threadpoolctl import threadpool_limits  # a declared dependency (pyproject)

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _shift_batch(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Translate each image by -1..1 pixels in each axis (zero fill): cheap augmentation."""
    shifts = rng.integers(-1, 2, size=(x.shape[0], 2))
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.empty_like(x)
    h, w = x.shape[2], x.shape[3]
    for i, (dy, dx) in enumerate(shifts):
        out[i] = xp[i, :, 1 - dy : 1 - dy + h, 1 - dx : 1 - dx + w]
    return out


def train(
    train_split: LabelledSplit,
    seed: int = 0,
    epochs: int = DEFAULT_EPOCHS,
    augment: bool = True,
) -> tuple[CnnWeights, float]:
    """Train the CNN with Adam on mini-batches, deterministically for a given seed.

    With ``augment`` each mini-batch is randomly translated by up to one pixel.
    Returns (trained weights, mean training loss of the last epoch).
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    rng = np.random.default_rng(seed)
    params = _init_weights(rng)
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    beta1, beta2, eps = _F32(0.9), _F32(0.999), _F32(1e-8)
    n = len(train_split)
    steps_per_epoch = -(-n // BATCH_SIZE)
    total_steps = epochs * steps_per_epoch
    step = 0
    last_epoch_loss = float("nan")
    with _single_blas_thread():
        for _ in range(epochs):
            order = rng.permutation(n)
            losses: list[float] = []
            for start in range(0, n, BATCH_SIZE):
                idx = order[start : start + BATCH_SIZE]
                x = train_split.inputs[idx]
                if augment:
                    x = _shift_batch(x, rng)
                loss, grads = _loss_and_grads(params, x, train_split.labels[idx])
                losses.append(loss)
                step += 1
                # Cosine decay from LEARNING_RATE to ~0 over the whole run.
                lr = LEARNING_RATE * 0.5 * (1.0 + np.cos(np.pi * (step - 1) / total_steps))
                c1 = 1.0 - 0.9**step
                c2 = 1.0 - 0.999**step
                step_size = _F32(lr * np.sqrt(c2) / c1)
                for k, g in grads.items():
                    m[k] *= beta1
                    m[k] += (_F32(1.0) - beta1) * g
                    v[k] *= beta2
                    v[k] += (_F32(1.0) - beta2) * (g * g)
                    params[k] -= step_size * m[k] / (np.sqrt(v[k]) + eps)
            last_epoch_loss = float(np.mean(losses))
    weights = CnnWeights(**{k: np.ascontiguousarray(p, dtype=_F32) for k, p in params.items()})
    return weights, last_epoch_loss


# --------------------------------------------------------------------------- ONNX


def export_onnx(
    weights: CnnWeights, out_path: Path, metadata: dict[str, str] | None = None
) -> onnx.ModelProto:
    """Write ``weights`` as an opset-17, IR-9 ONNX model to ``out_path`` atomically.

    The model has input ``image`` [1,1,8,8] and output ``logits`` [1,10], both
    float32, named nodes, and ``metadata`` as metadata_props and doc string.
    It is checked with ``onnx.checker.check_model(full_check=True)`` before it
    is written (temp file in the same directory, then ``os.replace``).
    Returns the ModelProto that was written.
    """
    metadata = dict(metadata or {})
    initializers = [numpy_helper.from_array(a, name) for name, a in weights.as_dict().items()]
    nodes = []
    prev = INPUT_NAME
    for i, (name, stride) in enumerate(_CONVS, start=1):
        nodes.append(
            helper.make_node(
                "Conv",
                [prev, f"{name}_w", f"{name}_b"],
                [f"{name}_out"],
                name=name,
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[stride, stride],
                dilations=[1, 1],
                group=1,
            )
        )
        nodes.append(helper.make_node("Relu", [f"{name}_out"], [f"relu{i}_out"], name=f"relu{i}"))
        prev = f"relu{i}_out"
    nodes.append(helper.make_node("Flatten", [prev], ["flatten_out"], name="flatten", axis=1))
    nodes.append(
        helper.make_node(
            "Gemm",
            ["flatten_out", "fc_w", "fc_b"],
            [OUTPUT_NAME],
            name="fc",
            alpha=1.0,
            beta=1.0,
            transA=0,
            transB=1,
        )
    )
    doc = "digits CNN (sklearn digits, 8x8, 10 classes) trained in numpy by harness.zoo.digits_cnn"
    if metadata:
        doc += "; " + ", ".join(f"{k}={v}" for k, v in metadata.items())
    graph = helper.make_graph(
        nodes,
        "digits_cnn",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, list(INPUT_SHAPE))],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, list(OUTPUT_SHAPE))],
        initializer=initializers,
        doc_string=doc,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="harness.zoo.digits_cnn",
        producer_version="1",
        doc_string=doc,
    )
    model.ir_version = IR_VERSION
    helper.set_model_props(model, metadata)
    model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    write_atomically(Path(out_path), model.SerializeToString())
    return model


def weights_from_onnx(model: onnx.ModelProto | Path | str) -> CnnWeights:
    """Read the initializers of an exported digits CNN back; return them as CnnWeights."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    arrays = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    return CnnWeights(**{name: np.asarray(arrays[name], dtype=_F32) for name in WEIGHT_NAMES})


def build_model(out_path: Path, seed: int = 0, epochs: int = DEFAULT_EPOCHS) -> TrainingSummary:
    """Train the digits CNN deterministically and write it to ``out_path`` as ONNX.

    Returns a TrainingSummary with train / calibration / evaluation accuracy of
    the numpy model, the epoch count, training wall time in seconds (the only
    non-deterministic field, not written into the file) and the parameter count.
    The same ``seed`` and ``epochs`` always give a byte-identical file.
    """
    out_path = Path(out_path)
    train_split, calib_split, eval_split = load_splits(seed)
    started = time.perf_counter()
    weights, final_loss = train(train_split, seed=seed, epochs=epochs)
    wall_time_s = time.perf_counter() - started
    train_acc = accuracy(weights, train_split)
    calib_acc = accuracy(weights, calib_split)
    eval_acc = accuracy(weights, eval_split)
    metadata = {
        "dataset": "sklearn.datasets.load_digits",
        "seed": str(seed),
        "epochs": str(epochs),
        "batch_size": str(BATCH_SIZE),
        "optimizer": f"adam(lr={LEARNING_RATE}, cosine decay)",
        "augmentation": "random translation by -1..1 px",
        "train_size": str(len(train_split)),
        "calibration_size": str(len(calib_split)),
        "eval_size": str(len(eval_split)),
        "train_accuracy": f"{train_acc:.6f}",
        "eval_accuracy": f"{eval_acc:.6f}",
        "num_parameters": str(weights.num_parameters),
        "input_scale": "pixel/16 -> [0, 1]",
    }
    export_onnx(weights, out_path, metadata)
    return TrainingSummary(
        out_path=out_path,
        seed=seed,
        epochs=epochs,
        train_accuracy=train_acc,
        calibration_accuracy=calib_acc,
        eval_accuracy=eval_acc,
        wall_time_s=wall_time_s,
        num_parameters=weights.num_parameters,
        final_loss=final_loss,
    )
