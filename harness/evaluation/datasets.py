"""Labelled evaluation data: a folder of samples and their labels in one of the layouts of
harness.evaluation.layouts (a CSV file,label; class folders; ICDAR gt files; a COCO JSON).

A sample file is a .npy (single-input models) or an .npz keyed by input name, holding one sample (the input's
shape, or (1, *shape)), or an image the section's `image:` turns into the input (harness.evaluation.images; box
labels, in the image's pixels, are then scaled to the input's). Every label must name a sample file of the
folder, every sample file of the folder must have a label, and every label must read as the metric reads it;
each error names the labels file and line (or entry), or the folder and the files.
"""

from __future__ import annotations

from pathlib import Path

from harness.data import Feed, InputInfo, load_feeds_file
from harness.errors import EvaluationError
from harness.evaluation.detection import parse_boxes
from harness.evaluation.images import IMAGE_SUFFIXES, is_image, load_image
from harness.evaluation.layouts import LabelRow, label_rows
from harness.evaluation.regions import parse_regions
from harness.evaluation.spec import Evaluation
from harness.evaluation.task import TaskEvaluation

SAMPLE_SUFFIXES = (".npy", ".npz", *IMAGE_SUFFIXES)
BOX_METRICS = ("hmean",)  # metrics whose labels are boxes in the sample's pixels
REGION_METRICS = ("map50",)  # ... and classed regions (class x0 y0 x1 y1)


def _sample_files(data: Path) -> list[str]:
    """The sample files at the top of a data folder, by name."""
    return sorted(p.name for p in data.iterdir() if p.is_file() and p.suffix.lower() in SAMPLE_SUFFIXES)


def _load(path: Path, infos: list[InputInfo], evaluation: Evaluation, where: str) -> tuple[Feed, tuple[float, float]]:
    """One sample file as the model's feed, and the factors from its pixels to the input's ((1, 1) for arrays)."""
    if is_image(path):
        if evaluation.image is None:
            raise EvaluationError(f"{where}: {path.name} is an image: {evaluation.where} needs evaluation.image "
                                  "(channels, resize, scale, mean, std) to make it the model's input")
        if len(infos) != 1:
            raise EvaluationError(f"{where}: {path.name} is an image, but the model has {len(infos)} inputs "
                                  f"({', '.join(i.name for i in infos)}): use .npz files keyed by input name")
        try:
            image = load_image(path, infos[0], evaluation.image)
        except EvaluationError as e:
            raise EvaluationError(f"{where}: {e}") from None
        return {infos[0].name: image.array}, image.scale_xy
    held = load_feeds_file(path, infos, what="evaluation sample")
    if len(held) != 1:
        raise EvaluationError(f"{where}: {path.name} holds {len(held)} samples; a labelled file holds one")
    return held[0], (1.0, 1.0)


def _scaled_boxes(label: str, scale_xy: tuple[float, float]) -> str:
    """A boxes label moved from the image's pixels to the input's."""
    sx, sy = scale_xy
    return ";".join(" ".join(f"{v * (sx if k % 2 == 0 else sy):g}" for k, v in enumerate(box))
                    for box in parse_boxes(label))


def _scaled_regions(label: str, scale_xy: tuple[float, float]) -> str:
    """A regions label (class x0 y0 x1 y1) moved from the image's pixels to the input's."""
    sx, sy = scale_xy
    return ";".join(f"{int(c)} {x0 * sx:g} {y0 * sy:g} {x1 * sx:g} {y1 * sy:g}"
                    for c, x0, y0, x1, y1 in parse_regions(label))


def labelled_samples(evaluation: Evaluation, infos: list[InputInfo]) -> tuple[list[Feed], list[str], TaskEvaluation]:
    """Return the evaluation's samples in its labels' order, their labels (text) and the task evaluation; raises
    EvaluationError naming the file and line of a label that names no sample or does not parse, or the sample
    files that have no label."""
    top = _sample_files(evaluation.data)
    rows: list[LabelRow] = label_rows(evaluation, top)
    unlabelled = sorted(set(top) - {r.file for r in rows}) if evaluation.layout != "class_folders" else []
    if unlabelled:
        shown = ", ".join(unlabelled[:5]) + (f" and {len(unlabelled) - 5} more" if len(unlabelled) > 5 else "")
        raise EvaluationError(f"evaluation data {evaluation.data}: {len(unlabelled)} sample file(s) have no label "
                              f"in {evaluation.labels}: {shown}")
    if not rows:
        raise EvaluationError(f"evaluation data {evaluation.data}: no labelled samples (layout {evaluation.layout})")
    task = TaskEvaluation.of(evaluation, tuple(r.file for r in rows),
                             tuple(infos[0].shape) if infos else None)
    feeds: list[Feed] = []
    labels: list[str] = []
    metrics = (task.metric, *task.reported)
    for row in rows:
        path = evaluation.data / row.file
        if not path.is_file() or path.suffix.lower() not in SAMPLE_SUFFIXES:
            raise EvaluationError(f"{row.where}: '{row.file}' is not a sample file (.npy, .npz or an image: "
                                  f"{', '.join(IMAGE_SUFFIXES)}) in {evaluation.data}")
        feed, scale_xy = _load(path, infos, evaluation, row.where)
        label = row.label
        for metric in metrics:
            try:
                metric.parse(label)
            except ValueError:
                raise EvaluationError(f"{row.where}: label {label!r} of {row.file} is not {metric.expects} "
                                      f"(metric {metric.name})") from None
        if scale_xy != (1.0, 1.0) and any(m.name in BOX_METRICS for m in metrics):
            label = _scaled_boxes(label, scale_xy)
        if scale_xy != (1.0, 1.0) and any(m.name in REGION_METRICS for m in metrics):
            label = _scaled_regions(label, scale_xy)
        feeds.append(feed)
        labels.append(label)
    return feeds, labels, task
