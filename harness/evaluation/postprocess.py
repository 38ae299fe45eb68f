"""Post-processing: one sample's model outputs turned into the prediction a task metric scores.

Built-ins: `argmax` (the classes by descending score, the first the arg-max: what top-1, top-5 and F1 read),
`ctc_greedy` (CTC greedy decoding with a charset file: the best class per step, repeats collapsed, the blank
dropped, as PaddleOCR's CTCLabelDecode), `frames` (each element of a probability output at or above 0.5 is a
positive frame), `db_boxes` (a DBNet probability map's text boxes, harness.evaluation.detection), `picodet_boxes`
(a PicoDet layout detector's classed, scored region boxes from all its outputs, harness.evaluation.regions). A user's
`module.py:function` gets the sample's outputs {name: array} and returns anything its metric reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from harness.errors import EvaluationError
from harness.evaluation.detection import db_boxes
from harness.evaluation.regions import picodet_boxes
from harness.evaluation.spec import Evaluation
from harness.user_code import load_function

TOP_CLASSES = 5  # argmax keeps this many classes, best first (top-5 reads them all)
FRAME_THRESHOLD = 0.5
BUILTIN_POSTPROCESS = ("argmax", "ctc_greedy", "frames", "db_boxes", "picodet_boxes")


def argmax(output: np.ndarray) -> tuple[int, ...]:
    """Return the TOP_CLASSES best classes of a classifier output, best first."""
    scores = np.asarray(output, dtype=np.float64).ravel()
    return tuple(int(i) for i in np.argsort(-scores, kind="stable")[:TOP_CLASSES])


def frames(output: np.ndarray) -> tuple[int, ...]:
    """Return 1 for each element of a probability output at or above FRAME_THRESHOLD, else 0."""
    return tuple(int(v >= FRAME_THRESHOLD) for v in np.asarray(output, dtype=np.float64).ravel())


def read_charset(path: Path) -> list[str]:
    """Return the characters of a charset file, one per line (only line ends are stripped: a line may be a
    space, or the ideographic space PaddleOCR's dictionaries start with)."""
    lines = Path(path).read_bytes().decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


@dataclass(frozen=True)
class CtcGreedy:
    """CTC greedy decoding of a (steps, classes) output: class 0 is the blank, then the charset's characters,
    then a space when the output is one class wider (PaddleOCR's use_space_char)."""

    charset: tuple[str, ...]
    source: Path

    def __call__(self, output: np.ndarray, name: str) -> str:
        steps = np.asarray(output)
        steps = steps.reshape(-1, steps.shape[-1]) if steps.ndim >= 2 else steps[None]
        classes, n = steps.shape[-1], len(self.charset)
        if classes not in (n + 1, n + 2):
            raise EvaluationError(f"evaluation.charset {self.source} has {n} characters, but output '{name}' has "
                                  f"{classes} classes per step: expected {n + 1} (the CTC blank first, then the "
                                  f"characters) or {n + 2} (a space last, as PaddleOCR's use_space_char)")
        table = ("",) + self.charset + ((" ",) if classes == n + 2 else ())
        best = steps.argmax(axis=-1)
        keep = np.ones(len(best), dtype=bool)
        keep[1:] = best[1:] != best[:-1]
        return "".join(table[i] for i in best[keep & (best != 0)])


Postprocess = Callable[[dict[str, np.ndarray]], Any]


def _height_width(shape: tuple[int, ...]) -> tuple[int, int]:
    """An image input's (height, width): NCHW, or NHWC when its last dimension is the 3 channels."""
    return (int(shape[1]), int(shape[2])) if len(shape) == 4 and shape[3] == 3 else (int(shape[-2]), int(shape[-1]))


def postprocessor(evaluation: Evaluation, input_shape: tuple[int, ...] | None = None) -> Postprocess:
    """Return the function that turns one sample's outputs {name: array} into its prediction (input_shape: the
    model's image input, which picodet_boxes lays its anchors over)."""
    if evaluation.postprocess not in BUILTIN_POSTPROCESS:
        return load_function(evaluation.postprocess, "evaluation.postprocess")
    if evaluation.postprocess == "picodet_boxes":
        if input_shape is None or len(input_shape) < 2:
            raise EvaluationError(f"{evaluation.where}: evaluation.postprocess picodet_boxes needs the model's image "
                                  f"input shape (got {input_shape})")
        height_width = _height_width(tuple(input_shape))
        return lambda outputs: picodet_boxes(list(outputs.values()), height_width)
    decode: Callable[[np.ndarray, str], Any]
    if evaluation.postprocess == "ctc_greedy":
        decode = CtcGreedy(tuple(read_charset(evaluation.charset)), evaluation.charset)
    else:
        builtin = {"argmax": argmax, "frames": frames, "db_boxes": db_boxes}[evaluation.postprocess]
        decode = lambda output, name: builtin(output)  # noqa: E731

    def run(outputs: dict[str, np.ndarray]) -> Any:
        name = evaluation.output or next(iter(outputs))
        if name not in outputs:
            raise EvaluationError(f"{evaluation.where}: evaluation.output '{name}' is not an output of the model "
                                  f"(outputs: {', '.join(outputs)})")
        return decode(outputs[name], name)

    return run
