"""Helpers for the accuracy-recovery tests: an Onboarding of the demonstration model on the emulator."""

from __future__ import annotations

from pathlib import Path

from harness.cache import ArtifactCache
from harness.models import Thresholds, resolve_model
from harness.pipeline import Onboarding, Target
from harness.runner.client import DeviceRunner
from models_outlier import build_outlier_model

REPO = Path(__file__).resolve().parent.parent
# The demonstration models run on random inputs, which put a few samples at a 10-class near-tie that even a
# 16-bit recipe flips (3 of 130 on MinMax-a16): a 2 % drop cannot be decided there, so the demonstrations allow
# 10 % and let cosine similarity and SQNR tell the recipes apart.
DEMO_THRESHOLDS = Thresholds(max_task_metric_drop=0.1)


def demo_spec(path: Path) -> Path:
    """Write a model spec beside the model at path with DEMO_THRESHOLDS; return it (for --model)."""
    spec = path.with_suffix(".yaml")
    spec.write_text(f"name: {path.stem}\npath: {path.name}\nthresholds:\n  max_task_metric_drop: "
                    f"{DEMO_THRESHOLDS.max_task_metric_drop}\n")
    return spec


def demo_onboarding(directory: Path, devices, runner: DeviceRunner, cache: ArtifactCache,
                    thresholds: Thresholds | None = None) -> Onboarding:
    """Return an Onboarding of the outlier demonstration model on the emulated sm8650 device (DEMO_THRESHOLDS
    unless thresholds are given)."""
    path = build_outlier_model(directory / "outlier_cnn.onnx").path
    spec = resolve_model(str(path), {}, None)
    spec = type(spec)(**{**spec.__dict__, "thresholds": thresholds or DEMO_THRESHOLDS})
    dev = devices.select(["sm8650-emu"])[0]
    return Onboarding(Target(dev, devices.soc(dev.soc), spec), runner, cache)
