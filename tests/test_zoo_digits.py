"""Tests for the model zoo's numpy-trained digits CNN (harness.zoo.digits_cnn)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import harness.files
from harness.zoo import digits_cnn
from harness.zoo.digits_cnn import (
    INPUT_NAME,
    INPUT_SHAPE,
    OUTPUT_NAME,
    OUTPUT_SHAPE,
    LabelledSplit,
    TrainingSummary,
    build_model,
    forward,
    load_splits,
    weights_from_onnx,
)

SEED = 0


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> TrainingSummary:
    out = tmp_path_factory.mktemp("zoo") / "digits_cnn.onnx"
    return build_model(out, seed=SEED)


@pytest.fixture(scope="module")
def splits() -> tuple[LabelledSplit, LabelledSplit, LabelledSplit]:
    return load_splits(SEED)


@pytest.fixture(scope="module")
def session(built: TrainingSummary) -> ort.InferenceSession:
    return ort.InferenceSession(str(built.out_path), providers=["CPUExecutionProvider"])


def _rows(split: LabelledSplit) -> set[bytes]:
    return {img.tobytes() for img in split.inputs}


def test_splits_shapes_and_dtypes(splits: tuple[LabelledSplit, ...]) -> None:
    train, calib, evaluation = splits
    assert (len(train), len(calib), len(evaluation)) == (1373, 64, 360)
    for split in splits:
        assert split.inputs.dtype == np.float32
        assert split.inputs.shape[1:] == (1, 8, 8)
        assert split.labels.dtype == np.int64
        assert split.labels.shape == (split.inputs.shape[0],)
        assert split.inputs.min() >= 0.0 and split.inputs.max() <= 1.0
        # stratified: every class is present in every split
        assert set(np.unique(split.labels)) == set(range(10))


def test_splits_disjoint_and_deterministic(splits: tuple[LabelledSplit, ...]) -> None:
    from sklearn.datasets import load_digits

    train, calib, evaluation = splits
    # sklearn's digits has no duplicate images, so image bytes identify the source row
    full = (load_digits().images.astype(np.float32) / np.float32(16)).reshape(-1, 1, 8, 8)
    full_rows = _rows(LabelledSplit(full, np.zeros(full.shape[0], np.int64)))
    assert len(full_rows) == full.shape[0]
    tr, ca, ev = _rows(train), _rows(calib), _rows(evaluation)
    assert (len(tr), len(ca), len(ev)) == (len(train), len(calib), len(evaluation))
    assert not (tr & ca) and not (tr & ev) and not (ca & ev)
    assert tr | ca | ev == full_rows

    again = load_splits(SEED)
    for a, b in zip(splits, again, strict=True):
        np.testing.assert_array_equal(a.inputs, b.inputs)
        np.testing.assert_array_equal(a.labels, b.labels)
    assert _rows(load_splits(SEED + 1)[2]) != ev


def test_summary(built: TrainingSummary) -> None:
    assert built.out_path.is_file()
    assert built.seed == SEED
    assert built.epochs == digits_cnn.DEFAULT_EPOCHS
    assert built.num_parameters == 160 + 4640 + 9248 + 5130
    assert built.eval_accuracy >= 0.95
    assert built.train_accuracy >= built.eval_accuracy - 0.05
    assert built.wall_time_s > 0
    # no temp files left next to the model
    assert [p.name for p in built.out_path.parent.iterdir()] == [built.out_path.name]


def test_model_structure(built: TrainingSummary, session: ort.InferenceSession) -> None:
    model = onnx.load(str(built.out_path))
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 9
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]

    def dims(value_info: onnx.ValueInfoProto) -> tuple[int, ...]:
        return tuple(d.dim_value for d in value_info.type.tensor_type.shape.dim)

    (inp,) = model.graph.input
    (out,) = model.graph.output
    assert inp.name == INPUT_NAME and dims(inp) == INPUT_SHAPE == (1, 1, 8, 8)
    assert out.name == OUTPUT_NAME and dims(out) == OUTPUT_SHAPE == (1, 10)
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT

    names = [n.name for n in model.graph.node]
    ops = [n.op_type for n in model.graph.node]
    assert names == ["conv1", "relu1", "conv2", "relu2", "conv3", "relu3", "flatten", "fc"]
    assert ops == ["Conv", "Relu", "Conv", "Relu", "Conv", "Relu", "Flatten", "Gemm"]
    strides = {
        n.name: list(next(a.ints for a in n.attribute if a.name == "strides"))
        for n in model.graph.node
        if n.op_type == "Conv"
    }
    assert strides == {"conv1": [1, 1], "conv2": [2, 2], "conv3": [1, 1]}

    props = {p.key: p.value for p in model.metadata_props}
    assert props["seed"] == str(SEED)
    assert float(props["eval_accuracy"]) == pytest.approx(built.eval_accuracy, abs=1e-6)
    assert "eval_accuracy" in model.graph.doc_string

    (i,) = session.get_inputs()
    (o,) = session.get_outputs()
    assert (i.name, tuple(i.shape), i.type) == (INPUT_NAME, (1, 1, 8, 8), "tensor(float)")
    assert (o.name, tuple(o.shape), o.type) == (OUTPUT_NAME, (1, 10), "tensor(float)")


def test_onnxruntime_accuracy_and_parity(
    built: TrainingSummary,
    session: ort.InferenceSession,
    splits: tuple[LabelledSplit, ...],
) -> None:
    evaluation = splits[2]
    weights = weights_from_onnx(built.out_path)
    reference = forward(weights, evaluation.inputs)
    outputs = np.stack(
        [
            session.run([OUTPUT_NAME], {INPUT_NAME: evaluation.inputs[i : i + 1]})[0][0]
            for i in range(len(evaluation))
        ]
    )
    assert outputs.dtype == np.float32 and outputs.shape == (len(evaluation), 10)
    assert float(np.max(np.abs(outputs - reference))) < 1e-4
    ort_accuracy = float(np.mean(outputs.argmax(axis=1) == evaluation.labels))
    assert ort_accuracy >= 0.95
    assert ort_accuracy == pytest.approx(built.eval_accuracy, abs=1 / len(evaluation))


def test_export_is_atomic_on_failure(
    built: TrainingSummary, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed write leaves neither the target nor a temp file behind."""
    weights = weights_from_onnx(built.out_path)

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(harness.files.os, "replace", boom)
    target = tmp_path / "sub" / "model.onnx"
    with pytest.raises(OSError, match="disk full"):
        digits_cnn.export_onnx(weights, target)
    assert list((tmp_path / "sub").iterdir()) == []


@pytest.mark.slow  # trains a second time (~6 s); deselect with -m "not slow"
def test_same_seed_gives_identical_bytes(built: TrainingSummary, tmp_path: Path) -> None:
    again = build_model(tmp_path / "again.onnx", seed=SEED)
    assert again.eval_accuracy == built.eval_accuracy
    assert again.out_path.read_bytes() == built.out_path.read_bytes()
