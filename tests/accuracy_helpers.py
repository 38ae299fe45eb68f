"""Helpers for the accuracy-recovery tests: an Onboarding of the demonstration model on the emulator."""

from __future__ import annotations

from pathlib import Path

from harness.cache import ArtifactCache
from harness.models import Thresholds, resolve_model
from harness.pipeline import Onboarding, Target
from harness.runner.client import DeviceRunner
from models_outlier import build_outlier_model

REPO = Path(__file__).resolve().parent.parent


def demo_onboarding(directory: Path, devices, runner: DeviceRunner, cache: ArtifactCache,
                    thresholds: Thresholds | None = None) -> Onboarding:
    """Return an Onboarding of the outlier demonstration model on the emulated sm8650 device."""
    path = build_outlier_model(directory / "outlier_cnn.onnx").path
    spec = resolve_model(str(path), {}, None)
    if thresholds is not None:
        spec = type(spec)(**{**spec.__dict__, "thresholds": thresholds})
    dev = devices.select(["sm8650-emu"])[0]
    return Onboarding(Target(dev, devices.soc(dev.soc), spec), runner, cache)
