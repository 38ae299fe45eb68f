"""Freezing inputs: a graph input replaced by an initializer holding a user's value (--freeze-input)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from harness.convert import copy_model
from harness.convert.shapes import dims_text, is_dynamic
from harness.errors import ModelError


@dataclass(frozen=True)
class FrozenInput:
    """One input frozen to a constant: its name, type, shape and value as given."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    value: object


def frozen_array(model: onnx.ModelProto, name: str, value: object, where: str,
                 shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Return value as an array of input `name`'s dtype and shape (a scalar fills a static shape).

    shape, when given (--input-shape for the same input), must agree with the value. Raises
    ModelError naming `where` (the model), the input and the expected dtype and shape.
    """
    inits = {i.name for i in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in inits}
    if name not in inputs:
        raise ModelError(f"{where}: cannot freeze input '{name}': the model has no such input "
                         f"(inputs: {', '.join(inputs) or '(none)'})")
    tt = inputs[name].type.tensor_type
    dims = tt.shape.dim
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
    expected = f"{dtype.name} of shape {dims_text(dims)}"
    raw = np.asarray(value)
    if raw.dtype == object or raw.dtype.kind not in "biuf":
        raise ModelError(f"{where}: cannot freeze input '{name}' to {value!r}: not a number or a regular "
                         f"list of numbers (expected {expected})")
    array = raw.astype(dtype)
    if not np.array_equal(array.astype(np.float64), raw.astype(np.float64)):
        raise ModelError(f"{where}: cannot freeze input '{name}' to {value!r}: the value does not fit its type "
                         f"(expected {expected})")
    if raw.ndim == 0 and dims and not any(is_dynamic(d) for d in dims):
        array = np.full([d.dim_value for d in dims], array, dtype=dtype)
    wrong_rank = tt.HasField("shape") and array.ndim != len(dims)
    clash = not wrong_rank and tt.HasField("shape") and any(
        not is_dynamic(d) and d.dim_value != n for d, n in zip(dims, array.shape))
    if wrong_rank or clash or (shape is not None and tuple(array.shape) != tuple(shape)):
        given = f", --input-shape gives {list(shape)}" if shape is not None else ""
        raise ModelError(f"{where}: cannot freeze input '{name}': the value has shape {list(array.shape)}, "
                         f"expected {expected}{given}")
    return array


def freeze_inputs(model: onnx.ModelProto, values: dict[str, object], where: str,
                  shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[onnx.ModelProto, list[FrozenInput]]:
    """Return a copy of model whose inputs in `values` are initializers holding those values, and what
    was frozen. Raises ModelError (see frozen_array)."""
    shapes = shapes or {}
    frozen = copy_model(model)
    done = []
    for name, value in values.items():
        array = frozen_array(frozen, name, value, where, shapes.get(name))
        graph_input = next(i for i in frozen.graph.input if i.name == name)
        frozen.graph.input.remove(graph_input)
        frozen.graph.initializer.append(onnx.numpy_helper.from_array(array, name))
        done.append(FrozenInput(name, array.dtype.name, tuple(array.shape), value))
    return frozen, done
