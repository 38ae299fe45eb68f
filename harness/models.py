"""Models under test: the built-in zoo, user ONNX files and YAML model specs; shape fixing."""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.errors import ConfigError, ModelError
from harness.evaluation.spec import DEFAULT_MIN_RATIO, Evaluation, EvaluationSection, resolve_evaluation
from harness.user_code import spec_relative

if TYPE_CHECKING:
    import onnx

# digits_imbalanced: digits_cnn with channel ranges 8-bit weights miss (harness.zoo)
ZOO_MODELS = ("digits_cnn", "digits_imbalanced", "tiny_gpt")
LLM_ZOO_MODELS = ("tiny_gpt",)  # built-in models of kind "llm"
MODEL_KINDS = ("onnx", "llm")


class Thresholds(BaseModel):
    """KPI limits for one model; every field has a default a user may override in the spec."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_task_metric_drop: float | None = Field(0.02, ge=0, description="allowed drop of the task metric, PTQ vs "
                                                                       "float (None: not judged)")
    min_task_metric_ratio: float | None = Field(None, gt=0, allow_inf_nan=False,
                                                description="quantized task metric / float's (MLPerf's form; "
                                                            "the evaluation section's min_ratio_to_float)")
    min_cosine_similarity: float | None = Field(0.98, ge=-1, le=1, description="quantized vs float outputs "
                                                                               "(None: recorded, not judged)")
    min_sqnr_db: float | None = Field(15.0, description="quantized vs float outputs (None: recorded, not judged)")
    float_atol: float = Field(1e-4, ge=0, description="device float run vs host reference, absolute")
    float_rtol: float = Field(1e-3, ge=0, description="device float run vs host reference, relative")
    memory_budget_mb: float = Field(256.0, gt=0, description="weights plus the largest activation (an LLM's "
                                    "weights, KV cache and activation: only where the spec sets it, else the "
                                    "SoC's LLM budget)")
    min_htp_fraction: float = Field(1.0, ge=0, le=1, description="share of nodes the HTP must run")
    latency_budget_ms: float | None = Field(None, gt=0, allow_inf_nan=False, strict=True,
                                            description="on-device latency budget (profile step), ms")
    max_promoted_tensors: int = Field(8, ge=0, description="most activations mixed precision may promote to 16-bit")
    # Step 7, validation (harness/steps/sustained.py, energy.py, concurrency.py)
    min_stability_pct: float = Field(30.0, ge=0, le=100, description="sustained: worst window throughput / best, %")
    max_temp_c: float = Field(100.0, description="sustained: hottest thermal zone, °C (Qualcomm's HAL: NPU SEVERE at 100)")
    max_skin_temp_c: float = Field(45.0, description="sustained: hottest skin/board zone, °C")
    throttling_margin: float = Field(0.15, gt=0, description="sustained: a window's p50 this much above the first "
                                                             "window's marks throttling onset")
    cooldown_margin_c: float = Field(3.0, gt=0, description="cooldown: within this many °C of the idle temperature")
    max_energy_per_inference_mj: float | None = Field(None, gt=0, allow_inf_nan=False,
                                                      description="energy: above-idle energy per inference, mJ")
    max_latency_degradation: float | None = Field(None, gt=0, allow_inf_nan=False,
                                                  description="concurrency: concurrent p50 / solo p50 per session "
                                                              "(default 1.5 x the session count)")
    # Baselines and regression gates (harness/baseline.py, harness/steps/regression.py)
    regression_accuracy_tolerance: float = Field(0.01, ge=0, allow_inf_nan=False,
                                                 description="regression: largest drop of task_metric or "
                                                             "cosine_similarity vs the baseline, absolute")
    regression_sqnr_tolerance_db: float = Field(1.0, ge=0, allow_inf_nan=False,
                                                description="regression: largest drop of sqnr_db vs the baseline, dB")
    regression_alpha: float = Field(0.05, gt=0, lt=1, description="regression: significance of the test on "
                                                                  "independent blocks (Mann-Whitney U; paired t on A/B)")
    regression_latency_threshold: float = Field(0.10, ge=0, allow_inf_nan=False,
                                                description="regression: relative change of the median latency "
                                                            "that counts (with a significant test)")
    regression_noise_k: float = Field(3.0, ge=0, allow_inf_nan=False,
                                      description="regression: a change must also exceed this many times the "
                                                  "baseline's noise floor (between-block spread)")
    regression_memory_threshold: float = Field(0.10, ge=0, allow_inf_nan=False,
                                               description="regression: relative growth of peak_rss_mb that counts")
    regression_size_threshold: float = Field(0.05, ge=0, allow_inf_nan=False,
                                             description="regression: relative growth of context_bytes that counts")
    regression_energy_threshold: float = Field(0.15, ge=0, allow_inf_nan=False,
                                               description="regression: relative growth of energy_per_inference_mj "
                                                           "that counts")
    # LLM path (harness/llm/steps.py), for models of kind "llm"
    max_perplexity: float | None = Field(None, gt=0, allow_inf_nan=False,
                                         description="llm: held-out perplexity of the shipped model on the HTP")
    max_perplexity_increase: float = Field(0.10, ge=0, allow_inf_nan=False,
                                           description="llm: HTP perplexity of the quantized pair over the host "
                                                       "float perplexity, relative (0.10: at most 10% higher)")
    max_host_htp_perplexity_gap: float = Field(0.05, ge=0, allow_inf_nan=False,
                                               description="llm: |HTP - host QDQ| / host QDQ perplexity, relative")
    min_greedy_agreement: float = Field(0.75, ge=0, le=1,
                                        description="llm: mean share of each prompt's greedy tokens that are the "
                                                    "float model's choice, up to the first that is not")
    greedy_tie_margin: float = Field(0.05, ge=0, allow_inf_nan=False,
                                     description="llm: a token is the float model's choice when its float logit "
                                                 "is within this of the top one (a near-tie; 0: exact)")
    min_genie_prefix_tokens: int = Field(4, ge=0, description="llm: Genie's first tokens of every prompt are "
                                                              "the float model's greedy choice, at least this many")
    max_time_to_first_token_ms: float | None = Field(None, gt=0, allow_inf_nan=False,
                                                     description="llm: Genie's slowest time to first token, ms")
    min_tokens_per_s: float | None = Field(None, gt=0, allow_inf_nan=False,
                                           description="llm: Genie's slowest token generation rate, tokens/s")
    max_stress_memory_growth_mb: float = Field(64.0, ge=0, allow_inf_nan=False,
                                               description="llm: Genie stress run's resident memory growth, MB")


class _LlmSpec(BaseModel):
    """The `llm:` section of a model spec of kind llm (paths relative to the spec file): a published checkpoint
    (`checkpoint:`, the graphs built by harness.llm.importer) or a pair already in Genie's convention."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: str | None = Field(None, description="a GGUF file or a Hugging Face directory (config.json, "
                                                     "*.safetensors, tokenizer.json): the pair is built from it")
    context_length: int = Field(128, ge=2, description="checkpoint: the graphs' context length CL")
    prefill_ar: int = Field(32, ge=1, description="checkpoint: the prefill graph's tokens per call (AR-N)")
    prefill: str | None = Field(None, description="the prefill graph (AR-N), ONNX, Genie's KV convention")
    decode: str | None = Field(None, description="the decode graph (AR-1), ONNX, same tensor names")
    tokenizer: str | None = Field(None, description="a Hugging Face tokenizers file (tokenizer.json)")
    eval_text: str | None = Field(None, description="held-out text for perplexity (UTF-8)")
    calib_text: str | None = Field(None, description="text whose activations calibrate quantization (UTF-8)")
    prompts: list[str] = Field(default_factory=list, description="prompts for greedy agreement and Genie (with a "
                                                                 "checkpoint: user messages in its chat template)")
    max_new_tokens: int = Field(16, ge=1, description="tokens generated per prompt")
    stop_token: str | None = Field(None, description="the end-of-text token (stops generation)")
    eval_windows: int = Field(48, ge=1, description="held-out windows of AR tokens scored for perplexity")
    kv_bits: Literal[8, 16] | None = Field(None, description="the KV cache's encoding width, 8 or 16 bits, in "
                                                             "every recipe (default: the recipe's activations')")
    recipe: Literal["w8a16", "w8a8", "w4a16"] | None = Field(
        None, description="the recipe that ships (default: the smallest whose host QDQ perplexity is decidedly "
                          "within the limits, harness.llm.shipping)")
    weight_block_size: int | None = Field(None, ge=16, multiple_of=16,
                                          description="the w4a16 recipe's linear weights in blocks of this many "
                                                      "input rows (LPBQ, as AI Hub ships w4a16; a multiple of 16 "
                                                      "dividing every linear layer's input dimension) instead of "
                                                      "one scale per output channel (the default)")


class _SpecFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    kind: str = "onnx"
    path: str | None = None
    llm: _LlmSpec | None = None
    input_shapes: dict[str, list[int]] = {}
    freeze_inputs: dict[str, float | int | list] = {}
    rewrites: list[str] = []
    calib_data: str | None = None
    evaluation: EvaluationSection | None = None
    thresholds: Thresholds = Thresholds()


@dataclass(frozen=True)
class LlmFiles:
    """A language model's files: the Genie-convention graph pair, its tokenizer and texts; or the checkpoint
    the pair is built from (prefill, decode and tokenizer then None until harness.llm.importer builds them)."""

    prefill: Path | None
    decode: Path | None
    tokenizer: Path | None
    eval_text: Path | None = None
    calib_text: Path | None = None
    prompts: tuple[str, ...] = ()
    max_new_tokens: int = 16
    stop_token: str | None = None
    checkpoint: Path | None = None
    context_length: int = 128
    prefill_ar: int = 32
    eval_windows: int = 48
    kv_bits: int | None = None  # the KV cache's encoding width (None: the recipe's activations')
    weight_block_size: int | None = None  # w4a16's linear weights block-wise (LPBQ) in blocks of this many rows
    recipe: str | None = None  # the recipe that ships, pinned (None: chosen by harness.llm.shipping)


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
    kind: str = "onnx"  # "onnx": one graph through Steps 1-7; "llm": a prefill/decode pair through the LLM path
    llm: LlmFiles | None = None  # kind "llm" from a spec file (built-in ones are built on first use)
    evaluation: Evaluation | None = None  # the spec's `evaluation:` section: labelled data and the task metric

    @property
    def is_zoo(self) -> bool:
        """True for a built-in zoo model (built on first use)."""
        return self.source == "zoo"

    @property
    def is_llm(self) -> bool:
        """True for a language model (kind llm), onboarded by the LLM suites."""
        return self.kind == "llm"


FreezeValue = Union[float, int, bool, list]


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse 'SELECTOR=D0,D1,...' into (SELECTOR, dims); raise ConfigError when malformed.

    SELECTOR is an input name or MODEL:NAME; route_input_options resolves it against the models.
    """
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d <= 0 for d in shape):
        raise ConfigError(f"--input-shape '{text}': expected NAME=D0,D1,... or MODEL:NAME=D0,D1,... with positive "
                          "integer dims, e.g. input=1,3,224,224")
    return name, shape


def _scalar(text: str) -> float | int | bool:
    word = text.strip()
    if word.lower() in {"true", "false"}:
        return word.lower() == "true"
    try:
        return int(word)
    except ValueError:
        return float(word)  # ValueError for anything that is not a number


def _is_numeric_list(value: object) -> bool:
    if isinstance(value, list):
        return bool(value) and all(_is_numeric_list(v) for v in value)
    return isinstance(value, (int, float, bool))


def parse_freeze_input(text: str) -> tuple[str, FreezeValue]:
    """Parse 'SELECTOR=VALUE' into (SELECTOR, value): a number, a comma list or a JSON (nested) list.

    Raises ConfigError when malformed; whether the value fits the input's type and shape is checked
    by the conversion step.
    """
    name, sep, raw = text.rpartition("=")
    value: FreezeValue | None = None
    try:
        if raw.strip().startswith("["):
            value = json.loads(raw)
        elif "," in raw:
            value = [_scalar(v) for v in raw.split(",")]
        elif raw.strip():
            value = _scalar(raw)
    except ValueError:  # json.JSONDecodeError is a ValueError
        value = None
    if not sep or not name or value is None or not _is_numeric_list(value):
        raise ConfigError(f"--freeze-input '{text}': expected NAME=VALUE or MODEL:NAME=VALUE with VALUE a number, "
                          "a comma list of numbers or a JSON list, e.g. sr=16000 or mask=[[1,0],[0,1]]")
    return name, value


@dataclass(frozen=True)
class ModelInputs:
    """How the command line may name one model (its name, the --model value as given) and its input names."""

    name: str
    inputs: tuple[str, ...]
    given_as: str = ""

    def named(self, text: str) -> bool:
        """True when text names this model (its name or the --model value as given)."""
        return text == self.name or (bool(self.given_as) and text == self.given_as)


V = TypeVar("V")


def route_input_options(option: str, given: list[tuple[str, V]], models: list[ModelInputs]) -> dict[str, dict[str, V]]:
    """Return {model name: {input name: value}} for --input-shape / --freeze-input values.

    A selector is first taken whole as an input name: it applies to every model with that input
    (names such as 'x.1' or 'onnx::Flatten_0' work as given). Otherwise it is MODEL:NAME, split at
    the first ':' whose left side names a model (its name as in test ids, or the --model value as
    given). A MODEL:NAME value wins over a bare NAME one for that model; among equals, the last wins.
    Raises ConfigError naming the selector and each model's inputs when it matches nothing.
    """
    bare: dict[str, dict[str, V]] = {m.name: {} for m in models}
    targeted: dict[str, dict[str, V]] = {m.name: {} for m in models}
    for selector, value in given:
        holders = [m for m in models if selector in m.inputs]
        for m in holders:
            bare[m.name][selector] = value
        if holders:
            continue
        model, name = _split_model_selector(selector, models)
        if model is None:
            raise ConfigError(_no_match_message(option, selector, models))
        if name not in model.inputs:
            raise ConfigError(f"{option} '{selector}=...': model '{model.name}' has no input '{name}' "
                              f"(its inputs: {', '.join(model.inputs) or '(none)'})")
        targeted[model.name][name] = value
    return {m.name: {**bare[m.name], **targeted[m.name]} for m in models}


def _split_model_selector(selector: str, models: list[ModelInputs]) -> tuple[ModelInputs | None, str]:
    for pos, char in enumerate(selector):
        if char == ":":
            found = next((m for m in models if m.named(selector[:pos])), None)
            if found is not None:
                return found, selector[pos + 1:]
    return None, selector


def _no_match_message(option: str, selector: str, models: list[ModelInputs]) -> str:
    inputs = "; ".join(f"{m.name}: {', '.join(m.inputs) or '(none)'}" for m in models)
    message = f"{option} '{selector}=...': no model has an input '{selector}'"
    prefix, colon, _ = selector.partition(":")
    if colon:
        message += f", and '{prefix}' names no model (models: {', '.join(m.name for m in models)})"
    return (f"{message}. Inputs per model: {inputs}. Write NAME=... for every model with input NAME, "
            f"or MODEL:NAME=... for one model")


def model_inputs(spec: ModelSpec, given_as: str = "") -> ModelInputs:
    """Return the input names of spec's model (loading and checking its ONNX file; zoo: by name)."""
    if spec.is_zoo:
        zoo = importlib.import_module(f"harness.zoo.{spec.name}")
        names: tuple[str, ...] = tuple(getattr(zoo, "INPUT_NAMES", None) or (zoo.INPUT_NAME,))
    elif spec.is_llm and spec.llm.checkpoint is not None:  # the graphs are built later: Genie's fixed inputs
        names = ("input_ids", "attention_mask", "position_ids")
    elif spec.is_llm:
        names = tuple(i.name for i in graph_inputs(load_onnx(spec.llm.prefill)))
    else:
        names = tuple(i.name for i in graph_inputs(load_onnx(spec.path)))
    return ModelInputs(spec.name, names, given_as)


def with_input_options(spec: ModelSpec, inputs: ModelInputs, shapes: dict[str, tuple[int, ...]],
                       frozen: dict[str, FreezeValue]) -> ModelSpec:
    """Return spec with command-line shapes and frozen inputs laid over its spec file's.

    Raises ConfigError when the spec file's input_shapes or freeze_inputs name an input the model lacks.
    """
    for key, entries in (("input_shapes", spec.input_shapes), ("freeze_inputs", spec.freeze_inputs)):
        unknown = [n for n in entries if n not in inputs.inputs]
        if unknown:
            raise ConfigError(f"model spec {inputs.given_as or spec.name} (model '{spec.name}'): {key} names "
                              f"{', '.join(map(repr, unknown))}, which the model does not have "
                              f"(inputs: {', '.join(inputs.inputs)})")
    return replace(spec, input_shapes={**spec.input_shapes, **shapes},
                   freeze_inputs={**spec.freeze_inputs, **frozen})


def resolve_model(text: str, input_shapes: dict[str, tuple[int, ...]], calib_data: Path | None,
                  freeze_inputs: dict[str, FreezeValue] | None = None) -> ModelSpec:
    """Return the ModelSpec for a --model value: a zoo name, an .onnx path or a .yaml spec.

    input_shapes and freeze_inputs (already routed to this model) override a spec file's.
    """
    frozen = dict(freeze_inputs or {})
    if text in ZOO_MODELS:
        return ModelSpec(name=text, source="zoo", input_shapes=input_shapes, calib_data=calib_data,
                         freeze_inputs=frozen, kind="llm" if text in LLM_ZOO_MODELS else "onnx")
    path = Path(text).expanduser()
    if path.suffix in {".yaml", ".yml"}:
        return _load_spec_file(path, input_shapes, calib_data, frozen)
    if not path.exists():
        raise ModelError(f"model '{text}': no such file, and not a built-in model "
                         f"(built-in: {', '.join(ZOO_MODELS)})")
    return ModelSpec(name=_name_from_path(path), source=str(path), path=path.resolve(),
                     input_shapes=input_shapes, calib_data=calib_data, freeze_inputs=frozen)


def resolve_models(texts: list[str], input_shapes: list[tuple[str, tuple[int, ...]]],
                   freeze_inputs: list[tuple[str, FreezeValue]], calib_data: Path | None) -> list[ModelSpec]:
    """Return the ModelSpecs for --model values, each with the --input-shape / --freeze-input values routed to it.

    Raises HarnessError (ConfigError/ModelError) for a missing or invalid model, two models sharing a
    name, or a selector that names no model or input (see route_input_options).
    """
    specs = [resolve_model(text, {}, calib_data) for text in texts]
    names = [spec.name for spec in specs]
    shared = sorted({n for n in names if names.count(n) > 1})
    if shared:
        raise ConfigError(f"two --model values share the name {shared}: test ids and MODEL: selectors need "
                          "distinct names (set `name:` in a model spec file)")
    inputs = [model_inputs(spec, text) for spec, text in zip(specs, texts)]
    shapes = route_input_options("--input-shape", input_shapes, inputs)
    frozen = route_input_options("--freeze-input", freeze_inputs, inputs)
    return [with_input_options(spec, ins, shapes[spec.name], frozen[spec.name]) for spec, ins in zip(specs, inputs)]


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


def _load_spec_file(path: Path, input_shapes: dict[str, tuple[int, ...]], calib_data: Path | None,
                    freeze_inputs: dict[str, FreezeValue]) -> ModelSpec:
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
    if spec.kind not in MODEL_KINDS:
        raise ConfigError(f"model spec {path}: kind '{spec.kind}' is not one of {', '.join(MODEL_KINDS)}")
    if spec.kind == "llm":
        return _llm_spec(path, spec, calib_data)
    if spec.path is None or spec.llm is not None:
        raise ConfigError(f"model spec {path}: a model of kind onnx needs `path:` (the ONNX file) and no `llm:` "
                          "section (set `kind: llm` for a prefill/decode pair)")
    model_path = (path.parent / spec.path).resolve()
    if not model_path.exists():
        raise ModelError(f"model spec {path}: path '{spec.path}' does not exist ({model_path})")
    shapes = {k: tuple(v) for k, v in spec.input_shapes.items()} | input_shapes
    calib = calib_data or ((path.parent / spec.calib_data).resolve() if spec.calib_data else None)
    evaluation = resolve_evaluation(spec.evaluation, path) if spec.evaluation is not None else None
    return ModelSpec(name=spec.name or _name_from_path(model_path), source=str(model_path), path=model_path,
                     input_shapes=shapes, calib_data=calib, thresholds=task_thresholds(spec.thresholds, spec.evaluation),
                     evaluation=evaluation,
                     freeze_inputs={**spec.freeze_inputs, **freeze_inputs},
                     rewrites=tuple(spec_relative(r, path.parent) for r in spec.rewrites))


def task_thresholds(thresholds: Thresholds, section: EvaluationSection | None) -> Thresholds:
    """Return thresholds judging the task metric of an evaluation section: its min_ratio_to_float (MLPerf's
    form; 0.98 when it sets neither limit) and max_drop; the output-comparison limits (cosine, SQNR) and the
    default drop limit then only where the spec's thresholds set them. Without a section, thresholds as given."""
    if section is None:
        return thresholds
    given = thresholds.model_fields_set
    ratio = section.min_ratio_to_float
    if ratio is None and section.max_drop is None and "min_task_metric_ratio" not in given:
        ratio = DEFAULT_MIN_RATIO
    update = {key: None for key in ("max_task_metric_drop", "min_cosine_similarity", "min_sqnr_db")
              if key not in given}
    if section.max_drop is not None:
        update["max_task_metric_drop"] = section.max_drop
    if ratio is not None:
        update["min_task_metric_ratio"] = ratio
    return thresholds.model_copy(update=update)


def _llm_spec(path: Path, spec: _SpecFile, calib_data: Path | None) -> ModelSpec:
    """Return the ModelSpec of a kind-llm spec file, its files resolved against the spec's folder."""
    if (spec.llm is None or spec.path is not None or spec.input_shapes or spec.freeze_inputs or spec.rewrites
            or spec.evaluation is not None):
        raise ConfigError(f"model spec {path}: a model of kind llm is described by its `llm:` section "
                          "(prefill, decode, tokenizer, eval_text, calib_text, prompts); `path`, `input_shapes`, "
                          "`freeze_inputs`, `rewrites` and `evaluation` apply to kind onnx only")
    llm = spec.llm

    def resolve(key: str, value: str | None) -> Path | None:
        if value is None:
            return None
        resolved = (path.parent / value).resolve()
        if not resolved.is_file():
            raise ModelError(f"model spec {path}: llm.{key} '{value}' does not exist ({resolved})")
        return resolved

    pair = (llm.prefill, llm.decode, llm.tokenizer)
    if (llm.checkpoint is None) == (None in pair) or (llm.checkpoint is not None and any(pair)):
        raise ConfigError(f"model spec {path}: the `llm:` section names either `checkpoint:` (a GGUF file or a "
                          "Hugging Face directory) or all of `prefill:`, `decode:` and `tokenizer:` (a pair in "
                          "Genie's convention)")
    checkpoint = None
    if llm.checkpoint is not None:
        checkpoint = (path.parent / llm.checkpoint).resolve()
        if not checkpoint.exists():
            raise ModelError(f"model spec {path}: llm.checkpoint '{llm.checkpoint}' does not exist ({checkpoint})")
    files = LlmFiles(prefill=resolve("prefill", llm.prefill), decode=resolve("decode", llm.decode),
                     tokenizer=resolve("tokenizer", llm.tokenizer), eval_text=resolve("eval_text", llm.eval_text),
                     calib_text=resolve("calib_text", llm.calib_text), prompts=tuple(llm.prompts),
                     max_new_tokens=llm.max_new_tokens, stop_token=llm.stop_token, checkpoint=checkpoint,
                     context_length=llm.context_length, prefill_ar=llm.prefill_ar, eval_windows=llm.eval_windows,
                     kv_bits=llm.kv_bits, weight_block_size=llm.weight_block_size, recipe=llm.recipe)
    return ModelSpec(name=spec.name or _name_from_path(checkpoint or files.prefill), source=str(path.resolve()),
                     path=None, calib_data=calib_data, thresholds=spec.thresholds, kind="llm", llm=files)


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

    A dim is dynamic when it has a dim_param, no value, or a value <= 0 (Paddle writes -1); each is
    fixed at its own position (exports reuse one dim_param such as '?' for different dims). Stale
    shape information is removed from the graph and its subgraphs (If/Loop/Scan bodies) before
    inference. Raises ModelError naming the input and dim that is still dynamic, a shape of the wrong
    rank, a fixed dim that --input-shape contradicts, or shape inference's own error.
    """
    from harness.convert import copy_model
    from harness.convert.shapes import dims_text, infer_shapes, is_dynamic

    fixed = copy_model(model)
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
                raise ModelError(f"{source}: input '{inp.name}' has rank {len(dims)}, --input-shape gives "
                                 f"{len(want)} dims {list(want)} (its dims: {dims_text(dims)})")
            clash = [pos for pos, (d, value) in enumerate(zip(dims, want))
                     if not is_dynamic(d) and d.dim_value != value]
            if clash:
                raise ModelError(f"{source}: input '{inp.name}' has fixed dims {dims_text(dims)}, --input-shape "
                                 f"gives {list(want)} (dim {', '.join(map(str, clash))} differs; only dynamic "
                                 "dims can be set)")
            for d, value in zip(dims, want):
                d.Clear()
                d.dim_value = value
        dynamic = [(pos, d) for pos, d in enumerate(dims) if is_dynamic(d)]
        if dynamic:
            which = ", ".join(f"{pos} ('{d.dim_param}')" if d.dim_param else
                              f"{pos} ({d.dim_value if d.HasField('dim_value') else 'unset'})" for pos, d in dynamic)
            example = ",".join("N" if is_dynamic(x) else str(x.dim_value) for x in dims)
            raise ModelError(f"{source}: input '{inp.name}' has dynamic dim(s) {which}; the HTP needs static "
                             f"shapes: pass --input-shape {inp.name}={example} with N replaced by sizes")
    try:
        return infer_shapes(fixed)
    except Exception as e:
        raise ModelError(f"{source}: shape inference failed after fixing input shapes: "
                         f"{str(e).strip().splitlines()[0]}") from None
