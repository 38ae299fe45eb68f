"""Labels in the common layouts of labelled data, read into one row per sample: the sample file (relative to the
data folder), its label as the metrics read it (harness.evaluation.metrics) and where the label was written.

- csv: `file,label` lines (a first line `file,label` is a header): a class index, a text line (a recognizer's
  CSV of text lines), or boxes of 8 numbers separated by ';'.
- class_folders: data/<class>/<sample> (ImageNet's, torchvision's ImageFolder): the class is the folder's position
  in `classes:`, else its name when every name is an integer, else its position among the sorted names.
- icdar: ICDAR 2015's text localization ground truth, a file gt_<image stem>.txt per image, a line per text box
  `x1,y1,x2,y2,x3,y3,x4,y4,transcription` (UTF-8, with or without a byte-order mark); a transcription `###` marks
  text too blurred to read, kept as a box here (a detector that finds it is right; one that does not misses it).
- coco: a COCO JSON (images with file_name, annotations with image_id and bbox [x, y, width, height], or a
  polygon segmentation of 4 points, which is used as the box); every image listed is a sample, with or without
  annotations; crowd annotations are left out, as COCO's evaluation ignores them. Read by a text detector's
  metric (hmean) an annotation is a box of 8 numbers; read by a region metric (map50) it keeps its class, its
  category_id's: by default the categories sorted by id are the model's classes 0..K-1 (what a detector trained on
  the JSON outputs), or `classes:` names them in the model's order; its box is the corners' extent.

Every error names the file and line (for JSON, the entry: `annotations[3]`, and its id) and what was expected.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from harness.errors import EvaluationError
from harness.evaluation.spec import Evaluation, metrics_reading

HEADER = ["file", "label"]
SKIPPED_FILES = ("description.txt",)  # what a data folder may hold besides its samples (harness.data)


@dataclass(frozen=True)
class LabelRow:
    """One labelled sample: its file relative to the data folder (POSIX separators), its label as text, and where
    the label was written (file and line) for errors."""

    file: str
    label: str
    where: str


def _read_text(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise EvaluationError(f"labels {path}: cannot read as UTF-8 text: {e}") from None


def _boxes_text(boxes: list[list[float]]) -> str:
    """The label of a sample's boxes: 8 numbers each, separated by ';' (harness.evaluation.detection)."""
    return ";".join(" ".join(f"{v:g}" for v in box) for box in boxes)


def csv_rows(path: Path) -> list[LabelRow]:
    """Return the rows of a labels CSV; raises EvaluationError naming the file and line of a row without exactly
    two fields or a file labelled twice."""
    rows: list[LabelRow] = []
    seen: dict[str, int] = {}
    for line, fields in enumerate(csv.reader(_read_text(path).splitlines()), start=1):
        if not fields or (line == 1 and [f.strip().lower() for f in fields] == HEADER):
            continue
        if len(fields) != 2:
            raise EvaluationError(f"labels {path}, line {line}: expected 2 fields (file,label; quote a label "
                                  f"holding a comma), got {len(fields)}: {','.join(fields)!r}")
        name = fields[0].strip()
        if name in seen:
            raise EvaluationError(f"labels {path}, line {line}: '{name}' is labelled twice (first on line "
                                  f"{seen[name]})")
        seen[name] = line
        rows.append(LabelRow(name, fields[1], f"labels {path}, line {line}"))
    if not rows:
        raise EvaluationError(f"labels {path}: no rows (expected file,label lines)")
    return rows


def class_folder_rows(data: Path, classes: tuple[str, ...] | None) -> list[LabelRow]:
    """Return a row per file of data/<class>/: its class index; raises EvaluationError naming a folder that is
    not among `classes`, or a data folder without class folders."""
    folders = sorted(p.name for p in data.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise EvaluationError(f"evaluation data {data}: no class folders (layout class_folders: data/<class>/<sample>)")
    if classes is not None:
        unknown = [f for f in folders if f not in classes]
        if unknown:
            raise EvaluationError(f"evaluation data {data}: folder(s) {', '.join(unknown)} are not among "
                                  f"evaluation.classes ({', '.join(classes)})")
        index = {name: classes.index(name) for name in folders}
    elif all(f.isdigit() for f in folders):
        index = {name: int(name) for name in folders}
    else:
        index = {name: k for k, name in enumerate(folders)}
    rows = []
    for folder in folders:
        for sample in sorted((data / folder).iterdir()):
            if sample.is_file() and not sample.name.startswith("."):
                rows.append(LabelRow(f"{folder}/{sample.name}", str(index[folder]),
                                     f"class folder {data / folder} (class {index[folder]})"))
    return rows


def icdar_rows(labels: Path, images: list[str]) -> list[LabelRow]:
    """Return a row per image of the data folder with the boxes of its gt_<stem>.txt; raises EvaluationError naming
    the file and line of a line that does not parse, an image without its file, or a file without its image."""
    by_stem = {Path(name).stem: name for name in images}
    files = {p.name: p for p in labels.iterdir() if p.is_file() and p.suffix == ".txt"}
    orphans = sorted(n for n in files if not (n.startswith("gt_") and n[3:-4] in by_stem))
    if orphans:
        raise EvaluationError(f"labels {labels}: {', '.join(orphans[:5])}{' ...' if len(orphans) > 5 else ''} "
                              f"name(s) no image of the data folder (expected gt_<image stem>.txt)")
    rows = []
    for stem, image in sorted(by_stem.items()):
        path = labels / f"gt_{stem}.txt"
        if path.name not in files:
            raise EvaluationError(f"labels {labels}: no gt_{stem}.txt for image {image} (an image without text "
                                  "has an empty one)")
        boxes = []
        for line, text in enumerate(_read_text(path).splitlines(), start=1):
            if not text.strip():
                continue
            fields = text.split(",", 8)
            try:
                if len(fields) < 8:
                    raise ValueError
                boxes.append([float(v) for v in fields[:8]])
            except ValueError:
                raise EvaluationError(f"labels {path}, line {line}: expected x1,y1,x2,y2,x3,y3,x4,y4,transcription "
                                      f"(8 numbers, then the text), got {text!r}") from None
        rows.append(LabelRow(image, _boxes_text(boxes), f"labels {path}"))
    return rows


def coco_rows(path: Path, regions: bool = False, classes: tuple[str, ...] | None = None) -> list[LabelRow]:
    """Return a row per image of a COCO JSON with its annotations' boxes, or with `regions` their classed regions
    (class x0 y0 x1 y1; the class from category_id, coco_classes); raises EvaluationError naming the file and
    line of invalid JSON, or the entry (and its id) of an image or annotation that does not parse, names no image
    or (regions) no category the mapping knows."""
    try:
        document = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise EvaluationError(f"labels {path}, line {e.lineno} column {e.colno}: not valid JSON: {e.msg}") from None
    if not isinstance(document, dict) or not isinstance(document.get("images"), list):
        raise EvaluationError(f"labels {path}: not a COCO JSON (an object with 'images' and 'annotations' lists)")
    files: dict[int, str] = {}
    for k, image in enumerate(document["images"]):
        try:
            image_id, name = image["id"], str(image["file_name"])
            hash(image_id)
        except (KeyError, TypeError):
            raise EvaluationError(f"labels {path}: images[{k}] needs 'id' and 'file_name', got {image!r}") from None
        if image_id in files:
            raise EvaluationError(f"labels {path}: images[{k}] repeats id {image_id!r}")
        files[image_id] = name
    names = coco_categories(document, path) if regions else {}
    index = coco_classes(names, classes)
    boxes: dict[int, list[list[float]]] = {image_id: [] for image_id in files}
    for k, note in enumerate(document.get("annotations") or []):
        where = f"labels {path}: annotations[{k}] (id {note.get('id') if isinstance(note, dict) else '?'})"
        if not isinstance(note, dict) or note.get("image_id") not in files:
            raise EvaluationError(f"{where}: image_id {note.get('image_id') if isinstance(note, dict) else '?'!r} "
                                  f"is not an image of the file")
        if note.get("iscrowd"):
            continue
        try:
            box = _coco_box(note)
        except (KeyError, TypeError, ValueError):
            raise EvaluationError(f"{where}: expected bbox [x, y, width, height] (width and height > 0) or a "
                                  f"segmentation polygon of 4 points, got bbox {note.get('bbox')!r}") from None
        if regions:
            box = [_coco_class(note, names, index, classes, where), min(box[0::2]), min(box[1::2]), max(box[0::2]),
                   max(box[1::2])]
        boxes[note["image_id"]].append(box)
    return [LabelRow(name, _boxes_text(boxes[image_id]), f"labels {path}: image id {image_id!r} ({name})")
            for image_id, name in files.items()]


def coco_categories(document: dict, path: Path) -> dict[int, str]:
    """Return the name of each category id of a COCO JSON; raises EvaluationError naming a category entry without
    an integer id and a name, or one repeating an id."""
    names: dict[int, str] = {}
    for k, category in enumerate(document.get("categories") or []):
        try:
            category_id, name = category["id"], str(category["name"])
        except (KeyError, TypeError):
            category_id = name = None
        if not isinstance(category_id, int) or isinstance(category_id, bool):
            raise EvaluationError(f"labels {path}: categories[{k}] needs an integer 'id' and a 'name', got "
                                  f"{category!r}")
        if category_id in names:
            raise EvaluationError(f"labels {path}: categories[{k}] repeats id {category_id}")
        names[category_id] = name
    return names


def coco_classes(names: dict[int, str], classes: tuple[str, ...] | None) -> dict[int, int]:
    """Return the model's class index of each category id: its position among the categories sorted by id, or with
    `classes` its name's position there (a category not named there is left out)."""
    if classes is None:
        return {category_id: k for k, category_id in enumerate(sorted(names))}
    return {category_id: classes.index(name) for category_id, name in names.items() if name in classes}


def _coco_class(note: dict, names: dict[int, str], index: dict[int, int], classes: tuple[str, ...] | None,
                where: str) -> int:
    """An annotation's class: index[category_id] (coco_classes); raises EvaluationError at `where` naming what was
    expected of an annotation without category_id, or with one that is not a category of the file or not the
    index's (a name missing from evaluation.classes)."""
    if "category_id" not in note:
        raise EvaluationError(f"{where}: no category_id (a region metric reads each annotation's class: expected "
                              f"the id of one of the file's categories)")
    category = note["category_id"]
    known = isinstance(category, int) and not isinstance(category, bool) and category in names
    if known and category in index:
        return index[category]
    if known:
        raise EvaluationError(f"{where}: category_id {category} ('{names[category]}') is not among "
                              f"evaluation.classes (expected a category named {', '.join(classes or ())})")
    ids = ", ".join(str(c) for c in sorted(names)) or "none"
    raise EvaluationError(f"{where}: category_id {category!r} is not a category of the file (expected one of the "
                          f"ids of its 'categories': {ids})")


def _coco_box(note: dict) -> list[float]:
    """An annotation's box as 8 numbers: its polygon when it is one of 4 points, else its bbox's corners."""
    polygons = note.get("segmentation")
    if isinstance(polygons, list) and len(polygons) == 1 and len(polygons[0]) == 8:
        return [float(v) for v in polygons[0]]
    x, y, w, h = (float(v) for v in note["bbox"])
    if w <= 0 or h <= 0:
        raise ValueError(note["bbox"])
    return [x, y, x + w, y, x + w, y + h, x, y + h]


def reads_regions(evaluation: Evaluation) -> bool:
    """True when the evaluation's metric or a reported one reads classed regions (map50)."""
    return bool(metrics_reading("regions", (evaluation.metric, *evaluation.report)))


def label_rows(evaluation: Evaluation, samples: list[str]) -> list[LabelRow]:
    """Return the labelled samples of an evaluation in its layout; `samples` are the sample files of its data
    folder (relative, POSIX), read by icdar (one gt file per image)."""
    if evaluation.layout == "class_folders":
        return class_folder_rows(evaluation.data, evaluation.classes)
    if evaluation.layout == "icdar":
        return icdar_rows(evaluation.labels, samples)
    if evaluation.layout == "coco":
        return coco_rows(evaluation.labels, reads_regions(evaluation), evaluation.classes)
    return csv_rows(evaluation.labels)
