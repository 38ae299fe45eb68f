"""Text detection: a DBNet probability map turned into boxes (`db_boxes`), and their hmean against labelled boxes.

`db_boxes` follows PaddleOCR's DBPostProcess with its defaults: the map binarized at 0.3, each connected region
(scipy.ndimage) kept when its mean probability is at least 0.6, its minimum rotated rectangle (shapely) grown by
area x 1.5 / perimeter (pyclipper's polygon offset, as PaddleOCR's unclip) and boxed again, boxes with a side under
5 pixels dropped. Boxes are in the map's pixels: a DBNet's map has its input's size.

`hmean` is ICDAR 2015's: a predicted box matches a labelled one when their polygon IoU (shapely) is at least 0.5,
one to one (the pairs by descending IoU); hmean = 2·matched / (predicted + labelled), summed over samples.
A label is the sample's boxes, each as 8 numbers x1 y1 x2 y2 x3 y3 x4 y4, the boxes separated by ';' (empty: no
text on the sample).
"""

from __future__ import annotations

import numpy as np

BIN_THRESHOLD = 0.3  # PaddleOCR DBPostProcess: thresh
BOX_THRESHOLD = 0.6  # box_thresh: a region's mean probability
UNCLIP_RATIO = 1.5
MIN_SIDE = 3  # min_size: a box's shorter side must exceed it by 2 pixels
MATCH_IOU = 0.5  # ICDAR 2015


def db_boxes(probability: np.ndarray) -> tuple[tuple[float, ...], ...]:
    """Return the text boxes of a DBNet probability map (any shape ending in H, W), each as 8 numbers."""
    import pyclipper
    import shapely
    from scipy import ndimage

    prob = np.asarray(probability, dtype=np.float64)
    prob = prob.reshape(prob.shape[-2:])
    regions, _ = ndimage.label(prob > BIN_THRESHOLD)
    boxes = []
    for k, window in enumerate(ndimage.find_objects(regions), start=1):
        ys, xs = np.nonzero(regions[window] == k)
        if float(prob[window][ys, xs].mean()) < BOX_THRESHOLD:
            continue
        rect = shapely.MultiPoint(np.stack([xs + window[1].start, ys + window[0].start], axis=1)
                                  ).minimum_rotated_rectangle
        if rect.geom_type != "Polygon":  # a point or a line of pixels: no area to grow
            continue
        offset = pyclipper.PyclipperOffset()
        offset.AddPath([tuple(p) for p in rect.exterior.coords[:-1]], pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
        grown = offset.Execute(rect.area * UNCLIP_RATIO / rect.length)
        if not grown:
            continue
        box = shapely.Polygon(grown[0]).minimum_rotated_rectangle
        corners = np.asarray(box.exterior.coords[:4])
        sides = np.linalg.norm(corners - np.roll(corners, 1, axis=0), axis=1)
        if sides.min() < MIN_SIDE + 2:
            continue
        boxes.append(tuple(float(v) for v in corners.ravel()))
    return tuple(boxes)


def parse_boxes(text: str) -> tuple[tuple[float, ...], ...]:
    """Return the boxes of a label: 8 numbers per box, boxes separated by ';' (raises ValueError otherwise)."""
    boxes = tuple(tuple(float(v) for v in part.replace(",", " ").split()) for part in text.split(";") if part.strip())
    if any(len(box) != 8 for box in boxes):
        raise ValueError(text)
    return boxes


def hmean_parts(predicted, labelled) -> tuple[float, float]:
    """Return one sample's (2·matched, predicted + labelled) boxes: hmean is their ratio of sums."""
    import shapely

    def polygon(box):
        shape = shapely.Polygon(np.asarray(box, dtype=np.float64).reshape(4, 2))
        return shape if shape.is_valid else shape.buffer(0)

    found, truth = [polygon(b) for b in predicted], [polygon(b) for b in labelled]
    pairs = []
    for i, p in enumerate(found):
        for j, t in enumerate(truth):
            union = p.union(t).area
            if union > 0 and (iou := p.intersection(t).area / union) >= MATCH_IOU:
                pairs.append((iou, i, j))
    used_found, used_truth = set(), set()
    for _, i, j in sorted(pairs, reverse=True):
        if i not in used_found and j not in used_truth:
            used_found.add(i)
            used_truth.add(j)
    return 2.0 * len(used_found), float(len(found) + len(truth))
