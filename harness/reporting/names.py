"""The Allure naming contract: the names harness.reporting.allure writes into Allure results and
harness.reporting.report_cli and harness.signoff read back (test parameters, the step holding a report, its KPI
attachment, status messages, environment.properties keys)."""

from __future__ import annotations

DEVICE, SOC, MODEL = "device", "soc", "model"  # the parameters of a device x model test
STEP_PREFIX = "onboarding step: "  # the Allure step holding a step report is named STEP_PREFIX + step
INCONCLUSIVE = "INCONCLUSIVE"  # opens an inconclusive step's status message (status `unknown`); tag in lower case
MARGINAL = "MARGINAL"  # opens a marginal pass's status message (status `passed`); tag in lower case
ENVIRONMENT_NAMES = {"harness_version": "harness", "onnxruntime": "onnxruntime", "onnxruntime_qnn": "onnxruntime-qnn",
                     "qnn_sdk": "qnn-sdk", "python": "python", "platform": "platform"}
"""environment.properties key of each harness.versions.tool_versions() key."""


def step_name(step: str) -> str:
    """Return the name of the Allure step holding step's report ('onboarding step: ptq')."""
    return f"{STEP_PREFIX}{step}"


def kpi_attachment(step: str) -> str:
    """Return the name of step's KPI JSON attachment ('ptq KPIs')."""
    return f"{step} KPIs"


def soc_parameter(soc: str, soc_name: str) -> str:
    """Return the soc parameter's value: 'sm8650 (Snapdragon 8 Gen 3)'."""
    return f"{soc} ({soc_name})"


def split_soc_parameter(value: str) -> tuple[str, str]:
    """Return (soc, name) of a soc parameter's value (name '' when it has none)."""
    soc, _, name = value.partition(" (")
    return soc, name.rstrip(")")


def status_message(word: str, text: str) -> str:
    """Return the status message opened by word (INCONCLUSIVE, MARGINAL): 'WORD: text'."""
    return f"{word}: {text}"


def status_text(word: str, message: str) -> str | None:
    """Return what follows 'WORD: ' in a status message that opens with it, else None."""
    prefix = status_message(word, "")
    return message[len(prefix):] if message.startswith(prefix) else None
