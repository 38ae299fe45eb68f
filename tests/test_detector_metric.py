"""A detector with one probability per sample is scored by decision agreement at 0.5, and a data set
without positives is named; wake-word calibration windows get positives from espeak-ng when it is there."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from harness.data import Dataset
from harness.steps.inference import reference_warning, run_host, stacked, task_metric
from real_models_helpers import real_model_path


def sigmoid_head(path, bias: float):
    """x[1, 4] -> MatMul -> + bias -> Sigmoid -> p[1, 1]: a detector's probability."""
    w = numpy_helper.from_array(np.full((4, 1), 1.0, np.float32), "w")
    b = numpy_helper.from_array(np.array([bias], np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Sigmoid", ["a"], ["p"])], "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 1])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def feeds(sums):
    return [{"x": np.full((1, 4), s / 4, np.float32)} for s in sums]


def test_a_sigmoid_detector_is_scored_by_decision_agreement(tmp_path):
    data = feeds([-6, -0.5, 0.2, 6])  # sigmoid: 0.0025, 0.38, 0.55, 0.9975
    reference = run_host(sigmoid_head(tmp_path / "a.onnx", 0.0), data)
    shifted = run_host(sigmoid_head(tmp_path / "b.onnx", -0.3), data)  # 0.2 - 0.3 < 0: the third flips
    dataset = Dataset(data, data)
    assert task_metric(reference, dataset, reference) == ("decision_agreement", 1.0)
    assert task_metric(shifted, dataset, reference) == ("decision_agreement", pytest.approx(0.75))
    assert reference_warning(reference) is None


def test_a_reference_without_positives_is_named(tmp_path):
    data = feeds([-9, -7, -5])
    reference = run_host(sigmoid_head(tmp_path / "a.onnx", 0.0), data)
    warning = reference_warning(reference)
    assert warning is not None and "output 'p' is a probability below 0.5 on every sample" in warning
    assert "no positive" in warning


def test_maps_and_logits_keep_the_cosine(tmp_path):
    logits = [{"y": np.array([[3.0]], np.float32)}, {"y": np.array([[-2.0]], np.float32)}]  # not in [0, 1]
    maps = [{"m": np.full((1, 1, 4, 4), 0.2, np.float32)}]  # a probability map, not one value
    for ref in (logits, maps):
        assert task_metric(ref, Dataset([], []), ref)[0] == "cosine_similarity"
        assert reference_warning(ref) is None


def test_integer_outputs_copied_from_the_inputs_are_not_judged():
    """A BERT export that also returns its int64 ids: the metrics judge its embedding, not the copied ids (which took
    the first place as a 32-class 'classifier' agreeing on every sample, and outweighed the embedding in the cosine)."""
    ids = np.array([[101, 2023, 30000, 102]], np.int64)
    reference = [{"output": ids, "embedding": np.array([[[1.0, 0.0], [0.0, 1.0]]], np.float32)}]  # token embeddings
    quantized = [{"output": ids, "embedding": np.array([[[0.0, 1.0], [1.0, 0.0]]], np.float32)}]  # orthogonal: lost
    assert task_metric(quantized, Dataset([], []), reference) == ("cosine_similarity", 0.0)
    assert [a.dtype for a in stacked(quantized)] == [np.float32]
    only_ids = [{"output": ids}]  # nothing floating-point: the integer outputs are what there is to judge
    assert [a.dtype for a in stacked(only_ids)] == [np.int64]
    device = [{"output": ids.astype(np.float32), "embedding": quantized[0]["embedding"]}]  # ids come back as float
    assert [a.dtype for a in stacked(device, reference)] == [np.float32] and len(stacked(device, reference)) == 1


@pytest.mark.real_models
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_spoken_wake_word_windows_wake_the_real_head():
    from harness.corpus_data import DataRequest, _cpu_session, embedding_windows

    models = {n: real_model_path(n) for n in ("melspectrogram", "embedding_model")}
    made = embedding_windows(DataRequest("hey_jarvis", {"x.1": (1, 16, 96)}, 6, models, "hey jarvis"))
    assert "3 of them end 0-0.3 s after 'hey jarvis' spoken by espeak-ng" in made.description
    head = _cpu_session(real_model_path("hey_jarvis"))
    probs = [head.run(None, {"x.1": x})[0].item() for x in made.arrays["x.1"]]
    assert max(probs[1::2]) >= 0.9  # a spoken phrase wakes it
    assert max(probs[0::2]) < 0.5  # synthetic audio does not
