"""The single-graph onboarding pipeline (models of kind onnx) for one device × model: artifacts built once, steps
as plain calls. Its sibling for language models is harness.llm.pipeline; both derive from harness.pipeline_base.

Every artifact is memoised here (and content-addressed on disk by the steps), so each step
can ask for what it needs without knowing whether another step already built it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from harness import sizing
from harness.cache import ArtifactCache
from harness.data import Dataset, Feed, with_evaluation_count
from harness.errors import HarnessError, StepError
from harness.model_sources import dataset_for, source_model
from harness.options import AccuracyOptions, ValidationOptions
from harness.pipeline_base import PipelineBase, memoized
from harness.quantization import prequantized
from harness.quantization.export import exported_encodings
from harness.runner.client import DeviceRunner
from harness.steps import (aimet_recovery, concurrency, context_binary, conversion, energy, error_isolation,
                           feasibility, float_baseline, mixed_precision, profile, promotion, ptq, runtime, sustained,
                           sweep, validation_accuracy)
from harness.steps.context_binary import ContextBinary
from harness.steps.inference import host_reference
from harness.steps.report import StepReport
from harness.target import Target

ENERGY_MIN_INFERENCES = 20  # harness.steps.energy.size_inferences' minimum
ENERGY_MIN_SLOW_INFERENCES = 3  # ... for a slow shipped model (Onboarding.energy)


class Onboarding(PipelineBase):
    """Artifacts and step reports of a single-graph model (kind onnx) for one Target, computed on demand."""

    def __init__(self, target: Target, runner: DeviceRunner, cache: ArtifactCache,
                 accuracy: AccuracyOptions | None = None,
                 validation: ValidationOptions | None = None) -> None:
        super().__init__(target, runner, cache, validation)
        self.accuracy = accuracy or AccuracyOptions()
        self.recipe = ptq.QuantRecipe()
        if self.accuracy.encodings:  # --quantization-overrides: PTQ quantizes with the given encodings
            self.recipe = replace(self.recipe, encodings=self.accuracy.encodings,
                                  encodings_file=self.accuracy.encodings_file)

    @memoized
    def source_model(self) -> Path:
        """The model as given (a zoo model is built and cached first)."""
        return source_model(self.target.model, self.cache)

    @memoized
    def fixed_model(self) -> Path:
        """The model with its frozen inputs made constants and every other input dim fixed."""
        return conversion.fixed_shape_model(self.source_model(), self.target.model, self.cache)

    @memoized
    def own_quantization(self) -> "prequantized.Prequantized | None":
        """The model's own quantization when it arrives quantized (None for a float model): its QDQ form, used as
        it is, and its float model; raises ModelError naming nodes quantized in a form no QDQ model expresses."""
        return prequantized.analyse(self.fixed_model(), self.source_model(), self.cache,
                                    f"model '{self.target.model.name}' ({self.source_model()})")

    def _quantized(self, calibration: list[Feed]) -> Path:
        """The model's own QDQ form when it arrives quantized, else PTQ's with the default recipe."""
        own = self.own_quantization()
        return own.model if own is not None else ptq.quantize(self.converted_model(), calibration, self.recipe,
                                                                self.cache)

    @memoized
    def full_dataset(self) -> Dataset:
        """Calibration and evaluation data as given (before the evaluation set is sized by cost)."""
        return dataset_for(self.target.model, self.fixed_model(), self.cache)

    @memoized
    def calibration(self) -> list[Feed]:
        """The calibration feeds, as many as fit onnxruntime's calibration in memory (harness.sizing)."""
        feeds = self.full_dataset().calibration
        return feeds[:sizing.calibration_count(self.activation_bytes(), len(feeds))]

    @memoized
    def activation_bytes(self) -> int:
        """Bytes of one sample's intermediate and output tensors (float32)."""
        return sizing.activation_bytes(self.fixed_model())

    @memoized
    def dataset(self) -> Dataset:
        """Calibration and evaluation data, the evaluation set sized by the model's HTP cost and the
        calibration set by its activation memory (harness.sizing); the zoo's labelled evaluation set, or one
        whose cost cannot be measured, is kept whole (a spec's evaluation section's is sized like any other)."""
        data = self.full_dataset()
        if len(self.calibration()) < len(data.calibration):
            data = replace(data, calibration=self.calibration(),
                           description=f"{data.description}; calibrated on {len(self.calibration())} of "
                                       f"{len(data.calibration)} samples (one sample's activations take "
                                       f"{self.activation_bytes() / 2**20:.0f} MiB; "
                                       f"onnxruntime's calibration holds them all, budget "
                                       f"{sizing.CALIB_MEMORY_BUDGET_BYTES / 2**30:g} GiB)")
        if (data.labelled and data.task is None) or len(data.evaluation) <= sizing.MIN_EVAL_SAMPLES:
            return data
        cost = self.inference_cost()
        if cost is None:
            return data
        count = sizing.evaluation_count(cost.inference_s, len(data.evaluation))
        return with_evaluation_count(data, count, sizing.count_reason(cost, self.target.device.id, count))

    @memoized
    def inference_cost(self) -> "sizing.InferenceCost | None":
        """One timed HTP inference of the default 8-bit model (None when it cannot run: the steps say why)."""
        try:
            qdq = self._quantized(self.calibration())
            return sizing.measure_inference(qdq, self.full_dataset().evaluation[0], self.runner, self.cache)
        except HarnessError:
            return None

    @memoized
    def shipped_cost(self) -> "sizing.InferenceCost | None":
        """One timed HTP inference of the model that ships (None when it cannot run): what sizes profile, runtime
        and Step 7 on it, so a slow shipped precision (16-bit activations, FP16) costs them about the same
        device time as an 8-bit model. The default 8-bit model's cost when that one ships; else one probe
        inference (cached, shared with the precision search's probe of FP16)."""
        try:
            model = self.deployable_model()
            if model == self._quantized(self.calibration()):
                return self.inference_cost()
            return sizing.measure_inference(model, self.dataset().evaluation[0], self.runner, self.cache, repeats=1)
        except HarnessError:
            return None

    def _shipped_s(self) -> float | None:
        cost = self.shipped_cost()
        return cost.inference_s if cost is not None else None

    @memoized
    def float_reference(self) -> list[Feed]:
        """Host CPU outputs of the converted float model on the evaluation data."""
        return host_reference(self.converted_model(), self.dataset().evaluation, self.cache)

    def converted_model(self) -> Path:
        """The converted float model: shapes fixed, folded, rewritten, QNN-preprocessed, checked equivalent."""
        return self.conversion().artifacts["model"]

    @memoized
    def qdq_model(self) -> Path:
        """The QDQ model: the model's own when it arrives quantized, else PTQ's with the default recipe."""
        return self._quantized(self.dataset().calibration)

    def deployable_model(self, mixed: StepReport | None = None) -> Path:
        """The quantized model that ships to the device (compiled, profiled, integrated); see deployable."""
        return self.deployable(mixed)[1]

    def deployable(self, mixed: StepReport | None = None) -> tuple[str, Path]:
        """Return which quantized model ships ('ptq', 'mixed_precision' or 'aimet') and its path.

        PTQ's when PTQ passes decisively (every limit met on its KPI's interval); else the first recovery step
        whose model meets the KPI decisively (mixed precision, then AIMET when its step ran; AIMET first when
        mixed precision's choice is FP16 on the HTP, the last resort). When none does,
        PTQ's model ships, unless PTQ failed decisively and a recovery's model could not be decided (an interval
        straddles a limit): that one ships, as nothing decisively better exists. An inconclusive PTQ therefore
        keeps its model unless a recovery proves one. `mixed` is the mixed-precision report while that step is
        being built (it exports the deployable encodings; AIMET comes after it and is not asked)."""
        if self.ptq().passed:
            return "ptq", self.qdq_model()
        building = mixed is not None
        try:
            mixed = mixed or self.mixed_precision()
        except HarnessError:  # reported by the mixed_precision step itself; PTQ's model stays deployable
            return "ptq", self.qdq_model()
        aimet = None if building else self._aimet_report()
        recoveries = [("mixed_precision", mixed), *([("aimet", aimet)] if aimet is not None else [])]
        if mixed.kpis.get("precision") == "fp16":  # the last resort: a quantized AIMET model meeting the KPI first
            recoveries.reverse()
        for name, report in recoveries:
            if report.kpis.get("met_threshold"):
                return name, report.artifacts["model"]
        if self.ptq().problems():
            for name, report in recoveries:
                if report.kpis.get("undecided") and "model" in report.artifacts:
                    return name, report.artifacts["model"]
        return "ptq", self.qdq_model()

    @memoized
    def feasibility(self) -> StepReport:
        """Step 1 report: placement of what ships, the converted float graph (where the HTP has FP16)
        and its 8-bit QDQ form as PTQ quantizes it (same recipe and calibration, so PTQ reuses it); a model that
        arrives quantized is placed as it is, its float model beside it, and its encodings checked for the HTP."""
        try:
            own = self.own_quantization()
        except prequantized.InexactQuantization as e:
            return feasibility.inexact_quantization(e)
        if own is not None:
            report = feasibility.check_feasibility(own.float_model, self.target.soc, self.runner, self.thresholds,
                                                   quantized_model=own.model, own_quantization=True)
            own.add_to(report)
            return report
        model, notes = self._feasibility_model()
        quantized = None
        try:
            quantized = ptq.quantize(model, self.calibration(), self.recipe, self.cache)
        except HarnessError as e:
            notes.append(f"no 8-bit QDQ form could be built, so only the float graph was placed: "
                         f"{str(e).splitlines()[0]}")
        report = feasibility.check_feasibility(model, self.target.soc, self.runner, self.thresholds,
                                               quantized_model=quantized)
        report.notes[:0] = notes
        return report

    def _feasibility_model(self) -> tuple[Path, list[str]]:
        """The float model feasibility places: the converted one (what ships), else the shape-fixed one
        with a note saying why (conversion does not depend on feasibility, so this cannot loop)."""
        try:
            report = self.conversion()
            if report.passed and "model" in report.artifacts:
                return report.artifacts["model"], []
            reason = (report.problems() or ["it kept no model"])[0]
        except HarnessError as e:
            reason = str(e).splitlines()[0]
        return self.fixed_model(), [f"conversion failed ({reason}): placement was checked on the shape-fixed "
                                    "model instead of the converted one that would ship"]

    @memoized
    def conversion(self) -> StepReport:
        """Step 2 report (of the float model of a model that arrives quantized)."""
        own = self.own_quantization()
        if own is None:
            return conversion.convert(self.source_model(), self.fixed_model(), self.target.model, self.cache)
        report = conversion.convert(prequantized.float_source(own), own.float_model, self.target.model, self.cache)
        report.notes.insert(0, f"the model arrives quantized ({own.form}): its float model (Q/DQ pairs removed, "
                               "quantized constants dequantized) was converted; the quantized model is used as it is")
        return report

    @memoized
    def float_baseline(self) -> StepReport:
        """Step 3 stage 1 report."""
        return float_baseline.float_baseline(self.converted_model(), self.dataset(), self.float_reference(),
                                             self.runner, self.thresholds)

    @memoized
    def best_case(self) -> dict:
        """The KPIs a quantized model equal to float would get on the evaluation samples (ptq.best_case): PTQ's
        resolution note and the precision search's futility test read them."""
        return ptq.best_case(self.dataset(), self.float_reference())

    @memoized
    def ptq(self) -> StepReport:
        """Step 3 stage 2 report (its `dataset` KPI says what data was used and how many samples, and why)."""
        cost, own = self.inference_cost(), self.own_quantization()
        try:
            report = ptq.ptq(self.qdq_model(), self.recipe, self.dataset(), self.float_reference(), self.runner,
                             self.thresholds, inference_s=cost.inference_s if cost is not None else None,
                             best=self.best_case())
        except HarnessError as e:  # the model's own encodings: say which the HTP cannot take before what failed
            if own is None or not own.problems:
                raise
            raise StepError(f"{own.problem_text()}\nthe HTP run failed: {str(e).splitlines()[0]}") from None
        report.kpis.setdefault("dataset", self.dataset().description)
        if own is not None:  # the model's own encodings against its float model
            own.add_to(report)
        return report

    @memoized
    def error_isolation(self) -> StepReport:
        """Step 3 stage 3 report: layer-by-layer float vs quantized, host QDQ emulation and device HTP, over
        AccuracyOptions.error_isolation_samples samples, fewer on a slow model (sizing.isolation_count, noted)."""
        requested, cost = self.accuracy.error_isolation_samples, self.inference_cost()
        samples = sizing.isolation_count(cost.inference_s if cost is not None else None, requested)
        report = error_isolation.isolate_errors(self.converted_model(), self.qdq_model(), self.dataset(),
                                                self.runner, self.ptq(), self.cache, samples=samples)
        if samples < min(requested, len(self.dataset().evaluation)):
            report.notes.append(f"compared on {samples} of {requested} samples: one HTP inference of the 8-bit model "
                                f"took {cost.inference_s:.3g} s ({cost.latency_source}), and {samples} fit the "
                                f"evaluation budget of {sizing.EVAL_BUDGET_S:g} s per pass")
        return report

    @memoized
    def sweep_result(self) -> tuple[StepReport, list[sweep.Candidate]]:
        """Step 3 stage 4: the sweep report and its ranked candidates (needs --sweep quick|full)."""
        if self.accuracy.sweep == "off":
            raise StepError("the quantization sweep is off (--sweep off)")
        return sweep.sweep(self.converted_model(), self.dataset(), self.float_reference(), self.runner,
                           self.thresholds, self.cache, self.recipe, self.accuracy.sweep,
                           ptq_result=self._ptq_candidate_if_any(), best_case=self.best_case())

    def sweep(self) -> StepReport:
        """Step 3 stage 4 report."""
        return self.sweep_result()[0]

    @memoized
    def mixed_precision(self) -> StepReport:
        """Step 3 stage 5 report, the precision search: from the best candidate of any kind (the sweep's, or PTQ's
        with --sweep off), promotion units (tied activations) promoted to 16 bits from an 8-bit recipe, ranked by
        their measured effect; FP16 on the HTP when nothing quantized meets the KPI; the cheapest candidate meeting
        it, within --precision-budget-s. artifacts['encodings'] is the deployable model's QAIRT overrides file
        (none when FP16 ships)."""
        start = self._mixed_precision_start()
        pool = self.sweep_result()[1] if self.accuracy.sweep != "off" else []
        eight_bit = next((c.model for c in [start, *pool] if c.error is None and c.precision in ("a8", "mixed")),
                         None)
        units = promotion.promotion_units(self.converted_model(), eight_bit or self.qdq_model(),
                                          self.error_isolation())
        report = mixed_precision.mixed_precision(
            self.converted_model(), self.dataset(), self.float_reference(), self.runner, self.thresholds,
            self.cache, start, units, best_case=self.best_case(),
            pool=pool, soc=self.target.soc, budget_s=self.accuracy.precision_budget_s,
            allow_cpu_fallback=self.thresholds.min_htp_fraction < 1.0)
        if "model" in report.artifacts and report.kpis.get("precision") != "fp16":
            final = self.deployable_model(report)
            report.artifacts["encodings"] = exported_encodings(final, self.cache)
            report.kpis["encodings_of"] = "ptq" if final == self.qdq_model() else "mixed_precision"
            report.kpis["encodings_file"] = str(report.artifacts["encodings"])
        return report

    def _mixed_precision_start(self) -> sweep.Candidate:
        """The precision search's start: the sweep's best candidate of any kind (8- or 16-bit activations), else
        PTQ's."""
        if self.accuracy.sweep != "off":
            best = next((c for c in self.sweep_result()[1] if c.error is None), None)
            if best is not None:
                return best
        return self._ptq_candidate()

    def _ptq_candidate_if_any(self) -> sweep.Candidate | None:
        """PTQ's candidate, or None when PTQ could not run (the sweep then tries its recipes all the same)."""
        try:
            return self._ptq_candidate()
        except HarnessError:
            return None

    def _ptq_candidate(self) -> sweep.Candidate:
        """PTQ's result as a candidate of the precision search (its recipe, QDQ model and KPIs)."""
        report, model = self.ptq(), self.qdq_model()
        return sweep.Candidate(self.recipe, model, {**report.kpis, "model_bytes": model.stat().st_size},
                               meets=report.passed, undecided=report.status == "inconclusive")

    def aimet_skip_reason(self) -> str | None:
        """Why the AIMET step does not run (None: it runs): --aimet off, the aimet extra missing, or (in auto
        mode) PTQ or mixed precision already met the KPI."""
        mode = self.accuracy.aimet
        reason = aimet_recovery.skip_reason(mode, self._earlier_recovery_met)
        if reason is None and mode == "auto" and self._search_undecidable():
            return ("the evaluation samples cannot decide the accuracy KPI (see mixed_precision): no AIMET candidate "
                    "could be shown to meet it either (--aimet on runs it anyway)")
        return reason

    def _search_undecidable(self) -> bool:
        """Return whether mixed precision did not search because its samples could not decide any candidate."""
        try:
            return self.mixed_precision().kpis.get("search") == "not run"
        except HarnessError:
            return False

    def _earlier_recovery_met(self) -> str | None:
        if self.ptq().passed:
            return "ptq"
        try:
            kpis = self.mixed_precision().kpis  # FP16 meeting it leaves AIMET a cheaper, quantized one to find
            return "mixed_precision" if kpis.get("met_threshold") and kpis.get("precision") != "fp16" else None
        except HarnessError:
            return None

    @memoized
    def aimet(self) -> StepReport:
        """Step 3 stage 6 report: AIMET's BN folding, CLE, AdaRound and AMP from the recipe mixed precision
        reached, each technique's exported encodings imported as overrides and run on `htp`;
        artifacts['model'] is the last technique's model that met the KPI (else the best one)."""
        if (reason := self.aimet_skip_reason()) is not None:
            raise StepError(f"the AIMET step did not run: {reason}")
        earlier = [("ptq", self.ptq().kpis, self.ptq().passed)]
        if self.accuracy.sweep != "off":
            earlier.append(("sweep", self.sweep().kpis, bool(self.sweep().kpis.get("best_meets_kpi"))))
        try:
            mixed = self.mixed_precision()
            earlier.append(("mixed_precision", mixed.kpis, bool(mixed.kpis.get("met_threshold"))))
        except HarnessError:  # reported by its own step; AIMET starts from mixed precision's start recipe
            mixed = None
        recipe = aimet_recovery.reached_recipe(self._mixed_precision_start().recipe, mixed)
        return aimet_recovery.aimet_recovery(self.converted_model(), self.dataset(), self.float_reference(),
                                             self.runner, self.thresholds, self.cache, recipe, earlier)

    def _aimet_report(self) -> StepReport | None:
        """AIMET's report when its step ran, else None (the step's report says why)."""
        try:
            return self.aimet()
        except HarnessError:
            return None

    @memoized
    def context_artifact(self) -> ContextBinary:
        """The deployable model compiled on the host into a QNN context binary for the device's SoC (cached)."""
        return context_binary.compile_context(self.deployable_model(), self.target.soc, self.cache,
                                              allow_cpu_fallback=self.thresholds.min_htp_fraction < 1.0)

    @memoized
    def context_binary(self) -> StepReport:
        """Step 4 report."""
        return context_binary.context_binary(self.context_artifact(), self.deployable_model(), self.runner)

    def profile(self, rule: "profile.MeasureRule", blocks: int = profile.PROFILE_BLOCKS) -> StepReport:
        """Step 5 report, measured under rule in `blocks` independent blocks (charts and the raw profile under
        the cache's runs/)."""
        return profile.profile(self.context_artifact(), self.deployable_model(), self.dataset().evaluation[0],
                               self.runner, self.target.soc, self.thresholds, rule, self._run_dir("profile"),
                               label=self._label,
                               placement=self.context_binary().tables.get("placement"), blocks=blocks,
                               inference_s=self._shipped_s())

    @memoized
    def runtime(self) -> StepReport:
        """Step 6 report."""
        return runtime.runtime(self.context_artifact(), self.dataset().evaluation, self.runner, self._shipped_s())

    # ------------------------------------------------------------------ Step 7, validation

    @property
    def _label(self) -> str:
        return f"{self.target.device.id} x {self.target.model.name}"

    @property
    def telemetry_source(self) -> str:
        """'emulated' on the harness's emulated devices, 'measured' on real ones."""
        return getattr(self.runner.transport, "telemetry_source", "measured")

    @memoized
    def validation_dataset(self) -> Dataset:
        """The evaluation set of Step 7's validation_accuracy: the whole data set when it is the zoo's labelled one
        or when its cost cannot be measured, else as many samples as fit sizing.VALIDATION_BUDGET_S (more than the
        accuracy steps' EVAL_BUDGET_S per pass: it is one pass)."""
        data = self.full_dataset()
        cost = None if data.labelled and data.task is None else self.shipped_cost()
        if cost is None or len(data.evaluation) <= sizing.MIN_EVAL_SAMPLES:
            return data
        count = sizing.evaluation_count(cost.inference_s, len(data.evaluation), sizing.VALIDATION_BUDGET_S)
        return with_evaluation_count(data, count, sizing.count_reason(cost, self.target.device.id, count,
                                                                      sizing.VALIDATION_BUDGET_S))

    @memoized
    def validation_accuracy(self) -> StepReport:
        """Step 7 report: the deployable context binary on the device over the validation evaluation set."""
        data = self.validation_dataset()
        reference = host_reference(self.converted_model(), data.evaluation, self.cache)
        deployed, _ = self.deployable()
        cost = self.shipped_cost()
        return validation_accuracy.validation_accuracy(self.context_artifact(), data, reference, self.runner,
                                                       self.thresholds, deployed,
                                                       inference_s=cost.inference_s if cost is not None else None)

    @memoized
    def sustained(self) -> StepReport:
        """Step 7 report: cooldown, then a soak of the context binary with per-window latency and thermals."""
        cost = self.shipped_cost()
        return sustained.sustained(self.context_artifact(), self.dataset().evaluation, self.runner, self.thresholds,
                                   self.validation.soak(self.telemetry_source), self._run_dir("sustained"),
                                   self._label, inference_s=cost.inference_s if cost is not None else None)

    @memoized
    def energy(self) -> StepReport:
        """Step 7 report: idle power, then power over a fixed number of inferences; energy per inference."""
        lengths = self.validation.lengths(self.telemetry_source)
        count, reason = self.validation.energy_inferences, "--energy-inferences"
        shipped_s = self._shipped_s() if self.shipped_cost() is not self.inference_cost() else None
        if count is None and shipped_s and shipped_s * ENERGY_MIN_INFERENCES > lengths.energy_target_s:
            # a slow shipped model other than the 8-bit one (16-bit activations, FP16): the simulator runs each
            # inference for real, so no probe run, and as many as fit the target
            count = energy.size_inferences(shipped_s, lengths.energy_target_s, minimum=ENERGY_MIN_SLOW_INFERENCES)
            reason = (f"{count} inferences: about {lengths.energy_target_s:g} s at {shipped_s:.3g} s per HTP "
                      f"inference of the shipped model (its measured cost; minimum {ENERGY_MIN_SLOW_INFERENCES} "
                      f"instead of {ENERGY_MIN_INFERENCES} for a model this slow); --energy-inferences sets it")
        elif count is None:
            per_inference_s = energy.warm_inference_s(self.runner, self.context_artifact().model,
                                                      self.dataset().evaluation[0])
            count = energy.size_inferences(per_inference_s, lengths.energy_target_s)
            reason = (f"{count} inferences: about {lengths.energy_target_s:g} s at {per_inference_s * 1000:.3g} ms "
                      "per warm inference of the context binary (a short probe run); --energy-inferences sets it")
        options = energy.EnergyOptions(count, lengths.energy_idle_s, lengths.energy_interval_s, reason)
        return energy.energy(self.context_artifact(), self.dataset().evaluation, self.runner, self.thresholds,
                             options, self._run_dir("energy"), self._label)

    def concurrency(self, others: "list[Onboarding]" = ()) -> StepReport:
        """Step 7 report: sessions of this model (and of `others`, the run's other models on this device) at
        once on the device's HTP against each model's solo latency."""
        plans = [(self.target.model.name, self.context_artifact().model, self.dataset().evaluation)]
        for other in others:
            plans.append((other.target.model.name, other.context_artifact().model, other.dataset().evaluation))
        return concurrency.concurrency(plans, self.runner, self.thresholds,
                                       self.validation.concurrency(self.telemetry_source),
                                       self._run_dir("concurrency"), self._label)
