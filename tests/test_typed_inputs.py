"""Inputs of every type (issue 22 item 5): a small text encoder with int64 token ids, an int32 segment input, a
bool padding mask and external weights (model.onnx + model.onnx.data) goes through random calibration data (ids
within the embedding's vocabulary, masks with padding), conversion, 8-bit QDQ generation and the device runner
on the HTP simulator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from harness.data import input_infos, random_dataset
from harness.models import ModelSpec
from harness.steps import conversion
from harness.steps.ptq import QuantRecipe, quantize

VOCAB, SEGMENTS, LENGTH, WIDTH = 3000, 2, 16, 32


def tiny_encoder(directory: Path) -> Path:
    """ids [1, L] int64 -> Gather(embedding [VOCAB, W]) + Gather(segments [2, W]) by an int32 input; a bool mask
    zeroes padded positions; mean over the valid ones -> MatMul -> [1, 4]. Weights in model.onnx.data."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((VOCAB, WIDTH)).astype(np.float32), "embedding"),
             numpy_helper.from_array(rng.standard_normal((SEGMENTS, WIDTH)).astype(np.float32), "segment_table"),
             numpy_helper.from_array(rng.standard_normal((WIDTH, 4)).astype(np.float32), "head"),
             numpy_helper.from_array(np.array([-1], np.int64), "last_axis"),
             numpy_helper.from_array(np.array([1], np.int64), "seq_axis")]
    nodes = [helper.make_node("Gather", ["embedding", "input_ids"], ["tok"], name="embed_tokens"),
             helper.make_node("Gather", ["segment_table", "segment_ids"], ["seg"], name="embed_segments"),
             helper.make_node("Add", ["tok", "seg"], ["emb"], name="add_segments"),
             helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT, name="mask_float"),
             helper.make_node("Unsqueeze", ["maskf", "last_axis"], ["mask3"], name="mask_unsqueeze"),
             helper.make_node("Mul", ["emb", "mask3"], ["masked"], name="apply_mask"),
             helper.make_node("ReduceSum", ["masked", "seq_axis"], ["summed"], keepdims=0, name="sum_tokens"),
             helper.make_node("ReduceSum", ["maskf", "seq_axis"], ["count"], keepdims=1, name="count_tokens"),
             helper.make_node("Div", ["summed", "count"], ["pooled"], name="mean_tokens"),
             helper.make_node("MatMul", ["pooled", "head"], ["logits"], name="head")]
    graph = helper.make_graph(nodes, "tiny_encoder",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
                               helper.make_tensor_value_info("segment_ids", TensorProto.INT32, ["batch", "seq"]),
                               helper.make_tensor_value_info("attention_mask", TensorProto.BOOL, ["batch", "seq"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data",
              size_threshold=1024)
    assert (directory / "model.onnx.data").stat().st_size >= VOCAB * WIDTH * 4
    return path


def test_ids_masks_and_external_weights_go_through_calibration_conversion_qdq_and_the_htp(tmp_path, cache,
                                                                                           sm8650_runner):
    path = tiny_encoder(tmp_path / "encoder")
    spec = ModelSpec(name="tiny_encoder", source=str(path), path=path,
                     input_shapes={"input_ids": (1, LENGTH), "segment_ids": (1, LENGTH), "attention_mask": (1, LENGTH)})
    fixed = conversion.fixed_shape_model(path, spec, cache)
    report = conversion.convert(path, fixed, spec, cache)
    assert report.passed, report.problems()
    converted = report.artifacts["model"]

    infos = {i.name: i for i in input_infos(onnx.load(str(converted), load_external_data=False))}
    assert (infos["input_ids"].high, infos["input_ids"].vocabulary_of) == (VOCAB, "embedding")
    assert (infos["segment_ids"].high, infos["segment_ids"].vocabulary_of) == (SEGMENTS, "segment_table")
    assert infos["attention_mask"].mask
    data = random_dataset(list(infos.values()), "tiny_encoder", n_calib=8, n_eval=8)
    ids = np.stack([f["input_ids"] for f in data.calibration])
    masks = np.stack([f["attention_mask"] for f in data.calibration])
    assert ids.dtype == np.int64 and ids.max() < VOCAB and len(np.unique(ids)) > 50  # spread over the vocabulary
    assert masks.dtype == np.bool_ and masks[..., 0].all() and not masks.all()  # some padding, never all of it
    assert "'input_ids' ids in [0, 3000) (the rows of 'embedding')" in data.description

    qdq = quantize(converted, data.calibration, QuantRecipe(), cache)
    feeds = data.evaluation[:4]
    import onnxruntime as ort

    reference = ort.InferenceSession(str(converted), providers=["CPUExecutionProvider"])
    expected = [reference.run(None, feed)[0] for feed in feeds]
    for model in (converted, qdq):
        run = sm8650_runner.run(model, feeds, "htp")  # CPU fallback disabled: every node on the HTP
        got = [out["logits"] for out in run.outputs]
        cosine = min(float(np.dot(g.ravel(), e.ravel()) / (np.linalg.norm(g) * np.linalg.norm(e)))
                     for g, e in zip(got, expected))
        assert cosine > (0.999 if model == converted else 0.98), f"{model}: cosine {cosine:.4f} with the CPU"


def test_an_integer_input_float32_would_round_is_named(tmp_path):
    import pytest

    from harness.errors import ConfigError
    from harness.runner.base import write_input_list

    write_input_list([{"input_ids": np.array([[2 ** 24]], np.int64)}], tmp_path / "ok")  # exact in float32
    with pytest.raises(ConfigError, match=r"input 'input_ids' \(sample 1, int64\) holds 33554433: inputs travel to "
                                          r"the device runner as float32"):
        write_input_list([{"input_ids": np.array([[1]], np.int64)},
                          {"input_ids": np.array([[2 ** 25 + 1]], np.int64)}], tmp_path / "big")


def test_conversion_checks_ids_across_the_vocabulary_and_padded_masks(tmp_path):
    from harness.convert.equivalence import check_feeds
    from harness.models import fix_input_shapes

    model = onnx.load(str(tiny_encoder(tmp_path / "encoder")))
    fixed = fix_input_shapes(model, {"input_ids": (1, LENGTH), "segment_ids": (1, LENGTH),
                                     "attention_mask": (1, LENGTH)}, "tiny_encoder")
    feeds = check_feeds(fixed, "tiny_encoder", count=4)
    ids = np.stack([f["input_ids"] for f in feeds])
    assert ids.max() > 1 and ids.max() < VOCAB  # no longer only rows 0 and 1 of the embedding
    assert all(f["attention_mask"][0, 0] for f in feeds) and feeds[0]["segment_ids"].dtype == np.int32
