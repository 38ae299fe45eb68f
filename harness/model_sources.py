"""Where a model under test and its data come from: the zoo (built and cached) or the user."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx

from harness.cache import ArtifactCache
from harness.data import DESCRIPTION_FILE, Dataset, InputInfo, input_infos, random_dataset, user_dataset
from harness.evaluation.datasets import labelled_samples
from harness.llm.export import export_pair
from harness.models import LlmFiles, ModelSpec
from harness.zoo import digits_cnn, digits_imbalanced

ZOO_SEED = 0


def source_model(spec: ModelSpec, cache: ArtifactCache) -> Path:
    """Return the ONNX file for spec, building and caching a zoo model on first use."""
    if not spec.is_zoo:
        return spec.path
    return _zoo_entry(spec, cache) / "model.onnx"


def _zoo_entry(spec: ModelSpec, cache: ArtifactCache) -> Path:
    """Return the cache directory holding the zoo model and its data splits (built on first use)."""
    def build(out: Path) -> None:
        builder = digits_imbalanced if spec.name == digits_imbalanced.NAME else digits_cnn  # same data and labels
        builder.build_model(out / "model.onnx", seed=ZOO_SEED)
        _, calib, evaluation = digits_cnn.load_splits(seed=ZOO_SEED)
        np.savez(out / "splits.npz", calib_inputs=calib.inputs, eval_inputs=evaluation.inputs,
                 eval_labels=evaluation.labels)

    return cache.entry(f"zoo/{spec.name}", f"seed{ZOO_SEED}-v1", build).path


def llm_files(spec: ModelSpec, cache: ArtifactCache) -> LlmFiles:
    """Return a kind-llm model's files: the spec's, or the built-in model's (trained, exported and cached on
    first use: tokenizer.json, weights.npz, prefill.onnx, decode.onnx, train.txt, heldout.txt, prompts.json)."""
    if not spec.is_zoo:
        return spec.llm

    def build(out: Path) -> None:
        from harness.zoo import tiny_gpt

        tiny_gpt.build_bundle(out, seed=ZOO_SEED)
        export_pair(tiny_gpt.load_weights(out / "weights.npz"), out)
        (out / "train.txt").write_text(tiny_gpt.text_splits()[0], encoding="utf-8")

    from harness.zoo import tiny_gpt

    entry = cache.entry(f"zoo/{spec.name}", f"seed{ZOO_SEED}-v2", build).path  # v2: 16 prompts

    return LlmFiles(prefill=entry / "prefill.onnx", decode=entry / "decode.onnx", tokenizer=entry / "tokenizer.json",
                    eval_text=entry / "heldout.txt", calib_text=entry / "train.txt",
                    prompts=tuple(json.loads((entry / "prompts.json").read_text())), max_new_tokens=16,
                    stop_token=tiny_gpt.EOT_TOKEN)


def dataset_for(spec: ModelSpec, fixed_model: Path, cache: ArtifactCache) -> Dataset:
    """Return calibration and evaluation data for spec (labelled for the zoo)."""
    if spec.is_zoo and spec.calib_data is None:
        with np.load(_zoo_entry(spec, cache) / "splits.npz") as splits:
            calib, evaluation, labels = splits["calib_inputs"], splits["eval_inputs"], splits["eval_labels"]
        return Dataset(calibration=[{"image": x[None]} for x in calib],
                       evaluation=[{"image": x[None]} for x in evaluation], labels=labels,
                       description=f"scikit-learn digits: {len(calib)} calibration images, "
                                   f"{len(evaluation)} held-out labelled evaluation images")
    infos = input_infos(onnx.load(str(fixed_model), load_external_data=False))
    if spec.evaluation is not None:
        return _labelled_dataset(spec, infos)
    if spec.calib_data is not None:
        return user_dataset(spec.calib_data, infos)
    return random_dataset(infos, seed_text=spec.name)


def _labelled_dataset(spec: ModelSpec, infos: list[InputInfo]) -> Dataset:
    """Return the spec's labelled evaluation samples with its task evaluation, calibrated on its calib_data (else
    on the evaluation samples themselves, which the description says)."""
    evaluation = spec.evaluation
    feeds, labels, task = labelled_samples(evaluation, infos)
    what = (f"{len(feeds)} labelled samples from {evaluation.data} ({evaluation.layout} labels; {evaluation.metric} after "
            f"{evaluation.postprocess})")
    about = evaluation.data / DESCRIPTION_FILE
    if about.is_file():
        what += f": {about.read_text().strip()}"
    if spec.calib_data is not None:
        calibration = user_dataset(spec.calib_data, infos)
        return Dataset(calibration.calibration, feeds, np.asarray(labels), task=task,
                       description=f"calibration: {calibration.description}; evaluation: {what}")
    return Dataset(feeds, feeds, np.asarray(labels), task=task,
                   description=f"{what}; calibrated on the same samples (no calib_data)",
                   warnings=["no calib_data: calibrated on the labelled evaluation samples"])
