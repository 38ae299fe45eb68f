"""Layout detection: a PicoDet's outputs turned into scored, classed region boxes (`picodet_boxes`), and their
COCO-style mAP at IoU 0.5 against labelled regions (`map50`).

`picodet_boxes` is rapid_layout 1.2.1's PPPostProcess (model_handler/pp/post_process.py, what RapidLayout runs on
its PP layout models): per level, class scores (anchors, classes) and box distributions (anchors, 4 x (reg_max +
1)), levels at strides 8, 16, 32, 64 over the input, anchors
row-major at the cells' centres; each side's distance is the softmax expectation of its distribution times the
stride; the 1000 best anchors per level are kept; then per class the boxes scoring above 0.5 (rapid_layout's
conf_thresh) go through hard NMS at IoU 0.5 (its 200 best candidates, at most 100 kept) and are clipped to the input.
No dependency of the harness has an NMS (OpenCV's and torchvision's are not dependencies), so the ten lines of
hard NMS are rapid_layout's, in numpy. Boxes are in the input's pixels.

`map50` is COCO's AP at IoU 0.5 (pycocotools COCOeval with iouThrs [0.5], all areas, 100 detections per image and
class), averaged over the classes that have a labelled region: per sample and class, detections by descending
score each take the unmatched labelled region of their class with the highest IoU >= 0.5 (`match_regions`); over
samples, precision at the 101 recall points of COCO's interpolated precision-recall curve (`map50`). It is
computed here rather than by pycocotools because the bootstrap recomputes it on 1000 resamples of the samples:
the per-sample matching is done once and only the pooling per resample (a sort and a cumulative sum per class)
repeats, where COCOeval would redo its whole evaluation (tens of ms) each time. tests/test_regions.py checks the
value against pycocotools' where it is installed.
A label is the sample's regions, each as 5 numbers `class x0 y0 x1 y1` (class: the model's output column; corners
in the input's pixels), regions separated by ';' (empty: nothing on the sample).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.errors import EvaluationError

STRIDES = (8, 16, 32, 64)  # rapid_layout PPPostProcess.strides
SCORE_THRESHOLD = 0.5  # RapidLayoutInput.conf_thresh
NMS_IOU = 0.5  # RapidLayoutInput.iou_thresh
LEVEL_TOP_K = 1000  # PPPostProcess.nms_top_k: candidates per level
KEEP_TOP_K = 100  # PPPostProcess.keep_top_k: boxes per class
NMS_CANDIDATES = 200  # hard_nms candidate_size
MATCH_IOU = 0.5
RECALL_POINTS = np.linspace(0.0, 1.0, 101)  # COCOeval's recThrs
MAX_DETECTIONS = 100  # COCOeval's maxDets (per sample and class)

Region = tuple[float, ...]  # a prediction: (class, score, x0, y0, x1, y1); a label: (class, x0, y0, x1, y1)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _nms_iou(boxes: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """rapid_layout's iou_of between every pair of boxes (N, 4), corner form (its eps in the denominator)."""
    lt, rb = np.maximum(boxes[:, None, :2], boxes[None, :, :2]), np.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    overlap = np.prod(np.clip(rb - lt, 0.0, None), axis=2)
    area = np.prod(np.clip(boxes[:, 2:] - boxes[:, :2], 0.0, None), axis=1)
    return overlap / (area[:, None] + area[None, :] - overlap + eps)


def _hard_nms(boxes: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Return the indices hard NMS keeps, best first: rapid_layout's hard_nms (its NMS_CANDIDATES best boxes,
    each kept unless it overlaps a better kept one by more than NMS_IOU, at most KEEP_TOP_K), on one IoU matrix."""
    order = np.argsort(scores)[-NMS_CANDIDATES:][::-1]
    iou = _nms_iou(boxes[order])
    suppressed, kept = np.zeros(len(order), dtype=bool), []
    for k in range(len(order)):
        if suppressed[k]:
            continue
        kept.append(order[k])
        if len(kept) == KEEP_TOP_K:
            break
        suppressed |= iou[k] > NMS_IOU
    return np.asarray(kept, dtype=np.int64)


def picodet_boxes(outputs: list[np.ndarray], input_hw: tuple[int, int]) -> tuple[Region, ...]:
    """Return a PicoDet's regions as (class, score, x0, y0, x1, y1) in the input's pixels, by class then score.
    Outputs pair up by their anchor count (a level: most anchors at stride 8), the first of a pair its class scores,
    the second its box distributions: rapid_layout's order (all scores, then all boxes) or interleaved alike."""
    height, width = input_hw
    arrays = [np.asarray(o, dtype=np.float64) for o in outputs]
    anchors = [a.size // a.shape[-1] if a.ndim and a.shape[-1] else 0 for a in arrays]
    counts = sorted(set(anchors), reverse=True)
    if len(counts) != len(STRIDES) or any(anchors.count(n) != 2 for n in counts):
        raise EvaluationError(f"picodet_boxes: the model's {len(arrays)} outputs hold {anchors} anchors; a PicoDet has "
                              f"{2 * len(STRIDES)}, a class-score and a box-distribution output per stride "
                              f"({', '.join(map(str, STRIDES))})")
    levels = []
    for stride, count in zip(STRIDES, counts):
        score, box = (a.reshape(count, a.shape[-1]) for a, n in zip(arrays, anchors) if n == count)
        rows, cols = math.ceil(height / stride), math.ceil(width / stride)
        if count != rows * cols or box.shape[-1] % 4:
            raise EvaluationError(f"picodet_boxes: at stride {stride} an input of {height}x{width} has {rows * cols} "
                                  f"anchors, but the outputs hold scores {list(score.shape)} and boxes "
                                  f"{list(box.shape)} (expected ({rows * cols}, classes), ({rows * cols}, 4 x bins))")
        bins = box.shape[-1] // 4
        distance = (_softmax(box.reshape(-1, bins)) @ np.arange(bins)).reshape(-1, 4) * stride
        y, x = np.divmod(np.arange(rows * cols), cols)
        centre = np.stack([x + 0.5, y + 0.5, x + 0.5, y + 0.5], axis=1) * stride
        best = np.argsort(score.max(axis=1))[::-1][:LEVEL_TOP_K]
        levels.append((centre[best] + np.array([-1, -1, 1, 1]) * distance[best], score[best]))
    boxes = np.concatenate([b for b, _ in levels])
    scores = np.concatenate([s for _, s in levels])
    found: list[Region] = []
    for cls in range(scores.shape[1]):
        keep = scores[:, cls] > SCORE_THRESHOLD
        if not keep.any():
            continue
        candidates, probs = boxes[keep], scores[keep, cls]
        for i in _hard_nms(candidates, probs):
            x0, y0, x1, y1 = candidates[i]
            found.append((float(cls), float(probs[i]), float(np.clip(x0, 0, width)), float(np.clip(y0, 0, height)),
                          float(np.clip(x1, 0, width)), float(np.clip(y1, 0, height))))
    return tuple(found)


def parse_regions(text: str) -> tuple[Region, ...]:
    """Return the regions of a label: `class x0 y0 x1 y1` per region, ';' between them (raises ValueError)."""
    regions = tuple(tuple(float(v) for v in part.replace(",", " ").split()) for part in text.split(";")
                    if part.strip())
    if any(len(r) != 5 or r[0] < 0 or r[0] != int(r[0]) or r[3] < r[1] or r[4] < r[2] for r in regions):
        raise ValueError(text)
    return regions


@dataclass(frozen=True)
class Matched:
    """One sample's detections matched against its labelled regions at IoU 0.5, as COCOeval's evaluateImg does."""

    classes: np.ndarray  # each kept detection's class
    scores: np.ndarray
    hits: np.ndarray  # whether it matched a labelled region of its class
    truth: np.ndarray  # each labelled region's class


def _pairwise_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """COCO's bbox IoU of every box of a (N, 4) with every box of b (M, 4), corner form."""
    lt, rb = np.maximum(a[:, None, :2], b[None, :, :2]), np.minimum(a[:, None, 2:], b[None, :, 2:])
    overlap = np.prod(np.clip(rb - lt, 0.0, None), axis=2)
    area_a, area_b = np.prod(a[:, 2:] - a[:, :2], axis=1), np.prod(b[:, 2:] - b[:, :2], axis=1)
    union = area_a[:, None] + area_b[None, :] - overlap
    return np.divide(overlap, union, out=np.zeros_like(overlap), where=union > 0)


def match_regions(predicted, labelled) -> Matched:
    """Return the sample's detections, each matched or not to a labelled region of its class (see the module)."""
    found = np.asarray(predicted, dtype=np.float64).reshape(-1, 6)
    truth = np.asarray(labelled, dtype=np.float64).reshape(-1, 5)
    classes, scores, hits = [], [], []
    for cls in np.unique(found[:, 0]):
        mine = found[found[:, 0] == cls]
        mine = mine[np.argsort(-mine[:, 1], kind="mergesort")][:MAX_DETECTIONS]
        gts = truth[truth[:, 0] == cls, 1:]
        ious = _pairwise_iou(mine[:, 2:], gts)
        taken = np.zeros(len(gts), dtype=bool)
        hit = np.zeros(len(mine), dtype=bool)
        for d in range(len(mine)):
            candidates = np.where(taken, -1.0, ious[d])
            if len(gts) and candidates.max() >= MATCH_IOU:
                g = len(gts) - 1 - int(np.argmax(candidates[::-1]))  # COCO keeps the last of equal IoUs
                taken[g] = hit[d] = True
        classes.append(mine[:, 0])
        scores.append(mine[:, 1])
        hits.append(hit)
    empty = np.zeros(0)
    return Matched(np.concatenate(classes) if classes else empty, np.concatenate(scores) if scores else empty,
                   np.concatenate(hits) if hits else empty.astype(bool), truth[:, 0])


def map50(matched: list[Matched]) -> float:
    """Return COCO's mAP at IoU 0.5 of matched samples: over the classes with a labelled region, the mean of the
    interpolated precision at 101 recall points (1.0 when no sample has a labelled region: nothing to find).
    All classes at once: detections sorted by class, then by descending score (stable: COCOeval's order),
    cumulative hits restarted per class."""
    truth = np.concatenate([m.truth for m in matched]) if matched else np.zeros(0)
    labelled, positives = np.unique(truth, return_counts=True)
    if not len(labelled):
        return 1.0
    classes = np.concatenate([m.classes for m in matched])
    group = np.minimum(np.searchsorted(labelled, classes), len(labelled) - 1)
    known = labelled[group] == classes  # detections of a class nothing is labelled as do not count (COCOeval)
    order = np.lexsort((-np.concatenate([m.scores for m in matched])[known], group[known]))
    group, hits = group[known][order], np.concatenate([m.hits for m in matched])[known][order]
    starts = np.searchsorted(group, np.arange(len(labelled)))
    ends = np.append(starts[1:], len(group))
    tp = np.cumsum(hits)
    tp = tp - np.concatenate([[0], tp])[starts][group]
    rank = np.arange(1, len(group) + 1) - starts[group]
    recall, precision = tp / positives[group], tp / (rank + np.spacing(1))
    lift = 2.0 * (len(labelled) - 1 - group)  # a class's precisions above all later classes': the envelope restarts
    envelope = np.maximum.accumulate((precision + lift)[::-1])[::-1] - lift
    total = 0.0
    for start, end in zip(starts, ends):
        at = start + np.searchsorted(recall[start:end], RECALL_POINTS, side="left")
        total += float(envelope[at[at < end]].sum()) / len(RECALL_POINTS)
    return total / len(labelled)
