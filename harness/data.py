"""Calibration and evaluation data for a model: a zoo data set, user .npy/.npz files, or random."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from harness.errors import ConfigError

if TYPE_CHECKING:
    from harness.evaluation.task import TaskEvaluation

Feed = dict[str, np.ndarray]

# Evaluation samples generated (random data) or taken (user data) by default: 189 samples resolve a drop of an
# agreement of 0.02 (the default max_task_metric_drop) at 95 % when none of them changes (Wilson: z²/(n + z²));
# the pipeline then evaluates on as many as its time budget allows (harness.sizing) and says what they resolve.
EVAL_SAMPLES = 200
RANDOM_DATA_BUDGET_BYTES = 256 * 2**20  # random evaluation samples generated at most (a large input gets fewer)

_ONNX_TO_NP = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
               onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32,
               onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT8: np.int8,
               onnx.TensorProto.BOOL: np.bool_}


@dataclass(frozen=True)
class InputInfo:
    """A model input's name, static shape and numpy dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: type


@dataclass
class Dataset:
    """Feeds to calibrate with and to evaluate on; labels when the data set has them."""

    calibration: list[Feed]
    evaluation: list[Feed]
    labels: np.ndarray | None = None
    description: str = ""
    warnings: list[str] = field(default_factory=list)
    task: "TaskEvaluation | None" = None  # the model spec's evaluation section: labels are its text, per sample

    @property
    def labelled(self) -> bool:
        """True when evaluation samples carry ground-truth labels."""
        return self.labels is not None

    def labels_key(self) -> list:
        """Return what the task KPIs depend on besides the outputs: the labels and the task evaluation (cache keys)."""
        labels = [] if self.labels is None else np.asarray(self.labels).tolist()
        return labels if self.task is None else [labels, self.task.identity]


def feeds_digest(feeds: list[Feed]) -> str:
    """Return a stable hash of a list of feeds (names, dtypes, shapes and bytes)."""
    h = hashlib.sha256()
    for feed in feeds:
        for name in sorted(feed):
            value = np.ascontiguousarray(feed[name])
            h.update(f"{name}|{value.dtype}|{value.shape}".encode())
            h.update(value.tobytes())
    return h.hexdigest()[:20]


def input_infos(model: onnx.ModelProto) -> list[InputInfo]:
    """Return the static inputs of a shape-fixed model."""
    inits = {i.name for i in model.graph.initializer}
    infos = []
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        infos.append(InputInfo(inp.name, tuple(d.dim_value for d in tt.shape.dim),
                               _ONNX_TO_NP.get(tt.elem_type, np.float32)))
    return infos


def random_dataset(infos: list[InputInfo], seed_text: str, n_calib: int = 16, n_eval: int | None = None) -> Dataset:
    """Return deterministic uniform [0, 1) data (seeded from seed_text), flagged with a warning: n_eval evaluation
    samples (default EVAL_SAMPLES, fewer when they would take more than RANDOM_DATA_BUDGET_BYTES, at least 8)."""
    if n_eval is None:
        sample_bytes = sum(int(np.prod(i.shape, dtype=np.int64)) * np.dtype(i.dtype).itemsize for i in infos)
        n_eval = min(EVAL_SAMPLES, max(8, RANDOM_DATA_BUDGET_BYTES // max(sample_bytes, 1)))
    seed = int.from_bytes(hashlib.sha256(seed_text.encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)

    def feed() -> Feed:
        return {i.name: rng.random(i.shape, dtype=np.float32).astype(i.dtype) for i in infos}

    calib = [feed() for _ in range(n_calib)]
    return Dataset(calib, [feed() for _ in range(n_eval)], None,
                   description=f"deterministic random uniform [0,1) data ({n_calib} calibration, {n_eval} evaluation)",
                   warnings=["no --calib-data given: calibrated and evaluated on random data; "
                             "quantization encodings and KPIs may not reflect real inputs"])


def load_calibration_dir(directory: Path, infos: list[InputInfo]) -> list[Feed]:
    """Return feeds from a directory of .npy files (single-input models) or .npz files keyed by input name.

    A .npy holds one sample of the input's shape or a stack of them (N, *shape). Raises ConfigError
    naming the file and the expected shape.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"--calib-data {directory}: not a directory")
    files = sorted(p for p in directory.iterdir() if p.suffix in {".npy", ".npz"})
    if not files:
        raise ConfigError(f"--calib-data {directory}: no .npy or .npz files")
    return [feed for f in files for feed in load_feeds_file(f, infos)]


def load_feeds_file(f: Path, infos: list[InputInfo], what: str = "calibration file") -> list[Feed]:
    """Return the feeds one .npy (single-input models: one sample or a stack (N, *shape)) or .npz file (keyed by
    input name) holds; raises ConfigError naming the file (as `what`) and the expected shape."""
    by_name = {i.name: i for i in infos}
    try:
        data = np.load(f, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what} {f}: cannot read as numpy data: {e}") from None
    if f.suffix == ".npy":
        if len(infos) != 1:
            raise ConfigError(f"{what} {f}: the model has {len(infos)} inputs "
                              f"({', '.join(by_name)}); use .npz files keyed by input name")
        arrays = {infos[0].name: data}
    else:
        arrays = dict(data)
        missing = [n for n in by_name if n not in arrays]
        if missing:
            raise ConfigError(f"{what} {f}: no array for input(s) {', '.join(missing)}")
    stacks = {}
    for name, info in by_name.items():
        arr = np.asarray(arrays[name])
        if arr.shape == info.shape:
            arr = arr[None]
        if arr.shape[1:] != info.shape:
            raise ConfigError(f"{what} {f}: input '{name}' has shape {list(arr.shape)}, "
                              f"expected {list(info.shape)} or (N, {', '.join(map(str, info.shape))})")
        stacks[name] = arr.astype(info.dtype)
    count = min(len(s) for s in stacks.values())
    return [{n: s[k] for n, s in stacks.items()} for k in range(count)]


DESCRIPTION_FILE = "description.txt"  # optional, in a calibration directory: what its samples are


def user_dataset(calib_dir: Path, infos: list[InputInfo], n_eval: int = EVAL_SAMPLES) -> Dataset:
    """Return calibration feeds from calib_dir and evaluate on (up to n_eval of) the same samples.

    The description names the directory and, when it holds a description.txt, what the samples are.
    """
    feeds = load_calibration_dir(calib_dir, infos)
    about = Path(calib_dir) / DESCRIPTION_FILE
    what = f": {about.read_text().strip()}" if about.is_file() else ""
    return Dataset(feeds, feeds[:n_eval], None,
                   description=f"{len(feeds)} samples from {calib_dir}{what}",
                   warnings=["no labels: task KPIs are agreement with the float model, "
                             "evaluated on the calibration samples"])


def with_evaluation_count(dataset: Dataset, count: int, reason: str) -> Dataset:
    """Return dataset evaluating on its first `count` evaluation samples (labels cut to match), the
    count and reason appended to its description; the dataset itself when count keeps them all."""
    if count >= len(dataset.evaluation):
        return replace(dataset, description=f"{dataset.description}; evaluated on all "
                                            f"{len(dataset.evaluation)} evaluation samples ({reason})")
    labels = None if dataset.labels is None else dataset.labels[:count]
    return replace(dataset, evaluation=dataset.evaluation[:count], labels=labels,
                   description=f"{dataset.description}; evaluated on {count} of {len(dataset.evaluation)} "
                               f"evaluation samples ({reason})")
