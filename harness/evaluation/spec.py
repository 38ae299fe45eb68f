"""The `evaluation:` section of a model spec: labelled samples (in one of the layouts of
harness.evaluation.layouts), how image files become the model's input, the post-processing that turns a model's
outputs into predictions, the task metric and its limit against the float model (MLPerf's form: a share of float)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.errors import ConfigError
from harness.user_code import is_reference, load_function, spec_relative

# What each built-in post-processing yields, and what each built-in metric scores
POSTPROCESS_YIELDS = {"argmax": "classes", "ctc_greedy": "text", "frames": "frames", "db_boxes": "boxes",
                      "picodet_boxes": "regions"}
METRIC_TAKES = {"top1": ("classes",), "top5": ("classes",), "cer": ("text",), "word_accuracy": ("text",),
                "f1": ("classes", "frames"), "detection_rate": ("classes", "frames"),
                "false_accepts": ("classes", "frames"), "hmean": ("boxes",), "map50": ("regions",)}
DEFAULT_MIN_RATIO = 0.98  # MLPerf Mobile's classification target: 98 % of FP32, when the section sets no limit
# What each layout's labels are, and the metrics that read them (a user's module.py:function reads anything)
LAYOUTS = ("csv", "class_folders", "icdar", "coco")
LAYOUT_LABELS = {"class_folders": ("class indices", ("top1", "top5", "f1", "detection_rate", "false_accepts")),
                 "icdar": ("text boxes", ("hmean",)), "coco": ("boxes or classed regions", ("hmean", "map50"))}


class ImageSection(BaseModel):
    """How an image file (PNG, JPEG, BMP, TIFF, WebP; read by Pillow) becomes a single-input model's input: resized
    to the input's height and width, its pixels scaled, normalized per channel, laid out as the input (NCHW or
    NHWC, from where its 3 channels are)."""

    model_config = ConfigDict(extra="forbid")

    channels: Literal["rgb", "bgr"] = Field("rgb", description="channel order the model expects (bgr: OpenCV's)")
    resize: Literal["stretch", "keep_ratio_pad"] = Field(
        "stretch", description="stretch: to the input's height and width; keep_ratio_pad: to its height keeping the "
                               "aspect ratio (at most its width), zero-padded on the right (PaddleOCR's text lines)")
    scale: float = Field(1 / 255, gt=0, allow_inf_nan=False, description="pixel values (0-255) times this")
    mean: list[float] = Field([0.0, 0.0, 0.0], min_length=3, max_length=3, description="subtracted per channel")
    std: list[float] = Field([1.0, 1.0, 1.0], min_length=3, max_length=3, description="divided by, per channel")


class EvaluationSection(BaseModel):
    """The section as written in the spec file (paths relative to it)."""

    model_config = ConfigDict(extra="forbid")

    data: str = Field(description="folder of samples: .npy (single-input models), .npz keyed by input name, or "
                                  "images (with `image:`); class_folders: a folder per class")
    labels: str | None = Field(None, description="csv: a CSV file,label (a class index, a text line, boxes of 8 "
                                                 "numbers or regions of 5 (class x0 y0 x1 y1) separated by ';'); "
                                                 "icdar: a folder of gt_<image>.txt; coco: a COCO JSON; "
                                                 "class_folders: none")
    layout: Literal["csv", "class_folders", "icdar", "coco"] | None = Field(
        None, description="how labels are given (default: coco for a .json, icdar for a folder, class_folders "
                          "without labels, else csv)")
    classes: list[str] | None = Field(None, description="class_folders: the folder names in the order of the "
                                                        "model's classes (default: integer names are the class, "
                                                        "else sorted names, as torchvision's ImageFolder); coco "
                                                        "read by map50: the categories' names in that order "
                                                        "(default: the categories sorted by id)")
    image: ImageSection | None = Field(None, description="how image files become the input (needed for images)")
    postprocess: str = Field("argmax", description="argmax | ctc_greedy | frames | db_boxes | picodet_boxes | "
                                                  "module.py:function")
    charset: str | None = Field(None, description="ctc_greedy: the character list, one per line (CTC blank "
                                                  "first; a space last when the output is one class wider)")
    output: str | None = Field(None, description="the model output post-processed (default: the first)")
    metric: str = Field(description="top1 | top5 | cer | word_accuracy | f1 | detection_rate | false_accepts | "
                                    "hmean | map50 | module.py:function")
    report: list[str] = Field(default_factory=list, description="further built-in metrics reported beside it "
                                                                  "(on the same predictions), not judged")
    higher_is_better: bool | None = Field(None, description="a metric given as module.py:function: its direction")
    min_ratio_to_float: float | None = Field(None, gt=0, allow_inf_nan=False,
                                             description="quantized task metric / float's (MLPerf's form)")
    max_drop: float | None = Field(None, ge=0, allow_inf_nan=False,
                                   description="quantized task metric worse than float's by at most this")


@dataclass(frozen=True)
class Evaluation:
    """A model's task evaluation with its files resolved: where its labelled samples are, how outputs become
    predictions and which metric scores them (built-in names, or 'file.py:function' with an absolute file)."""

    data: Path
    labels: Path | None
    metric: str
    postprocess: str = "argmax"
    charset: Path | None = None
    output: str | None = None
    report: tuple[str, ...] = ()
    higher_is_better: bool | None = None
    spec: Path | None = None  # the spec file it came from (named in errors)
    layout: str = "csv"  # one of LAYOUTS
    classes: tuple[str, ...] | None = None
    image: ImageSection | None = None

    @property
    def where(self) -> str:
        """The spec file, for messages."""
        return f"model spec {self.spec}" if self.spec else "evaluation"


def metrics_reading(kind: str, metrics: tuple[str, ...]) -> list[str]:
    """Return those of metrics (built-in names; a user's function reads anything) that read labels of kind
    (METRIC_TAKES: "boxes", "regions", ...)."""
    return [m for m in metrics if METRIC_TAKES.get(m) == (kind,)]


def resolve_evaluation(section: EvaluationSection, spec: Path) -> Evaluation:
    """Return the section with its paths resolved against the spec's folder; raises ConfigError naming the spec
    file and key for a missing file, an unknown post-processing or metric, a pair that does not fit (cer after
    argmax), ctc_greedy without a charset, classes a layout does not read, a COCO JSON read both as boxes and as
    regions, or a user function that cannot be loaded."""
    base = spec.parent

    def existing(key: str, value: str, folder: bool) -> Path:
        path = (base / value).expanduser().resolve()
        if not (path.is_dir() if folder else path.is_file()):
            raise ConfigError(f"model spec {spec}: evaluation.{key} '{value}' is not a "
                              f"{'folder' if folder else 'file'} ({path})")
        return path

    def function(key: str, value: str, known: dict | tuple) -> str:
        if value in known:
            return value
        if not is_reference(value):
            raise ConfigError(f"model spec {spec}: evaluation.{key} '{value}' is not a built-in "
                              f"({', '.join(known)}) nor module.py:function")
        reference = spec_relative(value, base)
        load_function(reference, f"model spec {spec}: evaluation.{key}")
        return reference

    layout = section.layout or _inferred_layout(section, base)
    if (section.labels is None) != (layout == "class_folders"):
        given = ("the class folders' names are the labels" if layout == "class_folders"
                 else "csv: file,label; icdar: a folder of gt_<image>.txt; coco: a JSON")
        raise ConfigError(f"model spec {spec}: evaluation.labels is {'needed' if section.labels is None else 'not read'}"
                          f" with layout {layout} ({given})")
    postprocess = function("postprocess", section.postprocess, POSTPROCESS_YIELDS)
    metric = function("metric", section.metric, METRIC_TAKES)
    regions = metrics_reading("regions", (metric, *section.report))
    if section.classes is not None and layout != "class_folders" and not (layout == "coco" and regions):
        raise ConfigError(f"model spec {spec}: evaluation.classes applies to layout class_folders, not {layout}"
                          f"{f' read by {metric}' if layout == 'coco' else ''} (and to a COCO JSON's category names "
                          f"when map50 reads it)")
    boxes = metrics_reading("boxes", (metric, *section.report))
    if layout == "coco" and regions and boxes:
        raise ConfigError(f"model spec {spec}: evaluation reads the COCO JSON as text boxes ({', '.join(boxes)}) "
                          f"and as classed regions ({', '.join(regions)}): name metrics of one kind")
    unknown = [m for m in section.report if m not in METRIC_TAKES]
    if unknown:
        raise ConfigError(f"model spec {spec}: evaluation.report names {', '.join(unknown)}: not a built-in metric "
                          f"({', '.join(METRIC_TAKES)})")
    if layout in LAYOUT_LABELS:
        what, readers = LAYOUT_LABELS[layout]
        for key, name in (("metric", metric), *(("report", m) for m in section.report)):
            if name in METRIC_TAKES and name not in readers:
                raise ConfigError(f"model spec {spec}: evaluation.{key} {name} does not read {what}, the labels of "
                                  f"layout {layout} (metrics that do: {', '.join(readers)}, or module.py:function)")
    for key, name in (("metric", metric), *(("report", m) for m in section.report)):
        yields, takes = POSTPROCESS_YIELDS.get(postprocess), METRIC_TAKES.get(name)
        if yields and takes and yields not in takes:
            raise ConfigError(f"model spec {spec}: evaluation.{key} {name} scores {' or '.join(takes)}, but "
                              f"evaluation.postprocess {postprocess} yields {yields}")
    if (postprocess == "ctc_greedy") != (section.charset is not None):
        raise ConfigError(f"model spec {spec}: evaluation.charset is {'needed' if section.charset is None else 'only'}"
                          f" for postprocess ctc_greedy (the characters of the output's classes, one per line)")
    if section.higher_is_better is not None and metric in METRIC_TAKES:
        raise ConfigError(f"model spec {spec}: evaluation.higher_is_better applies to a metric given as "
                          f"module.py:function, not to the built-in {metric}")
    labels = existing("labels", section.labels, layout == "icdar") if section.labels is not None else None
    return Evaluation(data=existing("data", section.data, True), labels=labels, layout=layout,
                      classes=tuple(section.classes) if section.classes is not None else None, image=section.image,
                      metric=metric, postprocess=postprocess, output=section.output, report=tuple(section.report),
                      charset=existing("charset", section.charset, False) if section.charset else None,
                      higher_is_better=section.higher_is_better, spec=spec.resolve())


def _inferred_layout(section: EvaluationSection, base: Path) -> str:
    """The layout a section without `layout:` has: class_folders without labels, coco for a .json, icdar for a
    folder, else csv."""
    if section.labels is None:
        return "class_folders"
    if section.labels.lower().endswith(".json"):
        return "coco"
    return "icdar" if (base / section.labels).expanduser().is_dir() else "csv"
