"""What is under test: one device × model (the plugin parametrizes the step tests with it)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.devices import DeviceSpec, SocSpec
from harness.models import ModelSpec


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
