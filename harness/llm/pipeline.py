"""The LLM pipeline (models of kind llm): the graph pair's artifacts and step reports.

A sibling of harness.pipeline.Onboarding (the single-graph pipeline) on the same base (harness.pipeline_base:
target, runner, cache, Step 7's options, memoisation); the session builds one or the other by the model's kind.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx

from harness import model_sources
from harness.cache import content_key
from harness.errors import ConfigError, ModelError, StepError
from harness.llm import (blockwise, calibration, ceiling, convention, genie_steps, importer, reference, shipping,
                         steps, text)
from harness.llm.device import FloatJudge, host_forced_top1, host_nll
from harness.llm.genie_config import write_bundle
from harness.llm.steps import GRAPHS, Pair
from harness.models import LlmFiles
from harness.pipeline_base import PipelineBase, memoized
from harness.steps import context_binary, conversion, feasibility, ptq
from harness.steps.report import StepReport

CALIBRATION_SEQUENCES = 8
PROTOBUF_LIMIT = 2**31  # bytes: protobuf cannot serialize a message of this size


class LlmOnboarding(PipelineBase):
    """Artifacts and step reports of a kind-llm model for one target."""

    def _require_llm(self) -> None:
        if not self.target.model.is_llm:
            raise ConfigError(f"model '{self.target.model.name}' is of kind {self.target.model.kind}: the LLM "
                              "path needs a prefill/decode pair (kind: llm)")

    @memoized
    def llm_files(self) -> LlmFiles:
        """The model's files (the built-in model trained, exported and cached on first use; a checkpoint's pair
        built and cached on first use)."""
        self._require_llm()
        files = model_sources.llm_files(self.target.model, self.cache)
        return importer.import_files(files, self.cache) if files.checkpoint is not None else files

    @memoized
    def llm_source_pair(self) -> convention.PairInfo:
        """The pair as given, checked against Genie's convention (ModelError naming the tensor otherwise)."""
        files = self.llm_files()
        return convention.check_pair(files.prefill, files.decode)

    @memoized
    def llm_tokenizer(self):
        """The model's tokenizer (ModelError when the file does not load or is too large for the logits)."""
        return text.load_tokenizer(self.llm_files().tokenizer, self.llm_source_pair().vocab)

    def _graph_spec(self, name: str):
        files = self.llm_files()
        path = files.prefill if name == "prefill" else files.decode
        return replace(self.target.model, name=f"{self.target.model.name}-{name}", source=str(path), path=path)

    @memoized
    def _weights_past_protobuf(self) -> int:
        """Return the bytes of the source pair's external weights when they are past protobuf's 2 GiB (else 0;
        read once: a one-file graph is parsed whole, 650 MB for SmolLM2)."""
        weights = convention.external_bytes(self.llm_files().prefill)
        return weights if weights >= PROTOBUF_LIMIT else 0

    @memoized
    def llm_too_large(self) -> str:
        """Why Step 2 cannot convert the pair ('' when it can): a pair of the user's own whose weights are past
        protobuf's 2 GiB, which the ONNX conversion holds in one message. A pair the harness built from a
        checkpoint is kept as built instead (llm_conversions)."""
        files, pair = self.llm_files(), self.llm_source_pair()
        weights = self._weights_past_protobuf()
        if not weights or files.checkpoint is not None:
            return ""
        return (f"{files.prefill}: the pair's float32 weights are {weights / 1e9:.2f} GB (in external data), past "
                f"protobuf's 2 GiB within which Step 2's ONNX conversion works: converting a pair this large "
                f"({pair.layers} layers, vocabulary {pair.vocab}) is not supported; name its checkpoint instead "
                "(`llm.checkpoint:`), whose graphs the harness builds in Genie's convention itself")

    @memoized
    def llm_conversions(self) -> dict[str, StepReport]:
        """Step 2 on each graph: shape fixing, folding, the GELU fused (cached per graph); the graphs of an
        imported checkpoint past protobuf's 2 GiB kept as the harness built them (static, nothing to fuse)."""
        if too_large := self.llm_too_large():
            raise ModelError(too_large)
        if weights := self._weights_past_protobuf():
            files = self.llm_files()
            return {name: steps.as_built(files.prefill if name == "prefill" else files.decode, weights)
                    for name in GRAPHS}
        out = {}
        for name in GRAPHS:
            spec = self._graph_spec(name)
            fixed = conversion.fixed_shape_model(spec.path, spec, self.cache)
            out[name] = conversion.convert(spec.path, fixed, spec, self.cache)
        return out

    @memoized
    def llm_float_pair(self) -> Pair:
        """The converted float pair."""
        reports = self.llm_conversions()
        for name, report in reports.items():
            if not report.passed or "model" not in report.artifacts:
                raise StepError(f"conversion of the {name} graph did not pass: {(report.problems() or ['?'])[0]}")
        return Pair(reports["prefill"].artifacts["model"], reports["decode"].artifacts["model"])

    @memoized
    def llm_pair(self) -> convention.PairInfo:
        """The converted pair's dims (still Genie's convention)."""
        pair = self.llm_float_pair()
        return convention.check_pair(pair.prefill, pair.decode)

    @memoized
    def llm_calibration(self) -> calibration.PairCalibration:
        """Both graphs' float calls on the calibration text, teacher-forced through the KV loop."""
        files = self.llm_files()
        ids = text.token_ids(self.llm_tokenizer(), text.read_text(files.calib_text, "calib"))
        pair = self.llm_float_pair()
        try:
            return calibration.calibrate_pair(pair.prefill, pair.decode, ids, sequences=CALIBRATION_SEQUENCES)
        except ValueError as e:
            raise ConfigError(f"calibration text {files.calib_text}: {e}") from None

    def llm_quantized_graph(self, recipe: str, graph: str) -> Path:
        """One graph ('prefill' or 'decode') quantized with `recipe` (w8a16, w8a8, w4a16) and the encodings both
        graphs share; with the spec's llm.weight_block_size, w4a16's linear weights block-wise (LPBQ) instead of
        per output channel. Each graph is quantized when first asked: a recipe judged on perplexity alone needs
        only its prefill graph (SmolLM2's decode graph took 45 s to quantize per recipe)."""
        key = f"llm_quantized_{recipe}_{graph}"
        if key not in self._memo:
            cal, floats = self.llm_calibration(), self.llm_float_pair()
            files = self.llm_files()
            quant = calibration.pair_recipe(recipe, cal, self.llm_pair(), floats.prefill,
                                            per_channel_weights=files.checkpoint is not None, kv_bits=files.kv_bits)
            path = ptq.quantize(floats.graph(graph), cal.feeds(graph), quant, self.cache)
            if recipe in calibration.FOUR_BIT_WEIGHTS and files.weight_block_size:
                path = blockwise.lpbq_graph(path, floats.graph(graph), files.weight_block_size, self.cache)
            self._memo[key] = path
        return self._memo[key]

    def llm_quantized(self, recipe: str) -> Pair:
        """The pair quantized with `recipe` (llm_quantized_graph of both graphs)."""
        return Pair(*(self.llm_quantized_graph(recipe, g) for g in GRAPHS))

    @memoized
    def llm_kv_bytes(self) -> int:
        """The bytes of one KV cache element in the shipped pair, as its decode graph encodes it (read once: the
        graph may be hundreds of MB)."""
        return calibration.kv_bytes_of(self.llm_quantized(self.llm_recipe).decode)

    @memoized
    def llm_eval_ids(self) -> np.ndarray:
        """The held-out text's token ids (perplexity windows, the stress run's prompts)."""
        return text.token_ids(self.llm_tokenizer(), text.read_text(self.llm_files().eval_text, "eval"))

    @memoized
    def llm_eval_windows(self) -> np.ndarray:
        """The held-out text's perplexity windows [N, AR]."""
        return text.nll_windows(self.llm_eval_ids(), self.llm_pair().prefill_ar, self.llm_files().eval_windows)

    @memoized
    def llm_host_nll(self) -> dict[str, dict]:
        """host_nll on the held-out windows of the float pair ("float") and of each recipe's QDQ emulation."""
        windows = self.llm_eval_windows()
        out = {"float": host_nll(self.llm_float_pair().prefill, windows)}
        for name in calibration.LLM_RECIPES:
            out[name] = host_nll(self.llm_quantized_graph(name, "prefill"), windows, emulate_qdq=True)
        return out

    @memoized
    def llm_judge(self) -> FloatJudge:
        """The float pair on the host, judging quantized tokens (greedy_tie_margin)."""
        floats = self.llm_float_pair()
        return FloatJudge(floats.prefill, floats.decode, self.target.model.thresholds.greedy_tie_margin)

    @memoized
    def llm_float_answers(self) -> list[list[int]]:
        """The float model's greedy answer to each prompt (max_new_tokens, up to the stop token)."""
        files = self.llm_files()
        stop = text.stop_id(files, self.llm_tokenizer())
        return [r["generated_ids"] for r in self.llm_judge().generate([p.ids for p in self.llm_prompts()],
                                                                       files.max_new_tokens, stop)]

    def llm_host_agreement(self, recipe: str) -> dict:
        """The recipe's greedy agreement in the host's QDQ emulation, teacher-forced, in looks
        (steps.staged_agreement)."""
        prompts, reference, pair = self.llm_prompts(), self.llm_float_answers(), self.llm_quantized(recipe)
        forced = steps.forced_sequences(prompts, reference)
        return steps.staged_agreement(self.llm_judge(), prompts, reference,
                                      self.target.model.thresholds.min_greedy_agreement,
                                      lambda start, end: host_forced_top1(pair.prefill, pair.decode,
                                                                          forced[start:end]))[0]

    @memoized
    def llm_recipe_choice(self) -> shipping.RecipeChoice:
        """The recipe that ships and why (harness.llm.shipping), from the host's QDQ runs of every recipe."""
        host = self.llm_host_nll()
        return shipping.choose_recipe(host["float"], {n: host[n] for n in calibration.LLM_RECIPES},
                                      self.target.model.thresholds, self.llm_files().recipe, self.llm_host_agreement)

    @property
    def llm_recipe(self) -> str:
        """The recipe that ships: the spec's llm.recipe, else llm_recipe_choice's."""
        return self.llm_files().recipe or self.llm_recipe_choice().recipe

    # ------------------------------------------------------------------ steps

    @memoized
    def llm_conversion(self) -> StepReport:
        """LLM Step 2: both graphs converted, the pair still in Genie's convention; an imported checkpoint's float
        pair against the independent reference (transformers) on the prompts."""
        files = self.llm_files()
        if too_large := self.llm_too_large():  # Step 2 fails, saying why; the steps after it get the same reason
            report = steps.llm_conversion({}, self.llm_source_pair())
            report.failures.append(too_large)
            return report
        report = steps.llm_conversion(self.llm_conversions(), self.llm_pair())
        if files.checkpoint is not None:
            floats = self.llm_float_pair()
            prompts = [list(p.ids) for p in self.llm_prompts()]
            reference.add_reference(report, floats.prefill, floats.decode, files.prefill, files.checkpoint, prompts,
                                    self.cache)
        return report

    @memoized
    def llm_feasibility(self) -> StepReport:
        """LLM Step 1: each graph's quantized placement on the HTP; weights, KV cache and activations in the spec's
        and the SoC's memory budgets."""
        floats, shipped = self.llm_float_pair(), self.llm_quantized(self.llm_recipe)
        placements = {g: feasibility.check_feasibility(floats.graph(g), self.target.soc, self.runner,
                                                       self.target.model.thresholds, quantized_model=shipped.graph(g))
                      for g in GRAPHS}
        weights = feasibility.weights_bytes(onnx.load(str(shipped.prefill)))
        report = steps.llm_feasibility(placements, self.llm_pair(), weights,
                                       calibration.activation_bytes(self.llm_recipe),
                                       self.llm_kv_bytes(), self.target.soc,
                                       self.target.model.thresholds, importer.trained_context(self.llm_files()))
        report.kpis["recipe"] = self.llm_recipe  # the form placed and sized: the one that ships
        return report

    @memoized
    def llm_accuracy(self) -> StepReport:
        """LLM Step 3: perplexity on host and HTP, greedy agreement, the recipe sweep."""
        files = self.llm_files()
        quantized = {name: self.llm_quantized_graph(name, "prefill") for name in calibration.LLM_RECIPES}
        report = steps.llm_accuracy(self.llm_judge(), self.llm_float_answers(), quantized,
                                    self.llm_quantized(self.llm_recipe), self.llm_recipe_choice(),
                                    self.llm_host_nll(), self.llm_eval_windows(), self.llm_prompts(),
                                    files.max_new_tokens, self.llm_tokenizer(), self.runner,
                                    self.target.model.thresholds)
        four_bit = next(iter(calibration.FOUR_BIT_WEIGHTS))
        lpbq = blockwise.lpbq_weights(onnx.load(str(quantized[four_bit]), load_external_data=False))
        report.kpis["four_bit_weight_encoding"] = {
            "recipe": four_bit, "form": f"block-wise (LPBQ), {files.weight_block_size} rows per block" if lpbq
            else "per output channel", "lpbq_weights": len(lpbq)}
        return report

    @memoized
    def llm_context_binaries(self) -> dict[str, context_binary.ContextBinary]:
        """Both shipped graphs compiled into context binaries for the target's SoC (cached)."""
        shipped = self.llm_quantized(self.llm_recipe)
        return {g: context_binary.compile_context(shipped.graph(g), self.target.soc, self.cache) for g in GRAPHS}

    @memoized
    def llm_context_binary(self) -> StepReport:
        """LLM Step 4 report."""
        report = steps.llm_context_binary(self.llm_context_binaries(), self.target.soc.id)
        report.kpis["recipe"] = self.llm_recipe
        return report

    @memoized
    def llm_genie_bundle(self) -> Path:
        """The Genie bundle for the target's SoC (genie_config.json, HTP extensions, both .bin, tokenizer), cached."""
        binaries, files, pair = self.llm_context_binaries(), self.llm_files(), self.llm_pair()
        bins = [next(p for p in binaries[g].files if p.suffix == ".bin") for g in GRAPHS]
        stop = text.stop_id(files, self.llm_tokenizer())
        soc = self.target.soc

        def build(out: Path) -> None:
            write_bundle(out, bins, files.tokenizer, context_length=pair.context_length, soc_model=soc.soc_model,
                         dsp_arch=f"v{soc.htp_arch}", eot_id=-1 if stop is None else stop, kv_dim=pair.head_dim, n_vocab=pair.vocab)

        return self.cache.entry("genie-bundle", content_key("genie-v2", *bins, files.tokenizer, soc.id, stop), build).path

    @memoized
    def genie_runtime(self) -> StepReport:
        """LLM Step 5: Genie dialogs on the device over the prompts, with Genie's own profile."""
        bundle, files, pair = self.llm_genie_bundle(), self.llm_files(), self.llm_pair()
        device = genie_steps.push_bundle(self.runner, bundle, bundle.name)
        prompts, reference = self.llm_prompts(), self.llm_float_answers()
        report = genie_steps.genie_runtime(self.runner, device, prompts, files.max_new_tokens, self.llm_judge(), reference,
                                           self.llm_tokenizer(), pair.context_length, self.target.model.thresholds,
                                           self._run_dir("genie_runtime"))
        report.kpis |= ceiling.decode_ceiling(self.llm_quantized(self.llm_recipe).decode,
                                              steps.kv_cache_bytes(pair, self.llm_kv_bytes()), self.target.soc,
                                              report.kpis.get("tokens_per_s"))
        return report

    @memoized
    def genie_stress(self) -> StepReport:
        """LLM Step 7: the Genie stress run (dialogs in sequence and concurrently, prompts up to the full context)."""
        bundle, pair = self.llm_genie_bundle(), self.llm_pair()
        device = genie_steps.push_bundle(self.runner, bundle, bundle.name)
        options = self.validation
        new_tokens = options.genie_stress_new_tokens
        prompts = genie_steps.stress_prompts(self.llm_eval_ids(), pair.context_length, pair.prefill_ar, new_tokens)
        return genie_steps.genie_stress(self.runner, device, prompts, new_tokens,
                                        options.genie_stress_rounds, options.genie_stress_concurrent,
                                        self.target.model.thresholds, self._run_dir("genie_stress"),
                                        pace=self.genie_runtime().kpis)

    @memoized
    def llm_prompts(self) -> list[text.TokenizedPrompt]:
        """The model's prompts, tokenized and checked against the context length."""
        files = self.llm_files()
        return text.prompts(files, self.llm_tokenizer(), self.llm_source_pair().context_length, files.max_new_tokens)

