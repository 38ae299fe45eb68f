"""The options a run is given: the plugin parses them (the argparse `type=` parsers below make a bad value a usage
error) and the run's HarnessSession holds them (AccuracyOptions, ValidationOptions), which every pipeline gets.

Step 7's run lengths are what a user sets (--soak-duration, --cooldown-max-s, --concurrency, --energy-inferences)
over defaults that depend on the device: short on the harness's emulated devices (the local emulator and the
emulated adb phone), long enough on real adb/SSH devices to heat them (ValidationOptions.soak / .concurrency).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Callable

from harness.errors import ConfigError

SWEEP_MODES = ("off", "quick", "full")
PRECISION_BUDGET_S = 300.0  # the precision search's default time budget (Step 3, stage 5)
AIMET_MODES = ("auto", "on", "off")
WINDOW_S = 5.0  # the soak's statistics window


def bounded(kind: type, minimum: float, what: str) -> Callable[[str], float]:
    """Return a parser turning text into a finite kind (int or float) >= minimum.

    Anything else raises argparse.ArgumentTypeError("'TEXT' is not WHAT"), which pytest reports
    as a usage error naming the option.
    """
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"'{text}' is not {what}")
        return value

    parse.__name__ = what.replace(" ", "_")
    return parse


seconds = bounded(float, 0, "a duration in seconds (0 or more)")
positive_seconds = bounded(float, 1e-9, "a duration in seconds (more than 0)")


@dataclass(frozen=True)
class AccuracyOptions:
    """What the accuracy-recovery steps are asked to do (--sweep, --quantization-overrides, --aimet)."""

    sweep: str = "quick"
    encodings: dict = field(default_factory=dict)  # a parsed --quantization-overrides document
    encodings_file: str = ""
    error_isolation_samples: int = 4
    aimet: str = "auto"  # the AIMET step's mode
    precision_budget_s: float = PRECISION_BUDGET_S  # --precision-budget-s: the precision search's time budget


@dataclass(frozen=True)
class SoakOptions:
    """How long to soak and cool down, and how often to sample the device."""

    duration_s: float
    cooldown_max_s: float
    window_s: float = WINDOW_S
    telemetry_interval_s: float = 0.5


@dataclass(frozen=True)
class ConcurrencyOptions:
    """How many sessions, for how long, and how long each model runs alone first."""

    sessions: int
    duration_s: float
    solo_duration_s: float
    mode: str = "threads"
    rounds: int = 9  # solo and shared phases alternated (harness.steps.concurrency); on 9, one outlying round on
                     # each side leaves the interval of the median (harness.repeats.median_interval) unmoved


@dataclass(frozen=True)
class RunLengths:
    """Defaults for one kind of device."""

    soak_s: float
    cooldown_max_s: float
    concurrency_s: float
    solo_s: float
    energy_target_s: float
    energy_idle_s: float
    energy_interval_s: float


EMULATED = RunLengths(soak_s=60, cooldown_max_s=90, concurrency_s=10, solo_s=3, energy_target_s=8,
                      energy_idle_s=3, energy_interval_s=0.1)
DEVICE = RunLengths(soak_s=600, cooldown_max_s=300, concurrency_s=60, solo_s=10, energy_target_s=30,
                    energy_idle_s=10, energy_interval_s=0.2)


@dataclass(frozen=True)
class ValidationOptions:
    """What the user asked for (None: the device's default)."""

    soak_duration_s: float | None = None
    cooldown_max_s: float | None = None
    sessions: int = 2
    energy_inferences: int | None = None
    concurrency_duration_s: float | None = None
    concurrency_mode: str = "threads"
    genie_stress_rounds: int = 2  # LLM path: dialogs in sequence per worker
    genie_stress_concurrent: int = 2  # LLM path: workers (processes) at once
    genie_stress_new_tokens: int = 8  # LLM path: tokens generated per stress query (the prompt fills the context)

    def __post_init__(self) -> None:
        if self.soak_duration_s is not None and self.soak_duration_s < WINDOW_S:
            raise ConfigError(f"--soak-duration {self.soak_duration_s:g} is shorter than one {WINDOW_S:g} s window: "
                              f"give at least {WINDOW_S:g} s (the default is {EMULATED.soak_s:g} s on emulated devices, "
                              f"{DEVICE.soak_s:g} s on adb/SSH devices)")
        if self.sessions < 1:
            raise ConfigError(f"--concurrency {self.sessions} must be at least 1")
        if self.genie_stress_new_tokens < 1:
            raise ConfigError(f"--genie-stress-new-tokens {self.genie_stress_new_tokens} must be at least 1")

    @staticmethod
    def lengths(telemetry_source: str) -> RunLengths:
        """Return the defaults for a device whose telemetry is 'emulated' or 'measured'."""
        return EMULATED if telemetry_source == "emulated" else DEVICE

    def soak(self, telemetry_source: str) -> SoakOptions:
        """Return the soak's options on such a device."""
        d = self.lengths(telemetry_source)
        return SoakOptions(duration_s=self.soak_duration_s or d.soak_s,
                           cooldown_max_s=d.cooldown_max_s if self.cooldown_max_s is None else self.cooldown_max_s)

    def concurrency(self, telemetry_source: str) -> ConcurrencyOptions:
        """Return the concurrency run's options on such a device."""
        d = self.lengths(telemetry_source)
        duration_s = self.concurrency_duration_s or d.concurrency_s
        return ConcurrencyOptions(self.sessions, duration_s, min(d.solo_s, duration_s), self.concurrency_mode)


@dataclass(frozen=True)
class EnergyOptions:
    """How many inferences, how long to measure idle first, how often to sample power."""

    inferences: int
    idle_s: float
    interval_s: float
    inferences_reason: str = ""
