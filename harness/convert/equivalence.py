"""Equivalence of a transformed model with its source: same outputs on the same deterministic inputs.

Every conversion transform is checked with this module: the transformed model must load in
onnxruntime (CPU, graph optimisations off, so that onnxruntime's own rewrites do not hide ours) and
give the source model's outputs within the tolerance float rounding allows, and a cosine of at least
MIN_COSINE. The tolerance of each output is ATOL plus the larger of
* RTOL of the output's largest magnitude (folding a BatchNormalization into a Conv moves results by ~1e-7
  of their scale; 1e-3 leaves room for ordinary re-association), and
* how far the source's own rounding envelope (harness.convert.rounding: every reduction's terms perturbed
  by Higham's gamma_K, the most summing in another order may perturb them) moves that output on the same
  input: a softmax over large logits, or a graph computing in float16, moves far more than 1e-3 of its
  scale under re-association alone (issue 22's ResNet: 2.7e-3 of a softmax's scale, cosine 0.999996),
capped at RTOL_CAP of the output's magnitude, so that no graph is ever allowed to move an element by more
than a percent of its output's scale. The cosine bound does not widen: a change of function that
stays inside the per-element tolerance still moves the output's direction, and fails there.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import onnx

from harness.convert import copy_model
from harness.data import Feed, input_infos, random_input
from harness.host_sessions import host_session_options
from harness.metrics import cosine_similarity

RTOL = 1e-3  # of the output's largest magnitude
RTOL_CAP = 1e-2  # the most the rounding envelope may widen the tolerance to, of the output's largest magnitude
ATOL = 1e-5
MIN_COSINE = 0.9999


class RunFailed(Exception):
    """onnxruntime could not load or run a model; the message is onnxruntime's first line."""


@dataclass(frozen=True)
class Equivalence:
    """How close a model's outputs are to the source's: the worst output's figures."""

    max_abs_diff: float
    cosine: float
    worst_output: str
    tolerance: float
    error: str = ""  # why the model could not be compared (does not load, missing output, NaNs moved)
    cosine_required: bool = True  # False when the output is ~0 everywhere (its cosine means nothing)
    rounding_envelope: float = 0.0  # how far the source's rounding envelope moved this output (0: not measured)

    @property
    def passed(self) -> bool:
        """True when the model ran and every output is within tolerance."""
        return (not self.error and self.max_abs_diff <= self.tolerance
                and (self.cosine >= MIN_COSINE or not self.cosine_required))

    def __str__(self) -> str:
        if self.error:
            return self.error
        envelope = (f"; float rounding in this graph moves it by up to {self.rounding_envelope:.3g}"
                    if self.rounding_envelope else "")
        return (f"output '{self.worst_output}': max |diff| {self.max_abs_diff:.3g} (tolerance {self.tolerance:.3g}"
                f"{envelope}), cosine {self.cosine:.6f} (at least {MIN_COSINE})")


def _np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def check_feeds(model: onnx.ModelProto, seed_text: str, count: int = 2) -> list[Feed]:
    """Return `count` deterministic feeds for the (shape-fixed) model's inputs: floats uniform in [0, 1) then
    standard normal; integers and booleans as harness.data.random_input draws them (ids within the vocabulary
    of the embedding they index, padding masks, other integers in {0, 1})."""
    seed = int.from_bytes(hashlib.sha256(seed_text.encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    infos = {i.name: i for i in input_infos(model)}
    feeds = []
    for k in range(count):
        feed = {}
        for inp in model.graph.input:
            if inp.name not in infos:
                continue
            tt = inp.type.tensor_type
            shape = tuple(d.dim_value for d in tt.shape.dim)
            dtype = _np_dtype(tt.elem_type)
            if dtype.kind == "f":
                value = rng.random(shape) if k % 2 == 0 else rng.standard_normal(shape)
            else:
                value = random_input(infos[inp.name], rng)
            feed[inp.name] = np.asarray(value).astype(dtype)
        feeds.append(feed)
    return feeds


def run(model: onnx.ModelProto, feeds: list[Feed], extra_outputs: tuple[str, ...] = ()) -> list[dict[str, np.ndarray]]:
    """Return the model's outputs by name for each feed (onnxruntime CPU, optimisations off);
    extra_outputs (intermediate tensors with inferred types) are returned too. Raises RunFailed."""
    import onnxruntime as ort

    if extra_outputs:
        model = _with_outputs(model, extra_outputs)
    so = host_session_options()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        wanted = {i.name for i in session.get_inputs()}
        return [dict(zip(names, session.run(None, {k: v for k, v in feed.items() if k in wanted})))
                for feed in feeds]
    except Exception as e:  # onnxruntime raises its own exception types
        raise RunFailed(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from None


def _with_outputs(model: onnx.ModelProto, names: tuple[str, ...]) -> onnx.ModelProto:
    copy = copy_model(model)
    known = {v.name: v for v in [*copy.graph.value_info, *copy.graph.input, *copy.graph.output]}
    present = {o.name for o in copy.graph.output}
    for name in names:
        if name in present:
            continue
        if name in known:
            copy.graph.output.append(known[name])
        else:
            copy.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return copy


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    ok = np.isfinite(a) & np.isfinite(b)
    return float(np.max(np.abs(a[ok] - b[ok]))) if ok.any() else 0.0


def compare(reference: list[dict[str, np.ndarray]], outputs: list[dict[str, np.ndarray]],
            envelope: list[dict[str, np.ndarray]] | None = None) -> Equivalence:
    """Return the worst output's difference from the reference over all feeds; envelope (the outputs of
    harness.convert.rounding.envelope_model on the same feeds) widens each output's tolerance to what float
    rounding can do to it, up to RTOL_CAP of its scale."""
    worst = Equivalence(0.0, 1.0, "", ATOL)
    margin = -1.0
    for i, (ref_feed, out_feed) in enumerate(zip(reference, outputs)):
        for name, ref in ref_feed.items():
            if name not in out_feed:
                return Equivalence(float("inf"), 0.0, name, 0.0, f"output '{name}' is missing")
            ref64 = np.asarray(ref, dtype=np.float64)
            out64 = np.asarray(out_feed[name], dtype=np.float64)
            if ref64.shape != out64.shape:
                return Equivalence(float("inf"), 0.0, name, 0.0,
                                   f"output '{name}' has shape {list(out64.shape)}, the source's {list(ref64.shape)}")
            bad_ref, bad_out = ~np.isfinite(ref64), ~np.isfinite(out64)
            if not np.array_equal(bad_ref, bad_out) or not np.array_equal(ref64[bad_ref], out64[bad_out],
                                                                          equal_nan=True):
                return Equivalence(float("inf"), 0.0, name, 0.0,
                                   f"output '{name}': NaN/inf elements differ from the source's "
                                   f"({int(bad_ref.sum())} in the source, {int(bad_out.sum())} here)")
            ok = ~bad_ref
            a, b = ref64[ok], out64[ok]
            diff = float(np.max(np.abs(a - b))) if a.size else 0.0
            scale = float(np.max(np.abs(a))) if a.size else 0.0
            meaningful = ATOL + RTOL * scale > 10 * ATOL  # the output is not ~0 everywhere
            moved = 0.0
            if envelope is not None and name in envelope[i]:
                moved = _max_diff(ref64, np.asarray(envelope[i][name], dtype=np.float64).reshape(ref64.shape))
            tol = ATOL + min(RTOL_CAP * scale, max(RTOL * scale, moved))
            # the cosine of an output that is ~0 everywhere measures float32 rounding, not a change
            cos = cosine_similarity(a, b) if meaningful or diff > tol else 1.0
            score = max(diff / tol, (1 - cos) / (1 - MIN_COSINE) if meaningful else 0.0)
            if score > margin:
                margin, worst = score, Equivalence(diff, cos, name, tol, cosine_required=meaningful,
                                                   rounding_envelope=moved)
    return worst
