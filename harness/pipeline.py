"""The onboarding pipeline for one device × model: artifacts built once, steps as plain calls.

Every artifact is memoised here (and content-addressed on disk by the steps), so each step
can ask for what it needs without knowing whether another step already built it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from harness.cache import ArtifactCache
from harness.data import Dataset, Feed
from harness.devices import DeviceSpec, SocSpec
from harness.model_sources import dataset_for, source_model
from harness.models import ModelSpec
from harness.runner.client import DeviceRunner
from harness.steps import conversion, feasibility, float_baseline, ptq
from harness.steps.inference import host_reference
from harness.steps.report import StepReport

T = TypeVar("T")


def memoized(method: Callable[["Onboarding"], T]) -> Callable[["Onboarding"], T]:
    """Cache a method's result, or the HarnessError it raised, per Onboarding instance."""
    @functools.wraps(method)
    def wrapper(self: "Onboarding") -> T:
        memo = self._memo
        if method.__name__ not in memo:
            try:
                memo[method.__name__] = (True, method(self))
            except Exception as e:  # re-raised below, and on every later call
                memo[method.__name__] = (False, e)
        ok, value = memo[method.__name__]
        if not ok:
            raise value
        return value
    return wrapper


@dataclass(frozen=True)
class Target:
    """One device × model combination under test."""

    device: DeviceSpec
    soc: SocSpec
    model: ModelSpec

    @property
    def id(self) -> str:
        """A readable test id, e.g. 'sm8650-emu-digits_cnn'."""
        return f"{self.device.id}-{self.model.name}"


class Onboarding:
    """Artifacts and step reports for one Target, computed on demand."""

    def __init__(self, target: Target, runner: DeviceRunner, cache: ArtifactCache) -> None:
        self.target = target
        self.runner = runner
        self.cache = cache
        self.recipe = ptq.QuantRecipe()
        self._memo: dict[str, tuple[bool, object]] = {}

    @property
    def thresholds(self):
        return self.target.model.thresholds

    @memoized
    def source_model(self) -> Path:
        """The model as given (a zoo model is built and cached first)."""
        return source_model(self.target.model, self.cache)

    @memoized
    def fixed_model(self) -> Path:
        """The model with every input dim fixed."""
        return conversion.fixed_shape_model(self.source_model(), self.target.model, self.cache)

    @memoized
    def dataset(self) -> Dataset:
        """Calibration and evaluation data."""
        return dataset_for(self.target.model, self.fixed_model(), self.cache)

    @memoized
    def float_reference(self) -> list[Feed]:
        """Host CPU outputs of the converted float model on the evaluation data."""
        return host_reference(self.converted_model(), self.dataset().evaluation, self.cache)

    def converted_model(self) -> Path:
        """The converted (QNN-preprocessed) float model."""
        return self.conversion().artifacts["model"]

    @memoized
    def qdq_model(self) -> Path:
        """The QDQ model from PTQ with the default recipe."""
        return ptq.quantize(self.converted_model(), self.dataset().calibration, self.recipe, self.cache)

    def deployable_model(self) -> Path:
        """The quantized model that ships to the device (compiled, profiled, integrated)."""
        return self.qdq_model()

    @memoized
    def feasibility(self) -> StepReport:
        """Step 1 report."""
        return feasibility.check_feasibility(self.fixed_model(), self.target.soc, self.runner, self.thresholds)

    @memoized
    def conversion(self) -> StepReport:
        """Step 2 report."""
        return conversion.convert(self.fixed_model(), self.cache)

    @memoized
    def float_baseline(self) -> StepReport:
        """Step 3 stage 1 report."""
        return float_baseline.float_baseline(self.converted_model(), self.dataset(), self.float_reference(),
                                             self.runner, self.thresholds)

    @memoized
    def ptq(self) -> StepReport:
        """Step 3 stage 2 report."""
        return ptq.ptq(self.qdq_model(), self.recipe, self.dataset(), self.float_reference(), self.runner,
                       self.thresholds)
