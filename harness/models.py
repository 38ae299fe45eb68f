"""Models under test: the built-in zoo, user ONNX files and YAML model specs; shape fixing."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.errors import ConfigError, ModelError

if TYPE_CHECKING:
    import onnx

ZOO_MODELS = ("digits_cnn",)


class Thresholds(BaseModel):
    """KPI limits for one model; every field has a default a user may override in the spec."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_task_metric_drop: float = Field(0.02, ge=0, description="allowed drop of the task metric, PTQ vs float")
    min_cosine_similarity: float = Field(0.98, ge=-1, le=1, description="quantized vs float outputs")
    min_sqnr_db: float = Field(15.0, description="quantized vs float outputs")
    float_atol: float = Field(1e-4, ge=0, description="device float run vs host reference, absolute")
    float_rtol: float = Field(1e-3, ge=0, description="device float run vs host reference, relative")
    memory_budget_mb: float = Field(256.0, gt=0, description="weights plus the largest activation")
    min_htp_fraction: float = Field(1.0, ge=0, le=1, description="share of nodes the HTP must run")
    latency_budget_ms: float | None = Field(None, gt=0, allow_inf_nan=False, strict=True,
                                            description="on-device latency budget (profile step), ms")
    max_promoted_tensors: int = Field(8, ge=0, description="most activations mixed precision may promote to 16-bit")


class _SpecFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    path: str
    input_shapes: dict[str, list[int]] = {}
    freeze_inputs: dict[str, float | int | list] = {}
    rewrites: list[str] = []
    calib_data: str | None = None
    thresholds: Thresholds = Thresholds()


@dataclass(frozen=True)
class ModelSpec:
    """What the harness knows about one model under test."""

    name: str
    source: str  # "zoo" or a file path
    path: Path | None = None
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    calib_data: Path | None = None
    thresholds: Thresholds = Thresholds()
    # Inputs frozen to constants before conversion (--freeze-input NAME=VALUE, spec `freeze_inputs:`),
    # so that branches on them fold away; a scalar or a nested list, cast to the input's type.
    freeze_inputs: dict[str, float | int | list] = field(default_factory=dict)
    # User layer replacements: "package.module:function" or "path/to/file.py:function" (spec `rewrites:`).
    rewrites: tuple[str, ...] = ()

    @property
    def is_zoo(self) -> bool:
        """True for a built-in zoo model (built on first use)."""
        return self.source == "zoo"


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse 'NAME=D0,D1,...' into (NAME, dims); raise ConfigError when malformed."""
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d <= 0 for d in shape):
        raise ConfigError(f"--input-shape '{text}': expected NAME=D0,D1,... with positive integer dims, "
                          "e.g. input=1,3,224,224")
    return name, shape


def resolve_model(text: str, input_shapes: dict[str, tuple[int, ...]], calib_data: Path | None) -> ModelSpec:
    """Return the ModelSpec for a --model value: a zoo name, an .onnx path or a .yaml spec."""
    if text in ZOO_MODELS:
        return ModelSpec(name=text, source="zoo", input_shapes=input_shapes, calib_data=calib_data)
    path = Path(text).expanduser()
    if path.suffix in {".yaml", ".yml"}:
        return _load_spec_file(path, input_shapes, calib_data)
    if not path.exists():
        raise ModelError(f"model '{text}': no such file, and not a built-in model "
                         f"(built-in: {', '.join(ZOO_MODELS)})")
    return ModelSpec(name=_name_from_path(path), source=str(path), path=path.resolve(),
                     input_shapes=input_shapes, calib_data=calib_data)


def _name_from_path(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem)


def _spec_model_name(data: object, spec_path: Path) -> str:
    """The model a (possibly invalid) spec describes: its name, else its model file's stem."""
    if isinstance(data, dict):
        if data.get("name"):
            return str(data["name"])
        if data.get("path"):
            return _name_from_path(Path(str(data["path"])))
    return _name_from_path(spec_path)


def _load_spec_file(path: Path, input_shapes: dict[str, tuple[int, ...]], calib_data: Path | None) -> ModelSpec:
    try:
        data = yaml.safe_load(path.read_text())
        spec = _SpecFile.model_validate(data)
    except OSError as e:
        raise ConfigError(f"model spec {path}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"model spec {path}: not valid YAML: {e}") from None
    except ValidationError as e:
        where = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        raise ConfigError(f"model spec {path}: {where} (model '{_spec_model_name(data, path)}')") from None
    model_path = (path.parent / spec.path).resolve()
    if not model_path.exists():
        raise ModelError(f"model spec {path}: path '{spec.path}' does not exist ({model_path})")
    shapes = {k: tuple(v) for k, v in spec.input_shapes.items()} | input_shapes
    calib = calib_data or ((path.parent / spec.calib_data).resolve() if spec.calib_data else None)
    return ModelSpec(name=spec.name or _name_from_path(model_path), source=str(model_path), path=model_path,
                     input_shapes=shapes, calib_data=calib, thresholds=spec.thresholds,
                     freeze_inputs=dict(spec.freeze_inputs), rewrites=tuple(spec.rewrites))


def load_onnx(path: Path) -> "onnx.ModelProto":
    """Return the parsed, checked ONNX model at path; raise ModelError naming the file otherwise."""
    import onnx

    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    try:
        model = onnx.load(str(path))
    except Exception as e:  # protobuf DecodeError and friends
        raise ModelError(f"{path} is not an ONNX model (protobuf parse failed: {type(e).__name__})") from None
    if not model.graph.node:
        raise ModelError(f"{path} is not an ONNX model (no graph nodes)")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0]
        raise ModelError(f"{path}: the ONNX checker rejected the model: {first}") from None
    return model


def graph_inputs(model: "onnx.ModelProto") -> "list[onnx.ValueInfoProto]":
    """Return the real inputs of the graph (initializers excluded)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def fix_input_shapes(model: "onnx.ModelProto", shapes: dict[str, tuple[int, ...]], source: str) -> "onnx.ModelProto":
    """Return a copy of model with every input dim fixed (by position) and shapes re-inferred.

    Raises ModelError naming the input and dim that is still dynamic, or a shape of the wrong rank.
    """
    import onnx

    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    names = [i.name for i in graph_inputs(fixed)]
    unknown = [n for n in shapes if n not in names]
    if unknown:
        raise ModelError(f"{source}: --input-shape names {', '.join(unknown)}, which the model does not have "
                         f"(inputs: {', '.join(names)})")
    for inp in graph_inputs(fixed):
        dims = inp.type.tensor_type.shape.dim
        if inp.name in shapes:
            want = shapes[inp.name]
            if len(want) != len(dims):
                raise ModelError(f"{source}: input '{inp.name}' has rank {len(dims)}, "
                                 f"--input-shape gives {len(want)} dims {list(want)}")
            for d, value in zip(dims, want):
                if d.HasField("dim_value") and d.dim_value != value:
                    raise ModelError(f"{source}: input '{inp.name}' has fixed dims "
                                     f"{[x.dim_value or x.dim_param for x in dims]}, --input-shape gives {list(want)}")
                d.Clear()
                d.dim_value = value
        dynamic = [(pos, d.dim_param) for pos, d in enumerate(dims)
                   if not d.HasField("dim_value") or d.dim_value <= 0]
        if dynamic:
            which = ", ".join(f"{pos} ('{param}')" if param else f"{pos}" for pos, param in dynamic)
            example = ",".join(str(x.dim_value) if x.HasField("dim_value") and x.dim_value > 0 else "N"
                               for x in dims)
            raise ModelError(f"{source}: input '{inp.name}' has dynamic dim(s) {which}; the HTP needs static "
                             f"shapes: pass --input-shape {inp.name}={example} with N replaced by sizes")
    del fixed.graph.value_info[:]
    for out in fixed.graph.output:
        for d in out.type.tensor_type.shape.dim:
            if not d.HasField("dim_value"):
                d.Clear()
    try:
        return onnx.shape_inference.infer_shapes(fixed, strict_mode=True, data_prop=True)
    except Exception as e:
        raise ModelError(f"{source}: shape inference failed after fixing input shapes: "
                         f"{str(e).strip().splitlines()[0]}") from None
