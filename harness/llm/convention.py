"""Genie's I/O convention for a decoder LLM's static graph pair, and :func:`check_pair`, which validates one.

The convention (Qualcomm AI Hub's Genie bundles; AR = tokens per call, CL = context length, H = heads,
Dh = head dim, V = vocabulary, l = layer index 0..L-1; P = CL - AR past slots):

    inputs   input_ids [1, AR] int32, attention_mask [1, 1, AR, CL] float32 (additive: 0 attend, -1000 masked;
             the first P columns are the past slots, the last AR the new tokens), position_ids [1, AR] int32,
             past_key_{l}_in [H, 1, Dh, P] float32, past_value_{l}_in [H, 1, P, Dh] float32
    outputs  logits [1, AR, V] float32 ([1, 1, AR, V] is accepted too), past_key_{l}_out [H, 1, Dh, AR] and
             past_value_{l}_out [H, 1, AR, Dh] float32: only the new entries (Genie writes them into its cache)

The prefill graph has AR = N > 1 tokens per call (N < CL), the decode graph AR = 1; both share CL, H, Dh,
L and V. Genie refuses another KV layout ("Could not determine whether KV$ uses Scatter or Concat") and
feeds no other input.

``harness/runner/llm_runner.py`` (device side, no harness imports) repeats these names; a test keeps
the two in step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import onnx

from harness.errors import ModelError

__all__ = [
    "ATTENTION_MASK",
    "INPUT_IDS",
    "KV_NAME",
    "LOGITS",
    "MASK_ATTEND",
    "MASK_BLOCKED",
    "POSITION_IDS",
    "GraphInfo",
    "PairInfo",
    "check_graph",
    "check_pair",
    "past_key_in",
    "past_key_out",
    "past_value_in",
    "past_value_out",
]

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOGITS = "logits"
MASK_ATTEND = 0.0
MASK_BLOCKED = -1000.0
KV_NAME = re.compile(r"^past_(key|value)_(\d+)_(in|out)$")

_INT32, _FLOAT = onnx.TensorProto.INT32, onnx.TensorProto.FLOAT


def past_key_in(layer: int) -> str:
    """Return the name of layer's past-keys input."""
    return f"past_key_{layer}_in"


def past_value_in(layer: int) -> str:
    """Return the name of layer's past-values input."""
    return f"past_value_{layer}_in"


def past_key_out(layer: int) -> str:
    """Return the name of layer's new-keys output."""
    return f"past_key_{layer}_out"


def past_value_out(layer: int) -> str:
    """Return the name of layer's new-values output."""
    return f"past_value_{layer}_out"


@dataclass(frozen=True)
class GraphInfo:
    """What one graph of the pair declares."""

    file: str
    ar: int
    context_length: int
    layers: int
    heads: int
    head_dim: int
    vocab: int
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


@dataclass(frozen=True)
class PairInfo:
    """The dimensions a valid prefill/decode pair shares, and its tensor names (in convention order)."""

    layers: int
    heads: int
    head_dim: int
    context_length: int
    prefill_ar: int
    vocab: int
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: int
    shape: tuple  # ints, or the dim_param strings of dynamic dims


def _tensors(values: list[onnx.ValueInfoProto]) -> dict[str, _Tensor]:
    """Return the graph inputs/outputs by name."""
    out = {}
    for v in values:
        t = v.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim)
        out[v.name] = _Tensor(v.name, t.elem_type, shape)
    return out


def _fmt(shape: tuple) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _dtype_name(dtype: int) -> str:
    return onnx.helper.tensor_dtype_to_np_dtype(dtype).name if dtype else "undefined"


class _Checker:
    """Validates one graph's tensors against the convention, raising ModelError naming the file."""

    def __init__(self, file: str, inputs: dict[str, _Tensor], outputs: dict[str, _Tensor]) -> None:
        self.file, self.inputs, self.outputs = file, inputs, outputs

    def fail(self, message: str) -> None:
        """Raise ModelError with the file's name in front."""
        raise ModelError(f"{self.file}: {message}")

    def tensor(self, name: str, kind: str, dtype: int, layout: str, meaning: str) -> _Tensor:
        """Return the named input/output; fail if it is missing, has the wrong dtype or a dynamic shape."""
        table = self.inputs if kind == "input" else self.outputs
        t = table.get(name)
        if t is None:
            have = ", ".join(sorted(table)) or "none"
            self.fail(f"no {kind} '{name}'; Genie expects {kind} '{name}' {layout} ({meaning}). "
                      f"The graph's {kind}s are: {have}")
        if t.dtype != dtype:
            self.fail(f"{kind} '{name}' is {_dtype_name(t.dtype)}; Genie expects {_dtype_name(dtype)} {layout}")
        if any(not isinstance(d, int) or d <= 0 for d in t.shape):
            self.fail(f"{kind} '{name}' has shape {_fmt(t.shape)} with a dynamic or empty dim; Genie needs "
                      f"static shapes {layout} ({meaning}): fix the dims before export")
        return t

    def expect(self, t: _Tensor, kind: str, what: str, layout: str, want: tuple, meaning: str) -> None:
        """Fail unless t's shape equals want, naming the layout letters and the numbers they stand for."""
        if tuple(t.shape) != tuple(want):
            self.fail(f"{kind} '{t.name}' has shape {_fmt(t.shape)}; Genie expects {what} as {layout} = "
                      f"{_fmt(want)} ({meaning})")


def _ar_and_cl(c: _Checker) -> tuple[int, int]:
    """Return (AR, CL) from input_ids and attention_mask."""
    ids = c.tensor(INPUT_IDS, "input", _INT32, "[1, AR]", "batch 1, tokens per call")
    if len(ids.shape) != 2 or ids.shape[0] != 1:
        c.fail(f"input '{INPUT_IDS}' has shape {_fmt(ids.shape)}; Genie expects token ids as [1, AR] "
               "(batch 1, tokens per call)")
    ar = ids.shape[1]
    mask = c.tensor(ATTENTION_MASK, "input", _FLOAT, "[1, 1, AR, CL]", "additive mask: AR new tokens x CL slots")
    if len(mask.shape) != 4 or mask.shape[:3] != (1, 1, ar):
        c.fail(f"input '{ATTENTION_MASK}' has shape {_fmt(mask.shape)}; Genie expects the attention mask as "
               f"[1, 1, AR, CL] = [1, 1, {ar}, CL] (batch 1, 1, AR = {ar} new tokens as in '{INPUT_IDS}', "
               "CL = context length: past slots then new tokens)")
    cl = mask.shape[3]
    if cl <= ar:
        c.fail(f"input '{ATTENTION_MASK}' has shape {_fmt(mask.shape)}: the context length CL = {cl} must exceed "
               f"the AR = {ar} tokens per call (Genie keeps CL-AR past slots); export with AR < CL")
    pos = c.tensor(POSITION_IDS, "input", _INT32, "[1, AR]", "absolute positions")
    c.expect(pos, "input", "positions", "[1, AR]", (1, ar), f"batch 1, AR = {ar} absolute positions")
    return ar, cl


def _kv_names(c: _Checker) -> dict[tuple[str, str], set[int]]:
    """Return the layer indices of the KV tensors found, by (key|value, in|out); fail on a misplaced one."""
    found: dict[tuple[str, str], set[int]] = {}
    for kind, table in (("input", c.inputs), ("output", c.outputs)):
        for name in table:
            m = KV_NAME.match(name)
            if m is None:
                continue
            if (m.group(3) == "in") != (kind == "input"):
                c.fail(f"{kind} '{name}' is named as an {'input' if m.group(3) == 'in' else 'output'}; Genie "
                       "expects past_*_{l}_in as inputs and past_*_{l}_out as outputs")
            found.setdefault((m.group(1), m.group(3)), set()).add(int(m.group(2)))
    return found


def _layer_indices(c: _Checker) -> int:
    """Return the layer count L; fail on no KV tensors, numbering gaps and an _in without its _out (or back)."""
    found = _kv_names(c)
    every = set().union(*found.values()) if found else set()
    if not every:
        c.fail("no KV cache tensors: Genie expects inputs past_key_{l}_in [H, 1, Dh, CL-AR] and "
               "past_value_{l}_in [H, 1, CL-AR, Dh], outputs past_key_{l}_out and past_value_{l}_out, l = 0..L-1")
    layers = max(every) + 1
    gaps = sorted(set(range(layers)) - every)
    if gaps:
        c.fail(f"KV tensors are numbered up to layer {layers - 1} but layer(s) {', '.join(map(str, gaps))} have "
               "none: Genie expects layers numbered 0..L-1 without gaps")
    for l in range(layers):
        for kv in ("key", "value"):
            has_in, has_out = l in found.get((kv, "in"), ()), l in found.get((kv, "out"), ())
            if has_in and not has_out:
                c.fail(f"input 'past_{kv}_{l}_in' has no matching output 'past_{kv}_{l}_out': Genie needs each "
                       "layer's new entries as an output to write into its cache")
            if has_out and not has_in:
                c.fail(f"output 'past_{kv}_{l}_out' has no matching input 'past_{kv}_{l}_in': Genie feeds each "
                       "layer's cache as an input")
            if not has_in:
                c.fail(f"layer {l} has no 'past_{kv}_{l}_in' input nor 'past_{kv}_{l}_out' output (the graph has "
                       f"KV tensors for {layers} layers); Genie needs past_key and past_value, _in and _out, "
                       "for every layer")
    return layers


def _unexpected(c: _Checker, layers: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Return (input names, output names) in convention order; fail on any tensor Genie would not use."""
    ins = (INPUT_IDS, ATTENTION_MASK, POSITION_IDS) + tuple(
        n for l in range(layers) for n in (past_key_in(l), past_value_in(l)))
    outs = (LOGITS,) + tuple(n for l in range(layers) for n in (past_key_out(l), past_value_out(l)))
    for kind, table, known in (("input", c.inputs, ins), ("output", c.outputs, outs)):
        extra = sorted(set(table) - set(known))
        if extra:
            c.fail(f"unexpected {kind}(s) {', '.join(extra)}: Genie "
                   f"{'feeds only' if kind == 'input' else 'reads only'} {', '.join(known[:4])}"
                   f"{', ...' if len(known) > 4 else ''} (remove {'them' if len(extra) > 1 else 'it'} from the graph)")
    return ins, outs


def _kv_dims(c: _Checker, past: int) -> tuple[int, int]:
    """Return (H, Dh) as layer 0's keys declare them (reading through a swapped Dh/past pair), else its values."""
    key = c.tensor(past_key_in(0), "input", _FLOAT, "[H, 1, Dh, CL-AR]", "heads, 1, head dim, past context")
    value = c.tensor(past_value_in(0), "input", _FLOAT, "[H, 1, CL-AR, Dh]", "heads, 1, past context, head dim")
    if len(key.shape) == 4:
        _, _, a, b = key.shape
        return key.shape[0], b if (a == past and b != past) else a
    if len(value.shape) == 4:
        _, _, a, b = value.shape
        return value.shape[0], a if (b == past and a != past) else b
    return key.shape[0] if key.shape else 0, 0


def _check_kv(c: _Checker, layers: int, ar: int, cl: int) -> tuple[int, int]:
    """Check every layer's KV inputs and outputs; return (H, Dh)."""
    past = cl - ar
    h, dh = _kv_dims(c, past)
    dims = f"H = {h} heads, Dh = {dh}, CL-AR = {cl}-{ar} = {past} past slots, AR = {ar} new"
    for l in range(layers):
        for name, kind, what, layout, want, meaning in (
                (past_key_in(l), "input", "keys", "[H, 1, Dh, CL-AR]", (h, 1, dh, past),
                 "heads, 1, head dim, past context"),
                (past_value_in(l), "input", "values", "[H, 1, CL-AR, Dh]", (h, 1, past, dh),
                 "heads, 1, past context, head dim"),
                (past_key_out(l), "output", "new keys", "[H, 1, Dh, AR]", (h, 1, dh, ar),
                 "heads, 1, head dim, new tokens only"),
                (past_value_out(l), "output", "new values", "[H, 1, AR, Dh]", (h, 1, ar, dh),
                 "heads, 1, new tokens only, head dim")):
            t = c.tensor(name, kind, _FLOAT, layout, meaning)
            c.expect(t, kind, what, layout, want, f"{meaning}; {dims}")
    return h, dh


def _vocab(c: _Checker, ar: int) -> int:
    """Return V from the logits output ([1, AR, V] or [1, 1, AR, V])."""
    t = c.tensor(LOGITS, "output", _FLOAT, "[1, AR, V]", "batch 1, tokens per call, vocabulary")
    vocab = t.shape[-1] if t.shape else 0
    if tuple(t.shape) not in ((1, ar, vocab), (1, 1, ar, vocab)):
        c.expect(t, "output", "logits", "[1, AR, V]", (1, ar, vocab), f"batch 1, AR = {ar} tokens, V = vocabulary")
    return vocab


def external_bytes(path: Path) -> int:
    """Return the bytes of the graph's weights held in external data files (0 for a one-file graph)."""
    model = onnx.load(str(path), load_external_data=False)
    return sum(int(e.value) for t in model.graph.initializer for e in t.external_data if e.key == "length")


def _load_io(path: Path) -> tuple[dict[str, _Tensor], dict[str, _Tensor]]:
    """Return (inputs, outputs) of the ONNX file at path, initializers left out of the inputs."""
    if not path.is_file():
        raise ModelError(f"{path}: no such file (expected an ONNX graph of Genie's prefill/decode pair)")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # onnx raises DecodeError and others
        raise ModelError(f"{path.name}: not a readable ONNX model ({type(e).__name__}: {e})") from e
    inits = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in inits]
    return _tensors(inputs), _tensors(list(model.graph.output))


def check_graph(path: Path) -> GraphInfo:
    """Return what the graph at path declares; raise ModelError if it breaks Genie's convention."""
    path = Path(path)
    c = _Checker(path.name, *_load_io(path))
    ar, cl = _ar_and_cl(c)
    layers = _layer_indices(c)
    ins, outs = _unexpected(c, layers)
    heads, head_dim = _check_kv(c, layers, ar, cl)
    vocab = _vocab(c, ar)
    return GraphInfo(path.name, ar, cl, layers, heads, head_dim, vocab, ins, outs)


def _agree(prefill: GraphInfo, decode: GraphInfo) -> None:
    """Raise ModelError if the two graphs disagree on a shared dimension."""
    for attr, meaning in (("context_length", "context length CL"), ("layers", "layer count L"),
                          ("heads", "head count H"), ("head_dim", "head dim Dh"), ("vocab", "vocabulary V")):
        a, b = getattr(prefill, attr), getattr(decode, attr)
        if a != b:
            raise ModelError(f"{prefill.file} and {decode.file} disagree on the {meaning}: {a} in {prefill.file}, "
                             f"{b} in {decode.file}; Genie needs one model exported twice (AR-N and AR-1)")


def check_pair(prefill: Path, decode: Path) -> PairInfo:
    """Return the pair's shared dimensions; raise ModelError naming the file, tensor, shape found and the
    layout expected if either graph breaks Genie's convention or the two disagree."""
    p, d = check_graph(Path(prefill)), check_graph(Path(decode))
    if d.ar != 1 and p.ar == 1:
        raise ModelError(f"{p.file} takes 1 token per call and {d.file} {d.ar}: the files look swapped "
                         "(the prefill graph is AR-N, the decode graph AR-1)")
    if d.ar != 1:
        raise ModelError(f"{d.file}: input '{INPUT_IDS}' has shape [1, {d.ar}]; Genie expects the decode graph "
                         "to take one token per call: [1, AR] = [1, 1]")
    if p.ar >= p.context_length:  # unreachable through check_graph; kept for a clear message if that changes
        raise ModelError(f"{p.file}: AR = {p.ar} tokens per call is not below the context length "
                         f"CL = {p.context_length}")
    _agree(p, d)
    return PairInfo(layers=p.layers, heads=p.heads, head_dim=p.head_dim, context_length=p.context_length,
                    prefill_ar=p.ar, vocab=p.vocab, input_names=p.input_names, output_names=p.output_names)
